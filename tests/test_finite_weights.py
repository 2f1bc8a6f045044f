"""A policy whose weights hold NaN or inf is a broken file, refused at load (exit 2) by the tensor
that holds them, whatever its format; a rebuilt graph's constants may still be -inf on purpose."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from harness.errors import PolicyLoadError
from harness.policies import CARTPOLE_ZIP, PolicySpec, load_policy
from harness.policies.mlagents import HEAD, PROCESSORS
from tests.helpers import assert_usage_error, cli
from tests.builders import mlagents_state_dict, rewrite_zip, tiny_graph


def refused(spec: str | PolicySpec, problem: str) -> None:
    source = spec.source if isinstance(spec, PolicySpec) else spec
    with pytest.raises(PolicyLoadError) as caught:
        load_policy(spec)
    assert str(caught.value) == f"{source}: {problem}"


def cartpole_with_nan(path: Path) -> Path:
    """The shipped CartPole zip with three NaN in its first actor layer."""
    state = torch.load(io.BytesIO(zipfile.ZipFile(CARTPOLE_ZIP).read("policy.pth")), weights_only=True)
    state["mlp_extractor.policy_net.0.weight"][0, :3] = float("nan")
    raw = io.BytesIO()
    torch.save(state, raw)
    return rewrite_zip(CARTPOLE_ZIP, path, **{"policy.pth": raw.getvalue()})


def test_an_sb3_weight_with_nan_is_refused_by_name(tmp_path: Path) -> None:
    refused(str(cartpole_with_nan(tmp_path / "nan.zip")), "body.0.weight holds 3 NaN")


def test_the_command_line_refuses_it_before_ray_starts(tmp_path: Path) -> None:
    path = cartpole_with_nan(tmp_path / "nan.zip")
    proc = cli("sweep", "--policy", str(path), "--accelerator", "cpu", "--results", str(tmp_path / "results"))
    assert_usage_error(proc, f"{path}: body.0.weight holds 3 NaN")
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        (f"{HEAD}.log_sigma", torch.tensor([[float("inf"), 0.0]]), "log_sigma holds 1 inf"),
        (
            f"{PROCESSORS}.0.normalizer.running_variance",
            torch.full((4,), float("inf")),
            "normalizer.running_variance holds 4 inf",
        ),
        (f"{HEAD}.mu.bias", torch.tensor([float("nan"), float("-inf")]), "head.bias holds 1 NaN and 1 inf"),
    ],
)
def test_an_mlagents_checkpoint_with_non_finite_values_is_refused(
    key: str, value: torch.Tensor, problem: str, tmp_path: Path
) -> None:
    state = mlagents_state_dict((4,), hidden=8, actions=2, seed=0)
    state[key] = value
    path = tmp_path / "policy.pt"
    torch.save({"Policy": state}, path)
    refused(str(path), problem)


def test_an_onnx_weight_with_nan_is_refused_and_a_minus_inf_constant_is_not(tmp_path: Path) -> None:
    model = onnx.load(tiny_graph("Relu", tmp_path / "relu.onnx"))
    weight = np.ones((4, 2), np.float32)
    weight[1, 1] = np.nan
    next(t for t in model.graph.initializer if t.name == "weight").CopyFrom(numpy_helper.from_array(weight, "weight"))
    onnx.save(model, tmp_path / "nan.onnx")
    refused(PolicySpec(str(tmp_path / "nan.onnx"), action_kind="continuous"), "body.layer.weight holds 1 NaN")

    # max(x, -inf) is x: a bound of -inf is a constant a graph may hold.
    nodes = [
        helper.make_node("Gemm", ["obs", "weight"], ["gemm"], name="layer"),
        helper.make_node("Max", ["gemm", "floor"], ["out"], name="floor"),
    ]
    graph = helper.make_graph(
        nodes,
        "floored",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 2])],
        [
            numpy_helper.from_array(np.ones((4, 2), np.float32), "weight"),
            numpy_helper.from_array(np.full(2, -np.inf, np.float32), "floor"),
        ],
    )
    path = tmp_path / "floored.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    policy = load_policy(PolicySpec(str(path), action_kind="continuous"))
    assert any(torch.isinf(b).any() for b in policy.body.buffers())
