"""Localizing a divergence on real policies (torch on the CPU, no Ray): the layer named is the one
that was broken, identical runs name none, drift and NaN are reported without a crash."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from harness.judge.compare import TOLERANCES, Tolerance
from harness.inference.faults import perturb_one_weight
from harness.inference.capture import capture_activations, layer_modules, leaf_layers
from harness.judge.localize import first_divergent_layer, layer_error
from harness.policies import PolicyNet, cast_policy, load_policy
from harness.workloads import make_batch

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
    expected = (["normalizer"] if policy.normalizer is not None else []) + [
        f"body.{i}" for i in range(len(policy.body))
    ] + ["head"]
    assert list(acts) == expected
    assert all(a.dtype == np.float32 for a in acts.values())
    with torch.inference_mode():
        np.testing.assert_array_equal(acts["head"], policy(*obs).numpy())


def test_perturbed_weight_diverges_at_body0(policy: PolicyNet) -> None:
    obs = observations(policy)
    card = copy.deepcopy(policy)
    perturb_one_weight(card)
    div = first_divergent_layer(
        capture_activations(card, obs), capture_activations(policy, obs), None, modules=layer_modules(card)
    )
    assert div is not None
    assert div.layer == "body.0"
    # The normalizer, when there is one, was compared first and found identical.
    assert div.layers_checked == first_layer_after_input(policy)
    assert div.module == f"Linear({policy.info.obs_size}, {policy.body[0].out_features})"
    assert not div.comparison.bitwise_equal and len(div.index) == 2
    line = div.describe()
    assert line.startswith(f"first divergent layer: body.0 {div.module} (first mismatch at [")
    assert "ulp" in line and "\n" not in line


def test_perturbed_head_diverges_at_head(policy: PolicyNet) -> None:
    obs = observations(policy)
    card = copy.deepcopy(policy)
    perturb_head(card)
    acts, ref = capture_activations(card, obs), capture_activations(policy, obs)
    div = first_divergent_layer(acts, ref, None)
    assert div is not None
    assert (div.layer, div.layers_checked) == ("head", len(acts))
    assert div.index[-1] == 0  # only logit / mu 0 was touched
    assert "inputs identical" in div.describe()


def test_identical_policies_agree(policy: PolicyNet) -> None:
    obs = observations(policy)
    acts, ref = capture_activations(copy.deepcopy(policy), obs), capture_activations(policy, obs)
    assert first_divergent_layer(acts, ref, None) is None
    assert first_divergent_layer(acts, ref, TOLERANCES["float32"]) is None


# Far tighter than the dtype allows, so a layer is always named and the consistency checks run.
TIGHT = Tolerance(atol=1e-4, rtol=0.0, min_cos=0.9)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("tight", [False, True], ids=["default-tol", "tight-tol"])
def test_low_precision_drift_is_judged_per_layer(policy: PolicyNet, dtype: str, tight: bool) -> None:
    obs = observations(policy)
    tol = TIGHT if tight else TOLERANCES[dtype]
    acts = capture_activations(cast_policy(policy, dtype), obs)
    ref = capture_activations(policy, obs)
    div = first_divergent_layer(acts, ref, tol, modules=layer_modules(policy))
    if div is None:
        assert not tight
        return
    assert not div.comparison.passed
    assert (div.comparison.atol, div.comparison.rtol) == (tol.atol, tol.rtol)
    # Every layer before the one named is within the same tolerance.
    layers = list(acts)[: div.layers_checked]
    assert layers[-1] == div.layer
    assert [e.layer for e in div.errors] == layers
    assert first_divergent_layer({k: acts[k] for k in layers[:-1]}, {k: ref[k] for k in layers[:-1]}, tol) is None
    line = div.describe()
    assert "error/max|ref| by layer: " in line
    if div.layers_checked > 1 and div.errors[-2].rel_error == 0:
        assert "inputs identical" in line


def test_drift_and_growth_on_hand_made_layers() -> None:
    ref = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([10.0], np.float32)}
    acts = {"a": np.array([1.0, 2.002], np.float32), "b": np.array([10.2], np.float32)}
    tol = Tolerance(atol=0.0, rtol=0.01, min_cos=0.0)
    div = first_divergent_layer(acts, ref, tol)
    assert div is not None
    assert (div.layer, div.index, div.layers_checked) == ("b", (0,), 2)
    first, second = div.errors
    assert first.growth is None and first.rel_error == pytest.approx(1e-3, rel=1e-3)
    assert second.rel_error == pytest.approx(2e-2, rel=1e-3)
    assert second.growth == pytest.approx(20.0, rel=1e-3)
    assert "input within tolerance" in div.describe() and "(x20)" in div.describe()


def test_growth_after_an_exact_layer_is_undefined() -> None:
    exact = layer_error("a", np.ones(3, np.float32), np.ones(3, np.float32), None)
    assert (exact.rel_error, exact.growth) == (0.0, None)
    assert layer_error("b", np.full(3, 2.0, np.float32), np.ones(3, np.float32), exact).growth is None


def test_hooks_are_removed(policy: PolicyNet) -> None:
    capture_activations(policy, observations(policy, size=4))
    with pytest.raises(RuntimeError):
        # Too wide an observation: the forward fails after some hooks have been installed.
        capture_activations(policy, (torch.zeros(2, policy.info.obs_size + 1),))
    assert all(not m._forward_hooks for m in policy.modules())
    assert list(leaf_layers(policy))[-1] == "head"


def test_nan_is_flagged_at_the_first_layer_producing_it() -> None:
    policy = load_policy("cartpole")
    assert policy.normalizer is None  # inf goes straight into the first Linear
    obs = np.zeros((8, 4), np.float32)
    obs[:, 0], obs[:, 1] = np.inf, -np.inf
    acts = capture_activations(policy, (torch.from_numpy(obs),))
    assert np.isnan(acts["body.0"]).any()

    div = first_divergent_layer(acts, capture_activations(policy, (torch.from_numpy(obs),)), TOLERANCES["float32"])
    assert div is not None
    assert (div.layer, div.layers_checked) == ("body.0", 1)
    assert "nan in output" in div.describe()
    assert np.isnan(acts["body.0"][div.index]) or np.isinf(acts["body.0"][div.index])


def test_nan_on_one_card_only_is_a_bitwise_divergence() -> None:
    ref = {"body.0": np.ones((2, 3), np.float32), "body.1": np.ones((2, 3), np.float32)}
    card = {k: v.copy() for k, v in ref.items()}
    card["body.1"][1, 2] = np.nan
    div = first_divergent_layer(card, ref, None)
    assert div is not None
    assert (div.layer, div.index) == ("body.1", (1, 2))
    assert "(nan)" in div.describe()


def test_captures_of_different_architectures_are_refused() -> None:
    with pytest.raises(ValueError, match="different layers"):
        first_divergent_layer({"body.0": np.zeros(1, np.float32)}, {"head": np.zeros(1, np.float32)}, None)
