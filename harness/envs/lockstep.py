"""Lockstep environments for any registered gymnasium id: the numpy CartPole where it applies,
the real environments otherwise, made and wrapped as the policy's files say (harness/envs/spec.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.envs import IMPLS
from harness.envs.cartpole import ENV_ID as CARTPOLE_ID
from harness.envs.cartpole import VecCartPole
from harness.envs.observations import Observations
from harness.envs.protocol import LockstepEnv, Obs, Step
from harness.envs.spec import EnvSpec, make_env
from harness.errors import UsageError

# Episodes of an environment registered without a time limit are cut here by the harness.
MAX_STEPS = 10_000
# The method an environment gives its legal actions by (sb3-contrib's convention, MaskablePPO's).
ACTION_MASKS = "action_masks"


class GymEnvs:
    """`n_envs` environments, one `make_env` each (its own wrappers and time limit), stepped
    in a Python loop over the episodes still running, their observations batched as SB3's VecEnv
    pipeline makes them (harness/envs/observations.py).

    Not gymnasium's SyncVectorEnv, nor SB3's DummyVecEnv: they step every sub-environment on every
    call, so an ended episode is either reset into a new one (autoreset) or stepped past its end,
    and keeping its slot would mean unpicking that. Their step is the same Python loop over
    environments as this one, so the list costs no speed.

    An episode is the environment's own (where SB3's Monitor counts one, as evaluate_policy and the
    RL Zoo report it), its return the environment's rewards: where a wrapper ends an episode inside
    it (AtariWrapper's EpisodicLifeEnv at a lost life), the slot is reset as SB3's VecEnv resets
    it, which goes on with the same game, and plays on.
    """

    def __init__(self, env: EnvSpec | str, n_envs: int) -> None:
        self.spec = EnvSpec.of(env)
        self.n_envs = n_envs
        made = [make_env(self.spec) for _ in range(n_envs)]
        self.envs = [wrapped for wrapped, _ in made]
        self.episodes = [recorder for _, recorder in made]
        base = self.episodes[0].spec
        self.horizon = (base.max_episode_steps if base is not None else None) or MAX_STEPS
        self.observations = Observations(self.envs[0].observation_space, n_envs, self.spec.setup.frame_stack)
        self._raw: list[Any] = [None] * n_envs  # each slot's last observation, as its wrappers give it
        self._obs: Obs = ()
        # Stepping needs a reset first: until then every slot counts as ended.
        self.terminated = np.zeros(n_envs, dtype=bool)
        self.truncated = np.ones(n_envs, dtype=bool)
        self._restarted = np.zeros(n_envs, dtype=bool)
        self._masked = self.envs[0].has_wrapper_attr(ACTION_MASKS)

    def reset(self, seeds: Sequence[int] | None = None) -> Obs:
        if seeds is not None and len(seeds) != self.n_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.n_envs} environments")
        per_env = [None] * self.n_envs if seeds is None else [int(s) for s in seeds]
        for i, (env, seed) in enumerate(zip(self.envs, per_env, strict=True)):
            self._raw[i] = env.reset(seed=seed)[0]
        self._obs = self.observations.reset(self._raw)
        self.terminated[:], self.truncated[:], self._restarted[:] = False, False, False
        return tuple(o.copy() for o in self._obs)

    def step(self, actions: np.ndarray) -> Step:
        ended = self.terminated | self.truncated
        rewards = np.zeros(self.n_envs, dtype=np.float64)
        restarted = np.zeros(self.n_envs, dtype=bool)
        terminal: list[Any] = [None] * self.n_envs
        for i in np.flatnonzero(~ended):
            env, episode = self.envs[i], self.episodes[i]
            # Each row as SB3's DummyVecEnv passes it: a numpy scalar or array, never a Python int.
            obs, _, terminated, truncated, _ = env.step(actions[i])
            rewards[i] = episode.take_reward()
            if (terminated or truncated) and not episode.over:
                resets = episode.resets
                obs_after = env.reset()[0]
                if episode.resets == resets:  # the same game goes on: no episode of the environment began
                    terminal[i], obs, restarted[i] = obs, obs_after, True
                    rewards[i] += episode.take_reward()
                    terminated = truncated = False
            self._raw[i] = obs
            self.terminated[i] = terminated
            # An environment whose own episode is over ends the slot, whatever its wrappers say.
            self.truncated[i] = truncated or (episode.over and not terminated)
        self._restarted = restarted
        stepped = self.observations.step(self._raw, restarted, terminal)
        # An ended episode keeps its last observation, whatever the frame stack made of its row.
        self._obs = tuple(
            np.where(ended.reshape(-1, *[1] * (new.ndim - 1)), old, new) for old, new in zip(self._obs, stepped, strict=True)
        )
        return tuple(o.copy() for o in self._obs), rewards, self.terminated.copy(), self.truncated.copy()

    def restarted(self) -> np.ndarray:
        return self._restarted.copy()

    def action_masks(self) -> np.ndarray | None:
        if not self._masked:
            return None
        return np.stack([np.asarray(env.get_wrapper_attr(ACTION_MASKS)(), dtype=bool) for env in self.envs])

    def close(self) -> None:
        for env in self.envs:
            env.close()


def make_lockstep(env: EnvSpec | str, n_envs: int, impl: str | None = None) -> LockstepEnv:
    """`n_envs` environments of `env`. `impl` None: the numpy copy where there is one (it is
    bit-identical and much faster), the real environments otherwise."""
    spec = EnvSpec.of(env)
    numpy_applies = spec.env_id == CARTPOLE_ID and spec.setup.plain
    impl = impl or ("numpy" if numpy_applies else "gymnasium")
    if impl == "numpy":
        if not numpy_applies:
            raise UsageError(f"--env-impl numpy: the numpy environment is {CARTPOLE_ID} only, not {spec.key}; use gymnasium")
        return VecCartPole(n_envs)
    if impl == "gymnasium":
        return GymEnvs(spec, n_envs)
    raise ValueError(f"unknown environment implementation {impl!r}; known: {', '.join(IMPLS)}")
