"""Which environment a policy plays: any registered gymnasium id whose spaces fit the policy.

A misspelt id or an environment of other shapes is the user's mistake, caught before any card
runs: a UsageError of one line naming both sides. Ids come from gymnasium's registry, with
`seals` imported so that seals/* ids are in it and ale-py's Atari ids where it is installed. The
spaces compared are the wrapped environment's, its observations as the policy gets them (frames
stacked, images channels first: harness/envs/observations.py).
"""

from __future__ import annotations

import functools
from typing import Any, assert_never

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete, MultiDiscrete, Space

from harness.envs.lockstep import ACTION_MASKS
from harness.envs.observations import Observations, View
from harness.envs.spec import EnvSpec, make_env, require_registered
from harness.errors import UsageError
from harness.policies.base import ObsInput, PolicyInfo


@functools.cache
def env_spaces(spec: EnvSpec) -> tuple[tuple[View, ...], Space[Any]]:
    """(the observations the policy gets, the action space) of `spec`, read from one environment made for it."""
    env, _ = make_env(spec)
    try:
        return Observations(env.observation_space, 1, spec.setup.frame_stack).views, env.action_space
    finally:
        env.close()


@functools.cache
def gives_action_masks(spec: EnvSpec) -> bool:
    """Whether `spec`'s environment has `action_masks()`, read from one environment made for it."""
    env, _ = make_env(spec)
    try:
        return env.has_wrapper_attr(ACTION_MASKS)
    finally:
        env.close()


def max_episode_steps(env_id: str) -> int | None:
    """The environment's own step limit, read from the registry (no environment is made); None
    where it sets none or the id is unknown."""
    try:
        require_registered(env_id)
    except UsageError:
        return None
    return gym.spec(env_id).max_episode_steps


def entry_point(env_id: str) -> str:
    """Where the registry makes `env_id` from ("gymnasium.envs.box2d.lunar_lander:LunarLander"); "" where unknown."""
    try:
        require_registered(env_id)
    except UsageError:
        return ""
    return str(gym.spec(env_id).entry_point)


def check_env(env: EnvSpec | str, info: PolicyInfo) -> None:
    """Refuse (UsageError) an unregistered id, or an environment whose spaces are not the policy's."""
    spec = EnvSpec.of(env)
    views, action_space = env_spaces(spec)
    problems = []
    if not _observations_fit(views, info.inputs):
        problems.append(_observations_problem(views, info))
    kind = info.action_kind
    match kind:
        case "discrete":
            fits = (
                isinstance(action_space, Discrete) and int(action_space.n) == info.action_size and int(action_space.start) == 0
            )
        case "multi_discrete":
            fits = (
                isinstance(action_space, MultiDiscrete)
                and action_space.nvec.ndim == 1
                and tuple(int(n) for n in action_space.nvec) == info.branches
                and not action_space.start.any()
            )
        case "continuous":
            fits = isinstance(action_space, Box) and action_space.shape == (info.action_size,)
        case _:
            assert_never(kind)
    if not fits:
        problems.append(f"its actions are {_describe(action_space)}, the policy's are {_policy_actions(info)}")
    if info.masked and not gives_action_masks(spec):
        problems.append(f"it has no {ACTION_MASKS}(), and the policy chooses only among the actions those allow")
    if problems:
        raise UsageError(f"environment {spec.key} does not fit policy {info.name}: {'; '.join(problems)}")


def action_bounds(env: EnvSpec | str) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of a Box action space, in its dtype: SB3 clips continuous actions to these."""
    spec = EnvSpec.of(env)
    space = env_spaces(spec)[1]
    if not isinstance(space, Box):
        raise ValueError(f"{spec.key} has {_describe(space)} actions, not a Box")
    return space.low, space.high


def _observations_fit(views: tuple[View, ...], inputs: tuple[ObsInput, ...]) -> bool:
    """One array per input, each of its shape and dtype (a Dict's keys by name, in order); or one
    flat vector that the policy takes as several (an ML-Agents policy of obs_0, obs_1)."""
    if len(views) == len(inputs):
        named = len(views) == 1 or all(v.name == i.name for v, i in zip(views, inputs, strict=True))
        return named and all(
            (v.shape, v.dtype, v.classes) == (i.shape, i.dtype, i.classes) for v, i in zip(views, inputs, strict=True)
        )
    return (
        _one_vector(views)
        and all(len(i.shape) == 1 and i.dtype == "float32" for i in inputs)
        and (views[0].shape[0] == sum(i.size for i in inputs))
    )


def _observations_problem(views: tuple[View, ...], info: PolicyInfo) -> str:
    if _one_vector(views) and all(len(i.shape) == 1 and i.dtype == "float32" for i in info.inputs):
        return f"its observations flatten to {views[0].shape[0]} values, the policy takes {info.obs_size}"
    theirs = ", ".join(View(i.name, i.shape, i.dtype, i.classes).describe() for i in info.inputs)
    return f"its observations are {', '.join(v.describe() for v in views)}, the policy takes {theirs}"


def _one_vector(views: tuple[View, ...]) -> bool:
    return len(views) == 1 and views[0].dtype == "float32"


def _describe(space: Space[Any]) -> str:
    if isinstance(space, Discrete):
        return f"Discrete({space.n})" if space.start == 0 else f"Discrete({space.n}, start={space.start})"
    if isinstance(space, Box):
        return f"Box of shape {space.shape}"
    if isinstance(space, MultiDiscrete):
        shown = f"MultiDiscrete({space.nvec.tolist()}"
        return f"{shown}, start={space.start.tolist()})" if space.start.any() else f"{shown})"
    return type(space).__name__


def _policy_actions(info: PolicyInfo) -> str:
    kind = info.action_kind
    match kind:
        case "discrete":
            return f"Discrete({info.action_size})"
        case "multi_discrete":
            return f"MultiDiscrete({list(info.branches)})"
        case "continuous":
            return f"continuous of shape ({info.action_size},)"
        case _:
            assert_never(kind)
