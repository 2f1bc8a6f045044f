"""Wrappers that make an environment compute what an older version of it computed, where no
keyword argument of the new version does.

Such a wrapper is part of the environment, not of the agent's setup around it: the harness puts
it under the EpisodeRecorder (harness/envs/spec.py), so that the rewards recorded are the old
version's. A rename (harness/envs/renames.py) names it in the setup it gives, and the setup's
description, the unit ids and `env_source` say so.

mujoco-py 2.x, on which most MuJoCo -v2 and -v3 agents were trained, never computed the contact
forces (`cfrc_ext`): MuJoCo 2.0 computes them only for a model with a force sensor, and mujoco-py
did not ask (openai/gym#1541). They were zero in every observation and in every cost made of
them. gymnasium's -v4 environments ask (`mj_rnePostConstraint` after each step), and their
Humanoid and HumanoidStandup observe them with no argument to leave them out.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from numpy.typing import NDArray


class EnvironmentVersion(gym.Wrapper[Any, Any, Any, Any]):
    """A wrapper that is part of the environment: made under the EpisodeRecorder."""


class MujocoPy2Contacts(EnvironmentVersion):
    """A gymnasium -v4 MuJoCo environment whose observation ends with `data.cfrc_ext` (Humanoid,
    HumanoidStandup), as mujoco-py 2.x gave it: those entries zero, and the reward without the
    cost made of them.

    `contact_reward` names the `info` entry where the environment puts its reward's contact term
    (minus the cost, HumanoidStandup-v4's "reward_impact"); the reward is given without it and the
    entry reads 0.0. Empty where the reward has no such term (Humanoid-v4 dropped v3's contact
    cost, which mujoco-py 2.x made zero: its reward is already the old one).
    """

    def __init__(self, env: gym.Env[Any, Any], contact_reward: str = "") -> None:
        super().__init__(env)
        self.contact_reward = contact_reward
        # cfrc_ext is the observation's last block in gymnasium's v4 Humanoid and HumanoidStandup
        # (the world body's six included, as gym's v3 had them).
        self.contacts = int(np.asarray(env.unwrapped.data.cfrc_ext).size)  # type: ignore[attr-defined]
        shape = env.observation_space.shape
        if shape is None or len(shape) != 1 or shape[0] < self.contacts:
            raise ValueError(f"observations of shape {shape} do not end with {self.contacts} contact forces")

    def reset(self, **kwargs: Any) -> tuple[NDArray[np.float64], dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._zeroed(obs), info

    def step(self, action: Any) -> tuple[NDArray[np.float64], SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.contact_reward:
            reward = float(reward) - float(info[self.contact_reward])
            info = {**info, self.contact_reward: 0.0}
        return self._zeroed(obs), reward, terminated, truncated, info

    def _zeroed(self, obs: NDArray[np.float64]) -> NDArray[np.float64]:
        obs = np.array(obs, copy=True)
        obs[-self.contacts :] = 0.0
        return obs
