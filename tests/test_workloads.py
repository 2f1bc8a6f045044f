"""Fixed inputs: same seed, same bytes; each batch named by its sha256; edges on the clamp."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.config.command_plan import sweep_plan
from harness.config.options import SweepConfig
from harness.sweeps.plan import plan_batches, plan_inputs, plan_units
from harness.policies import load_policy
from harness.workloads import batch_sha256, make_batch
from tests.builders import described


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    info = load_policy("huggy-arch").info
    a, b = make_batch(info, "normal", 8, seed=0), make_batch(info, "normal", 8, seed=0)
    assert a.sha256 == b.sha256 and all(np.array_equal(x, y) for x, y in zip(a.obs, b.obs, strict=True))
    assert make_batch(info, "normal", 8, seed=1).sha256 != a.sha256
    assert a.sha256 == batch_sha256(a.obs, a.noise)
    assert a.obs[0].dtype == np.float32 and a.obs[0].shape == (8, 59) and a.noise.shape == (8, 21)


def test_uniform_stays_inside_finite_bounds() -> None:
    info = load_policy("cartpole").info
    batch = make_batch(info, "uniform", 4096, seed=0)
    obs = batch.obs[0]
    assert np.all(np.abs(obs[:, 2]) <= np.pi + 1e-6)  # pole angle has a real bound
    assert np.all(np.abs(obs[:, [0, 1, 3]]) <= 1.0)  # float32-max bounds count as unbounded
    assert np.all(np.isfinite(obs))


def test_edge_batch_hits_the_normalizer_clamp_exactly_and_goes_far_beyond() -> None:
    policy = load_policy("huggy-arch")
    edge = next(b for b in plan_batches(sweep_plan(SweepConfig(policies=["huggy-arch"])), policy) if b.distribution == "edge")
    normalized = policy.normalizer(torch.from_numpy(edge.obs[0])).numpy()
    assert np.all(normalized[0] == np.clip(-policy.normalizer.running_mean.numpy() / policy.normalizer.std().numpy(), -5, 5))
    assert np.allclose(normalized[1], -5.0, atol=1e-4) and np.allclose(normalized[2], 5.0, atol=1e-4)
    assert np.all(normalized[3] == -5.0) and np.all(normalized[4] == 5.0)  # far beyond, clamped


def test_discrete_noise_is_gumbel_and_samples_the_softmax() -> None:
    info = load_policy("cartpole").info
    noise = make_batch(info, "normal", 100_000, seed=3).noise
    logits = np.array([0.0, 1.0], dtype=np.float32)
    freq = np.mean(np.argmax(logits + noise, axis=1) == 1)
    assert abs(freq - np.exp(1) / (1 + np.exp(1))) < 0.01


def test_unit_ids_are_stable_and_distinct() -> None:
    policies = {"cartpole": load_policy("cartpole")}
    config = sweep_plan(SweepConfig(policies=["cartpole"], dtypes=["float32", "bfloat16"], episodes=2))
    inputs = {"cartpole": plan_inputs(config, policies["cartpole"])}
    labels = {"float32": "float32", "bfloat16": "bfloat16"}
    units = plan_units(config, policies, inputs, labels)
    ids = [u.unit_id for u in units]
    assert ids == [u.unit_id for u in plan_units(config, policies, plan_inputs_again(config, policies), labels)]
    assert len(set(ids)) == len(ids)
    # float32 on cards that reduce their matmuls (TF32) is another unit than float32
    tf32 = plan_units(config, policies, inputs, {"float32": "float32-tf32", "bfloat16": "bfloat16"})
    changed = {u.workload for u, v in zip(units, tf32, strict=True) if u.unit_id != v.unit_id}
    assert {u.dtype for u in tf32} == {"float32-tf32", "bfloat16"} and changed
    assert all(u.unit_id == v.unit_id for u, v in zip(units, tf32, strict=True) if u.dtype == "bfloat16")
    kinds = {type(u.work).__name__ for u in units}
    assert kinds == {"BatchWork", "InvarianceWork", "EpisodeWork"}


def plan_inputs_again(config: SweepConfig, policies: dict) -> dict:
    return {key: plan_inputs(config, policy) for key, policy in policies.items()}


def test_float32_on_cards_that_reduce_their_matmuls_is_labelled_so() -> None:
    from harness.errors import UsageError
    from harness.sweeps.driver import dtype_labels

    strict = described("cuda0", settings={"torch.backends.cuda.matmul.fp32_precision": "ieee"})
    tf32 = described("cuda1", settings={"torch.backends.cuda.matmul.fp32_precision": "tf32"})
    hf32 = described("npu0", settings={"torch_npu.npu.matmul.allow_hf32": True})
    assert dtype_labels(["float32", "float16"], [strict, strict.relabelled("cuda2")]) == {
        "float32": "float32",
        "float16": "float16",
    }
    assert dtype_labels(["float32", "bfloat16"], [tf32]) == {"float32": "float32-tf32", "bfloat16": "bfloat16"}
    assert dtype_labels(["float32"], [hf32]) == {"float32": "float32-hf32"}
    with pytest.raises(UsageError, match="different modes"):
        dtype_labels(["float32"], [strict, tf32])
