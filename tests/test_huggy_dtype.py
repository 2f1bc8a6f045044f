"""huggy-arch and the dtype rule: the body and head take the target dtype, the normalizer stays float32."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from harness.policies import load_policy
from harness.policies.base import cast_policy
from harness.policies.huggy import huggy_arch

# Max abs error allowed against float32 on normal observations (the 910B port saw 1.1e-3 and 1.07e-2).
CAST_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2}
FLOAT16_MAX = torch.finfo(torch.float16).max


@pytest.fixture(scope="module")
def huggy() -> nn.Module:
    return huggy_arch()


@pytest.fixture(scope="module")
def obs() -> torch.Tensor:
    return torch.randn(512, 59, generator=torch.Generator().manual_seed(0))


def test_huggy_arch_has_the_huggy_shape(huggy: nn.Module) -> None:
    assert sum(p.numel() for p in huggy.parameters()) == 566_805
    assert [m.out_features for m in huggy.modules() if isinstance(m, nn.Linear)] == [512, 512, 512, 21]
    assert huggy.info.obs_sizes == (59,) and huggy.info.action_kind == "continuous"


def test_huggy_arch_is_labelled_synthetic_and_reproducible(huggy: nn.Module) -> None:
    info = load_policy("huggy-arch").info
    assert info.synthetic and info.source == "synthetic" and info.name == "huggy-arch"
    assert info.detail.startswith("SYNTHETIC weights")
    assert info.sha256 == huggy.info.sha256
    assert torch.equal(load_policy("huggy-arch").head.weight, huggy.head.weight)


@pytest.mark.parametrize("code_path", ["AVX2", "COMPATIBLE"])
def test_huggy_arch_is_the_same_bytes_on_every_mkl_code_path(huggy: nn.Module, code_path: str) -> None:
    """An actor under MKL_CBWR (the mkl-avx2 fault, another CPU of the cluster) builds the bytes
    the driver built: the driver refuses an actor whose policy differs from its own."""
    script = "import harness\nfrom harness.policies import load_policy\nprint(load_policy('huggy-arch').info.sha256)"
    env = {**os.environ, "MKL_CBWR": code_path}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == huggy.info.sha256


def test_huggy_arch_normalizer_is_huggy_sized(huggy: nn.Module) -> None:
    normalizer = huggy.normalizer
    assert normalizer.normalization_steps.item() == 2_000_050
    assert 5e4 < normalizer.running_variance.mean().item() < 2e5
    # The point of these statistics: they do not fit in float16.
    assert normalizer.running_variance.max().item() > FLOAT16_MAX
    assert normalizer.running_mean.abs().max().item() < 5


def test_naive_float16_cast_breaks_huggy(huggy: nn.Module, obs: torch.Tensor) -> None:
    naive = copy.deepcopy(huggy).to(torch.float16)
    naive.compute_dtype = naive.io_dtype = torch.float16  # the whole model in float16, its normalizer too
    with torch.no_grad():
        out = naive(obs)
    assert not torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cast_policy_keeps_huggy_finite_and_close(huggy: nn.Module, obs: torch.Tensor, dtype: str) -> None:
    cast = cast_policy(huggy, dtype)
    with torch.no_grad():
        reference, out = huggy(obs), cast(obs)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    error = (out - reference).abs().max().item()
    assert 0 < error <= CAST_TOLERANCE[dtype], error
    assert np.isfinite(cast.deterministic_action(out).numpy()).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cast_policy_leaves_buffers_float32(huggy: nn.Module, dtype: str) -> None:
    cast = cast_policy(huggy, dtype)
    assert {name: buffer.dtype for name, buffer in cast.named_buffers()} == {
        "normalizer.running_mean": torch.float32,
        "normalizer.running_variance": torch.float32,
        "normalizer.normalization_steps": torch.float32,
        "log_sigma": torch.float32,
    }
    assert {p.dtype for p in cast.parameters()} == {getattr(torch, dtype)}
    assert huggy.head.weight.dtype == torch.float32  # the original is untouched
