"""Localizing a divergence on real policies (torch on the CPU, no Ray): the layer named is the one
that was broken, identical runs name none, drift and NaN are reported without a crash."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.inference.capture import capture_activations, layer_modules, leaf_layers
from harness.inference.faults import corrupt_first_layer, perturb_one_weight
from harness.judge.golden import RatioLimits
from harness.judge.localize import (
    DIVERGENT,
    OFF_GOLDEN,
    first_divergent_layer,
    first_layer_off_golden,
    first_overflow_layer,
    named_layer,
)
from harness.policies import GOLDEN_DTYPE, PolicyNet, cast_policy, load_policy
from harness.policies.matmul_precision import reduce_float32_matmuls
from harness.workloads import make_batch
from tests import builders

POLICIES = ["cartpole", "huggy-arch"]


@pytest.fixture(scope="module", params=POLICIES)
def policy(request: pytest.FixtureRequest) -> PolicyNet:
    return load_policy(request.param)


def observations(policy: PolicyNet, size: int = 256, seed: int = 0) -> tuple[torch.Tensor, ...]:
    batch = make_batch(policy.info, "normal", size, seed)
    return tuple(torch.from_numpy(o) for o in batch.obs)


def perturb_head(policy: PolicyNet) -> None:
    # The bias, not a weight: a nudge to a weight can round away inside the dot product.
    with torch.no_grad():
        policy.head.bias[0] += 1e-3


def first_layer_after_input(policy: PolicyNet) -> int:
    return 2 if policy.normalizer is not None else 1


def test_capture_order_dtype_and_output(policy: PolicyNet) -> None:
    obs = observations(policy)
    acts = capture_activations(policy, obs)
    expected = (
        (["normalizer"] if policy.normalizer is not None else []) + [f"body.{i}" for i in range(len(policy.body))] + ["head"]
    )
    assert list(acts) == expected
    assert all(a.dtype == np.float32 for a in acts.values())
    with torch.inference_mode():
        np.testing.assert_array_equal(acts["head"], policy(*obs).numpy())


def test_perturbed_weight_diverges_at_body0(policy: PolicyNet) -> None:
    obs = observations(policy)
    card = copy.deepcopy(policy)
    perturb_one_weight(card)
    div = first_divergent_layer(capture_activations(card, obs), capture_activations(policy, obs), modules=layer_modules(card))
    assert div is not None
    assert div.layer == "body.0"
    # The normalizer, when there is one, was compared first and found identical.
    assert div.layers_checked == first_layer_after_input(policy)
    assert div.module == f"Linear({policy.info.obs_size}, {policy.body[0].out_features})"
    assert not div.comparison.bitwise_equal and len(div.index) == 2
    line = div.describe()
    assert line.startswith(f"first divergent layer: body.0 {div.module} (first mismatch at [")
    assert "ulp" in line and "\n" not in line
    # The report reads the layer back from a row's detail, where it follows the row's own mismatch.
    assert named_layer(f"first mismatch at [3, 1]: a=1, b=2 (1 ulp); {line}") == (DIVERGENT, f"body.0 {div.module}", "")
    assert named_layer(f"x; as found on normal-b8-s1: {line}") == (DIVERGENT, f"body.0 {div.module}", "normal-b8-s1")
    assert named_layer("first mismatch at [3, 1]: a=1, b=2 (1 ulp)") is None


def test_perturbed_head_diverges_at_head(policy: PolicyNet) -> None:
    obs = observations(policy)
    card = copy.deepcopy(policy)
    perturb_head(card)
    acts, ref = capture_activations(card, obs), capture_activations(policy, obs)
    div = first_divergent_layer(acts, ref)
    assert div is not None
    assert (div.layer, div.layers_checked) == ("head", len(acts))
    assert div.index[-1] == 0  # only logit / mu 0 was touched
    assert "inputs identical" in div.describe()


def test_identical_policies_agree(policy: PolicyNet) -> None:
    obs = observations(policy)
    acts, ref = capture_activations(copy.deepcopy(policy), obs), capture_activations(policy, obs)
    assert first_divergent_layer(acts, ref) is None
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    assert first_layer_off_golden(acts, ref, golden, "float32", LIMITS) is None


LIMITS = RatioLimits()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_honest_low_precision_is_on_the_golden_at_every_layer(policy: PolicyNet, dtype: str) -> None:
    obs = observations(policy)
    card = capture_activations(cast_policy(policy, dtype), obs)
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    assert all(a.dtype == np.float64 for a in golden.values())
    assert first_layer_off_golden(card, card, golden, dtype, LIMITS) is None


def test_reduced_float32_is_named_at_the_first_matmul(policy: PolicyNet) -> None:
    """TF32 rounding on a float32 card: the first Linear layer is where it leaves the golden."""
    obs = observations(policy)
    card = capture_activations(reduce_float32_matmuls(cast_policy(policy, "float32")), obs)
    cpu = capture_activations(cast_policy(policy, "float32"), obs)
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    div = first_layer_off_golden(card, cpu, golden, "float32", LIMITS, modules=layer_modules(policy))
    assert div is not None and div.layer == "body.0" and div.layers_checked == first_layer_after_input(policy)
    assert not div.comparison.passed and div.comparison.error_ratio > 100
    assert [r.layer for r in div.ratios] == list(card)[: div.layers_checked]
    line = div.describe()
    assert line.startswith(f"first layer off the golden: body.0 {div.module} (error_ratio") and "error ratio by layer:" in line
    assert named_layer(f"error_ratio 3e+04 > 3: ...; {line}") == (OFF_GOLDEN, f"body.0 {div.module}", "")


def test_a_layer_that_blows_up_is_named_with_its_growth() -> None:
    ref = {"a": np.array([1.0, 2.0]), "b": np.array([10.0, -4.0])}
    cpu = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([10.0, -4.0], np.float32)}
    card = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([10.5, -4.0], np.float32)}
    div = first_layer_off_golden(card, cpu, ref, "float32", LIMITS)
    assert div is not None and (div.layer, div.index, div.layers_checked) == ("b", (0,), 2)
    first, second = div.ratios
    assert first.ratio == 0.0 and first.growth is None and second.growth is None  # no growth over an exact layer
    assert "inputs within the rule" in div.describe()


def test_a_corrupt_weight_leaves_the_golden_at_body0(policy: PolicyNet) -> None:
    obs = observations(policy)
    broken = cast_policy(policy, "float32")
    corrupt_first_layer(broken)
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    div = first_layer_off_golden(capture_activations(broken, obs), capture_activations(policy, obs), golden, "float32", LIMITS)
    assert div is not None and div.layer == "body.0"


def test_hooks_are_removed(policy: PolicyNet) -> None:
    capture_activations(policy, observations(policy, size=4))
    with pytest.raises(RuntimeError):
        # Too wide an observation: the forward fails after some hooks have been installed.
        capture_activations(policy, (torch.zeros(2, policy.info.obs_size + 1),))
    assert all(not m._forward_hooks for m in policy.modules())
    assert list(leaf_layers(policy))[-1] == "head"


def test_nan_where_the_golden_is_finite_is_flagged_at_the_layer_producing_it() -> None:
    policy = load_policy("cartpole")
    obs = (torch.zeros(8, 4),)
    card, cpu = capture_activations(policy, obs), capture_activations(policy, obs)
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    card["body.2"][3, 5] = np.nan
    div = first_layer_off_golden(card, cpu, golden, "float32", LIMITS)
    assert div is not None and (div.layer, div.layers_checked, div.index) == ("body.2", 3, (3, 5))
    assert "nan in the card's output where the golden is finite" in div.describe()


def test_nan_on_one_card_only_is_a_bitwise_divergence() -> None:
    ref = {"body.0": np.ones((2, 3), np.float32), "body.1": np.ones((2, 3), np.float32)}
    card = {k: v.copy() for k, v in ref.items()}
    card["body.1"][1, 2] = np.nan
    div = first_divergent_layer(card, ref)
    assert div is not None
    assert (div.layer, div.index) == ("body.1", (1, 2))
    assert "(nan)" in div.describe()


def test_the_layer_where_a_dtype_overflows_is_named(tmp_path: Path) -> None:
    policy = load_policy(str(builders.float16_overflow(tmp_path)))
    obs = observations(policy)
    acts = capture_activations(cast_policy(policy, "float16"), obs)
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    overflow = first_overflow_layer(acts, golden, modules=layer_modules(policy))
    assert overflow is not None and overflow.layer == "body.0" and overflow.largest > 65504
    assert overflow.describe("float16").startswith("the overflow begins at body.0 Linear(4, 16): ")
    assert first_overflow_layer(capture_activations(cast_policy(policy, "float32"), obs), golden) is None


def test_captures_of_different_architectures_are_refused() -> None:
    with pytest.raises(ValueError, match="different layers"):
        first_divergent_layer({"body.0": np.zeros(1, np.float32)}, {"head": np.zeros(1, np.float32)})
