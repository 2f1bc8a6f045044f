"""What closed-loop episodes need from environments: many, reset and stepped together.

An episode that ends keeps its slot: its environment is never stepped again (nor reset into a
new episode), its last observation stays in the batch and its reward is 0 from then on, so the
policy's batch is the same shape from the first step to the last and a seed's trajectory
cannot depend on when the others ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from harness.envs.spec import EnvSpec

Obs = tuple[np.ndarray, ...]
"""Every environment's observation, one array per input of the policy (`PolicyInfo.inputs`, in
that order), each (n_envs, *shape) in the input's dtype: float32 vectors, uint8 images."""
Step = tuple[Obs, np.ndarray, np.ndarray, np.ndarray]  # obs, rewards, terminated, truncated


class LockstepEnv(Protocol):
    spec: EnvSpec  # the environment, as it is made for every slot
    n_envs: int
    horizon: int  # the most steps an episode takes: the time limit, or the harness's own cap

    def reset(self, seeds: Sequence[int] | None = None) -> Obs:
        """Every environment's first observation. `seeds` reseed each environment's generator,
        as `env.reset(seed=s)` does; None continues each one, as `env.reset()` does."""
        ...

    def step(self, actions: np.ndarray) -> Step:
        """Step every environment whose episode is running with its row of `actions`.

        obs as `reset` gives it, rewards float64 (n,), terminated and truncated bool (n,). An
        ended episode's row repeats its last observation with reward 0 and keeps the flags it
        ended with, so `terminated | truncated` says which episodes are over.
        """
        ...

    def restarted(self) -> np.ndarray:
        """bool (n,): the slots whose last step ended an episode inside the environment's own (a
        wrapper's, as AtariWrapper's lost life) and went on with the same game: SB3's VecEnv says
        done there, so a recurrent policy starts its state anew."""
        ...

    def action_masks(self) -> np.ndarray | None:
        """bool (n, actions): each slot's legal actions now, from its environment's
        `action_masks()` (sb3-contrib's convention); None where the environment gives none."""
        ...

    def close(self) -> None: ...
