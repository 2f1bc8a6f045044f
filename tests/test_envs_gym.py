"""Environments for any policy: which ids a policy may play, and lockstep stepping of the real
gymnasium environments, where an ended episode keeps its slot untouched."""

from __future__ import annotations

import numpy as np
import pytest

from harness.envs.cartpole import ENV_ID, VecCartPole
from harness.envs.lockstep import GymEnvs, make_lockstep
from harness.envs.registry import action_bounds, check_env
from harness.errors import UsageError
from harness.policies import load_policy
from harness.policies.base import ObsInput, PolicyInfo

CARTPOLE = load_policy("cartpole").info


def continuous_info(obs_size: int, action_size: int) -> PolicyInfo:
    inputs = (ObsInput("obs", (obs_size,)),)
    return PolicyInfo("tiny-continuous", "synthetic", "continuous", inputs, action_size, sha256="", synthetic=True)


@pytest.mark.parametrize("env_id", [ENV_ID, "CartPole-v1"])
def test_cartpole_policy_fits_both_cartpoles(env_id: str) -> None:
    check_env(env_id, CARTPOLE)


def test_pendulum_is_refused_for_cartpole_naming_both_sides() -> None:
    with pytest.raises(UsageError) as refused:
        check_env("Pendulum-v1", CARTPOLE)
    message = str(refused.value)
    assert "\n" not in message
    assert "flatten to 3 values, the policy takes 4" in message
    assert "actions are Box of shape (1,), the policy's are Discrete(2)" in message


def test_other_action_counts_and_kinds_are_refused() -> None:
    with pytest.raises(UsageError, match=r"Discrete\(3\), the policy's are Discrete\(2\)"):
        check_env("MountainCar-v0", PolicyInfo("two", "synthetic", "discrete", (ObsInput("obs", (2,)),), 2, sha256=""))
    with pytest.raises(UsageError, match=r"Discrete\(2\), the policy's are continuous of shape \(2,\)"):
        check_env("CartPole-v1", continuous_info(4, 2))
    check_env("Pendulum-v1", continuous_info(3, 1))


def test_misspelt_id_suggests_registered_ones() -> None:
    with pytest.raises(UsageError, match=r"'CartPol-v1' is not registered in gymnasium; did you mean CartPole-v1"):
        check_env("CartPol-v1", CARTPOLE)


def test_action_bounds_are_the_box_bounds() -> None:
    low, high = action_bounds("Pendulum-v1")
    assert low.dtype == np.float32 and low.tolist() == [-2.0] and high.tolist() == [2.0]
    with pytest.raises(ValueError, match="not a Box"):
        action_bounds("CartPole-v1")


def test_numpy_copy_is_the_default_for_seals_cartpole_only() -> None:
    assert isinstance(make_lockstep(ENV_ID, 2), VecCartPole)
    assert isinstance(make_lockstep("CartPole-v1", 2), GymEnvs)
    with pytest.raises(UsageError, match="numpy environment is seals/CartPole-v0 only"):
        make_lockstep("CartPole-v1", 2, "numpy")


def test_an_ended_episode_keeps_its_slot_untouched() -> None:
    """CartPole-v1 pushed always right falls within a few dozen steps, each seed at its own step."""
    envs = GymEnvs("CartPole-v1", 4)
    obs = envs.reset([0, 1, 2, 3])
    ended_at: dict[int, int] = {}
    last_obs: dict[int, np.ndarray] = {}
    for t in range(1, envs.horizon + 1):
        (obs,), rewards, terminated, truncated = envs.step(np.ones(4, dtype=np.int64))
        assert obs.shape == (4, 4) and obs.dtype == np.float32
        for i in np.flatnonzero(terminated | truncated):
            if i in ended_at:  # ended before: untouched since
                assert rewards[i] == 0.0 and obs[i].tobytes() == last_obs[i].tobytes() and terminated[i]
            else:
                ended_at[i], last_obs[i] = t, obs[i].copy()
        if len(ended_at) == 4:
            break
    assert len(set(ended_at.values())) > 1, f"episodes should end at different steps: {ended_at}"
    for i, env in enumerate(envs.envs):  # gymnasium counts steps past the end from 0, set when it ends
        assert env.unwrapped.steps_beyond_terminated == 0, f"env {i} was stepped after it terminated"
