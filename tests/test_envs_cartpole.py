"""The numpy CartPole is the real seals/CartPole-v0, bit for bit, step for step.

Random actions make the pole fall within a few dozen steps, so most of each 500-step episode is
spent after the fall, where seals keeps going (terminated is always False) and the angle wraps
around: the part of the dynamics a hand-written copy most easily gets wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.envs.cartpole import ENV_ID, HORIZON, VecCartPole
from harness.envs.lockstep import GymEnvs, make_lockstep


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit patterns: tells -0.0 from 0.0 and compares NaNs, unlike ==."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def real_state(real: GymEnvs) -> np.ndarray:
    return np.array([np.asarray(env.unwrapped.state, dtype=np.float64) for env in real.envs])


def action_plan(kind: str, n_envs: int, rng: np.random.Generator) -> np.ndarray:
    """(HORIZON, n_envs) actions: random, or patterns that keep the cart pushing one way."""
    if kind == "random":
        return rng.integers(0, 2, (HORIZON, n_envs))
    if kind == "sticky":  # long runs of one action: the cart leaves the track, the pole spins
        return np.repeat(rng.integers(0, 2, (HORIZON // 50, n_envs)), 50, axis=0)
    return np.tile(np.arange(HORIZON)[:, None] % 2, (1, n_envs))  # alternating: stays up longer


def assert_lockstep_identical(seeds: list[int], actions: np.ndarray, continue_episodes: int = 0) -> None:
    vec, real = VecCartPole(len(seeds)), GymEnvs(ENV_ID, len(seeds))
    for episode in range(1 + continue_episodes):
        # The first episode is seeded; later ones continue each environment's generator.
        episode_seeds = seeds if episode == 0 else None
        obs_v, obs_r = vec.reset(episode_seeds), real.reset(episode_seeds)
        assert same_bits(obs_v, obs_r), f"reset of episode {episode} differs"
        for t in range(HORIZON):
            got, want = vec.step(actions[t]), real.step(actions[t])
            for name, g, w in zip(("obs", "reward", "terminated", "truncated"), got, want, strict=True):
                assert same_bits(g, w), f"{name} differs at episode {episode} step {t + 1}: {g} vs {w}"
            # The float64 state too: a last-bit slip there may take many steps to reach float32.
            assert same_bits(vec.state.T, real_state(real)), f"state differs at episode {episode} step {t + 1}"
        assert got[3].all() and not got[2].any()


@pytest.mark.parametrize("plan", ["random", "sticky", "alternating"])
def test_full_episodes_match_seals_bit_for_bit(plan: str) -> None:
    rng = np.random.default_rng(["random", "sticky", "alternating"].index(plan))
    seeds = [int(s) for s in rng.integers(0, 2**32, 24)] + list(range(8))
    assert_lockstep_identical(seeds, action_plan(plan, len(seeds), rng))


def test_unseeded_resets_continue_each_generator_as_gymnasium_does() -> None:
    rng = np.random.default_rng(7)
    seeds = [3, 1, 4, 1, 5]  # a repeated seed: two environments with the same stream
    assert_lockstep_identical(seeds, action_plan("random", len(seeds), rng), continue_episodes=2)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**63), actions=st.lists(st.integers(0, 1), min_size=HORIZON, max_size=HORIZON))
def test_any_seed_and_action_sequence(seed: int, actions: list[int]) -> None:
    assert_lockstep_identical([seed], np.asarray(actions)[:, None])


def test_stepping_past_the_horizon_needs_a_reset() -> None:
    env = make_lockstep(ENV_ID, 2, "numpy")
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(2, dtype=np.int64))
    env.reset([0, 1])
    for _ in range(HORIZON):
        env.step(np.ones(2, dtype=np.int64))
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.ones(2, dtype=np.int64))


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="numpy, gymnasium"):
        make_lockstep(ENV_ID, 1, "mujoco")
