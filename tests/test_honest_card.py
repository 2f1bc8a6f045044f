"""The model of an honest card (`ulp-noise`) and the faults that lose return (`action-bias`,
`noisy-sampler`), in this process: what they change, and what they must leave alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.devices import cpu_reference
from harness.errors import UsageError
from harness.inference.episodes import run_episodes
from harness.inference.fault_specs import FAULTS, Fault, parse_faults
from harness.inference.faults import HONEST_SEED, add_ulp_noise, inject, ulp_nudge
from harness.inference.forward import run_batch
from harness.judge.golden import RatioLimits, compare_to_golden
from harness.policies import GOLDEN_DTYPE, PolicyNet, cast_policy, load_policy
from harness.workloads import make_batch

DEVICE = cpu_reference()


@pytest.fixture(scope="module")
def cartpole() -> PolicyNet:
    return load_policy("cartpole")


def outputs(policy: PolicyNet, dtype: str, faults: list[Fault], size: int = 4096, seed: int = 0) -> dict[str, np.ndarray]:
    batch = make_batch(policy.info, "normal", size, seed)
    return run_batch(inject(cast_policy(policy, dtype), faults), DEVICE, batch.obs, batch.noise)


def test_every_card_of_all_is_nudged_alike_and_a_card_of_its_own_otherwise(cartpole: PolicyNet) -> None:
    [every] = parse_faults(["all:ulp-noise"])
    cpu = outputs(cartpole, "float32", [])["logits"]
    card0, card1 = (outputs(cartpole, "float32", [every])["logits"] for _ in range(2))
    np.testing.assert_array_equal(card0, card1)  # two cards, one seed: bit for bit (and run to run)
    assert not np.array_equal(card0, cpu), "an honest card is not bit-equal to the CPU"
    own = outputs(cartpole, "float32", parse_faults(["card1:ulp-noise"]))["logits"]
    assert not np.array_equal(own, card0) and not np.array_equal(own, cpu)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_an_honest_card_passes_the_port_rule(cartpole: PolicyNet, dtype: str) -> None:
    batch = make_batch(cartpole.info, "normal", 4096, seed=0)
    card = run_batch(add_ulp_noise(cast_policy(cartpole, dtype), 0), DEVICE, batch.obs, batch.noise)
    same = run_batch(cast_policy(cartpole, dtype), DEVICE, batch.obs, batch.noise)
    golden = run_batch(cast_policy(cartpole, GOLDEN_DTYPE), DEVICE, batch.obs, batch.noise)
    port = compare_to_golden(card["logits"], same["logits"], golden["logits"], dtype, RatioLimits())
    assert port.passed, port.detail


def test_a_nudge_is_one_ulp_of_the_values_dtype_and_leaves_zeros_and_non_finite_values() -> None:
    x = torch.tensor([0.0, -0.0, 1.0, -3.5, float("inf"), float("nan"), 3.4028235e38] * 2000, dtype=torch.float32)
    y = ulp_nudge(x, seed=0, rate=1.0)
    moved = (x.view(torch.int32) - y.view(torch.int32)).abs()
    finite = torch.isfinite(x) & (x != 0) & (x.abs() < 3e38)
    assert bool((moved[finite] == 1).all()), "every finite value moved by one ULP at rate 1"
    assert bool((y[~finite].view(torch.int32) == x[~finite].view(torch.int32)).all() | (x[~finite].abs() > 3e38).all())
    assert torch.isfinite(y[torch.isfinite(x)]).all(), "nothing nudged past the largest value"
    half = torch.linspace(-10, 10, 100_000).half()
    moved = (ulp_nudge(half, 0, 0.25).view(torch.int16) != half.view(torch.int16)).float().mean()
    assert 0.2 < float(moved) < 0.3
    alone, inside = ulp_nudge(x[:7], 0, 0.25), ulp_nudge(x, 0, 0.25)[:7]
    assert torch.equal(alone.view(torch.int32), inside.view(torch.int32)), "a value's nudge is its own, wherever it sits"


def test_the_honest_replay_plays_other_episodes_of_a_near_tie_policy(tmp_path) -> None:
    from tests import builders

    policy = load_policy(str(builders.near_tie_cartpole(tmp_path)))
    seeds = list(range(8))
    cpu = run_episodes(cast_policy(policy, "float32"), DEVICE, "CartPole-v1", seeds, False, "lockstep")
    honest = run_episodes(
        add_ulp_noise(cast_policy(policy, "float32"), HONEST_SEED), DEVICE, "CartPole-v1", seeds, False, "lockstep"
    )
    assert sum(a.actions_sha256 != b.actions_sha256 for a, b in zip(cpu, honest, strict=True)) >= 4


def test_a_bias_moves_the_head_and_a_noisier_sampler_only_the_samples(cartpole: PolicyNet) -> None:
    clean = outputs(cartpole, "float32", [], size=256)
    biased = outputs(cartpole, "float32", parse_faults(["all:action-bias=0.5"]), size=256)
    np.testing.assert_allclose(biased["logits"][:, 0], clean["logits"][:, 0] + 0.5, rtol=1e-6)
    np.testing.assert_array_equal(biased["logits"][:, 1], clean["logits"][:, 1])
    noisy = outputs(cartpole, "float32", parse_faults(["all:noisy-sampler=3"]), size=256)
    np.testing.assert_array_equal(noisy["logits"], clean["logits"])
    np.testing.assert_array_equal(noisy["action"], clean["action"])
    assert not np.array_equal(noisy["stochastic_action"], clean["stochastic_action"])


def test_fault_sizes_are_parsed_shown_and_refused_where_they_do_not_belong() -> None:
    assert parse_faults(["all:action-bias=0.2", "card1:noisy-sampler"]) == [
        Fault(None, "action-bias", 0.2),
        Fault(1, "noisy-sampler", FAULTS.get("noisy-sampler").size),
    ]
    assert [str(f) for f in parse_faults(["all:action-bias=0.2", "card1:noisy-sampler", "all:ulp-noise"])] == [
        "all:action-bias=0.2",
        "card1:noisy-sampler",
        "all:ulp-noise",
    ]
    with pytest.raises(UsageError, match="ulp-noise takes no size"):
        parse_faults(["all:ulp-noise=1"])
    with pytest.raises(UsageError, match="is not a number"):
        parse_faults(["all:action-bias=1e"])
