"""Which environment a policy plays: any registered gymnasium id whose spaces fit the policy.

A misspelt id or an environment of other shapes is the user's mistake, caught before any card
runs: a UsageError of one line naming both sides. Ids come from gymnasium's registry, with
`seals` imported so that seals/* ids are in it.
"""

from __future__ import annotations

import difflib
import functools
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import seals  # noqa: F401  (registers seals/* environments)
from gymnasium.spaces import Box, Discrete, Space, flatdim

from harness.errors import UsageError, first_line
from harness.policies.base import PolicyInfo


def registered_ids() -> list[str]:
    return sorted(gym.registry)


@functools.cache
def env_spaces(env_id: str) -> tuple[Space[Any], Space[Any]]:
    """(observation space, action space) of `env_id`, read from one environment made for it."""
    ids = registered_ids()
    if env_id not in ids:
        close = difflib.get_close_matches(env_id, ids, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; e.g. CartPole-v1, Pendulum-v1, seals/CartPole-v0"
        raise UsageError(f"environment {env_id!r} is not registered in gymnasium{hint}")
    try:
        with warnings.catch_warnings():
            # gymnasium notes, for every CartPole made, that its float64 bounds became float32.
            warnings.simplefilter("ignore", UserWarning)
            env = gym.make(env_id)
    except Exception as exc:  # missing extras (Box2D, MuJoCo) raise DependencyNotInstalled, among others
        raise UsageError(f"environment {env_id} cannot be made: {first_line(exc)}") from exc
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def max_episode_steps(env_id: str) -> int | None:
    """The environment's own step limit, read from the registry (no environment is made); None
    where it sets none or the id is unknown."""
    if env_id not in registered_ids():
        return None
    return gym.spec(env_id).max_episode_steps


def check_env(env_id: str, info: PolicyInfo) -> None:
    """Refuse (UsageError) an unregistered id, or an environment whose spaces are not the policy's."""
    obs_space, action_space = env_spaces(env_id)
    problems = []
    if flatdim(obs_space) != info.obs_size:
        problems.append(f"its observations flatten to {flatdim(obs_space)} values, the policy takes {info.obs_size}")
    if info.action_kind == "discrete":
        fits = isinstance(action_space, Discrete) and int(action_space.n) == info.action_size and int(action_space.start) == 0
    else:
        fits = isinstance(action_space, Box) and action_space.shape == (info.action_size,)
    if not fits:
        problems.append(f"its actions are {_describe(action_space)}, the policy's are {_policy_actions(info)}")
    if problems:
        raise UsageError(f"environment {env_id} does not fit policy {info.name}: {'; '.join(problems)}")


def action_bounds(env_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of a Box action space, in its dtype: SB3 clips continuous actions to these."""
    space = env_spaces(env_id)[1]
    if not isinstance(space, Box):
        raise ValueError(f"{env_id} has {_describe(space)} actions, not a Box")
    return space.low, space.high


def _describe(space: Space[Any]) -> str:
    if isinstance(space, Discrete):
        return f"Discrete({space.n})" if space.start == 0 else f"Discrete({space.n}, start={space.start})"
    if isinstance(space, Box):
        return f"Box of shape {space.shape}"
    return type(space).__name__


def _policy_actions(info: PolicyInfo) -> str:
    if info.action_kind == "discrete":
        return f"Discrete({info.action_size})"
    return f"continuous of shape ({info.action_size},)"
