"""Lockstep environments for any registered gymnasium id: the numpy CartPole where it applies,
the real environments otherwise."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import seals  # noqa: F401  (registers seals/* environments)
from gymnasium.spaces import flatten

from harness.envs.cartpole import ENV_ID as CARTPOLE_ID
from harness.envs.cartpole import IMPLS, VecCartPole
from harness.envs.protocol import LockstepEnv, Obs, Step
from harness.errors import UsageError

# Episodes of an environment registered without a time limit are cut here by the harness.
MAX_STEPS = 10_000


class GymEnvs:
    """`n_envs` environments, one `gymnasium.make` each (its own wrappers and time limit), stepped
    in a Python loop over the episodes still running.

    Not gymnasium's SyncVectorEnv: it steps every sub-environment on every call, so an ended
    episode is either reset into a new one (autoreset) or stepped past its end (autoreset
    disabled), and keeping its slot would mean unpicking that. Its step is the same Python loop
    over environments as this one, so the list costs no speed.
    """

    def __init__(self, env_id: str, n_envs: int) -> None:
        self.env_id = env_id
        self.n_envs = n_envs
        self.envs = [gym.make(env_id) for _ in range(n_envs)]
        first = self.envs[0]
        self.horizon = (first.spec.max_episode_steps if first.spec is not None else None) or MAX_STEPS
        self._discrete = isinstance(first.action_space, gym.spaces.Discrete)
        self._obs_space = first.observation_space
        self.obs = np.zeros((n_envs, gym.spaces.flatdim(self._obs_space)), dtype=np.float32)
        # Stepping needs a reset first: until then every slot counts as ended.
        self.terminated = np.zeros(n_envs, dtype=bool)
        self.truncated = np.ones(n_envs, dtype=bool)

    def reset(self, seeds: Sequence[int] | None = None) -> Obs:
        if seeds is not None and len(seeds) != self.n_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.n_envs} environments")
        per_env = [None] * self.n_envs if seeds is None else [int(s) for s in seeds]
        for i, (env, seed) in enumerate(zip(self.envs, per_env, strict=True)):
            self.obs[i] = self._flat(env.reset(seed=seed)[0])
        self.terminated[:], self.truncated[:] = False, False
        return (self.obs.copy(),)

    def step(self, actions: np.ndarray) -> Step:
        rewards = np.zeros(self.n_envs, dtype=np.float64)
        for i in np.flatnonzero(~(self.terminated | self.truncated)):
            action = int(actions[i]) if self._discrete else actions[i]
            obs, reward, self.terminated[i], self.truncated[i], _ = self.envs[i].step(action)
            self.obs[i] = self._flat(obs)
            rewards[i] = float(reward)
        return (self.obs.copy(),), rewards, self.terminated.copy(), self.truncated.copy()

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def _flat(self, obs: object) -> np.ndarray:
        return np.asarray(flatten(self._obs_space, obs))


def make_lockstep(env_id: str, n_envs: int, impl: str | None = None) -> LockstepEnv:
    """`n_envs` environments of `env_id`. `impl` None: the numpy copy where there is one (it is
    bit-identical and much faster), the real environments otherwise."""
    impl = impl or ("numpy" if env_id == CARTPOLE_ID else "gymnasium")
    if impl == "numpy":
        if env_id != CARTPOLE_ID:
            raise UsageError(f"--env-impl numpy: the numpy environment is {CARTPOLE_ID} only, not {env_id}; use gymnasium")
        return VecCartPole(n_envs)
    if impl == "gymnasium":
        return GymEnvs(env_id, n_envs)
    raise ValueError(f"unknown environment implementation {impl!r}; known: {', '.join(IMPLS)}")
