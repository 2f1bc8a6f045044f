"""`seals/CartPole-v0` for many environments in lockstep: numpy arrays instead of a Python loop.

The reference is the real environment (`gymnasium.make("seals/CartPole-v0")`: gymnasium's
`CartPoleEnv.step`, then seals' angle wrap and reward, under a 500-step `TimeLimit`). This
copy must stay step-for-step bit-identical to it, which tests/test_envs_cartpole.py checks, so
the arithmetic below is written in exactly the reference's order of operations: float64 state,
the same constants computed the same way, the same expression trees. Reordering a sum or
folding constants changes the last bit and, over 500 steps, the trajectory.

It is a `LockstepEnv` (harness/envs/protocol.py): every environment is reset at once and
stepped at once, and since seals never terminates, all episodes end together at the horizon
and no slot ever needs masking.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from gymnasium.utils import seeding

from harness.envs.protocol import Obs, Step
from harness.envs.spec import EnvSpec

ENV_ID = "seals/CartPole-v0"
HORIZON = 500  # seals registers the environment with max_episode_steps=500

# gymnasium CartPoleEnv.__init__, computed as it computes them.
GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
RESET_LOW, RESET_HIGH = -0.05, 0.05


class VecCartPole:
    """Numpy `seals/CartPole-v0`. The state is kept as four contiguous float64 rows (x, x_dot,
    theta, theta_dot): numpy may pick other SIMD kernels for strided columns."""

    spec = EnvSpec(ENV_ID)
    horizon = HORIZON

    def __init__(self, n_envs: int) -> None:
        self.n_envs = n_envs
        self.state = np.zeros((4, n_envs), dtype=np.float64)
        self.rngs: list[np.random.Generator | None] = [None] * n_envs
        self.steps = HORIZON  # stepping needs a reset first

    def reset(self, seeds: Sequence[int] | None = None) -> Obs:
        if seeds is not None and len(seeds) != self.n_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.n_envs} environments")
        for i in range(self.n_envs):
            # gymnasium.Env.reset: a seed replaces the generator; no seed keeps (or lazily makes) it.
            if seeds is not None or self.rngs[i] is None:
                self.rngs[i] = seeding.np_random(None if seeds is None else int(seeds[i]))[0]
            rng = self.rngs[i]
            assert rng is not None
            self.state[:, i] = rng.uniform(low=RESET_LOW, high=RESET_HIGH, size=(4,))
        self.steps = 0
        return self._obs()

    def step(self, actions: np.ndarray) -> Step:
        if self.steps >= HORIZON:
            raise RuntimeError(f"{ENV_ID} ends after {HORIZON} steps; reset before stepping again")
        x, x_dot, theta, theta_dot = self.state
        force = np.where(np.asarray(actions) == 1, FORCE_MAG, -FORCE_MAG)
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + POLEMASS_LENGTH * np.square(theta_dot) * sintheta) / TOTAL_MASS
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            LENGTH * (4.0 / 3.0 - MASSPOLE * np.square(costheta) / TOTAL_MASS)
        )
        xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
        # Euler integration, each update from the previous step's values.
        x, x_dot, theta, theta_dot = (x + TAU * x_dot, x_dot + TAU * xacc, theta + TAU * theta_dot, theta_dot + TAU * thetaacc)
        # seals wraps the angle into [-pi, pi) on every step; not an identity in floating point.
        theta = (theta + np.pi) % (2 * np.pi) - np.pi
        self.state = np.stack([x, x_dot, theta, theta_dot])
        self.steps += 1
        rewards = ((np.abs(x) < X_THRESHOLD) & (np.abs(theta) < THETA_THRESHOLD)).astype(np.float64)
        never = np.zeros(self.n_envs, dtype=bool)
        return self._obs(), rewards, never, np.full(self.n_envs, self.steps >= HORIZON)

    def restarted(self) -> np.ndarray:
        """No wrapper ends an episode inside CartPole's."""
        return np.zeros(self.n_envs, dtype=bool)

    def action_masks(self) -> None:
        """CartPole leaves every action legal."""
        return None

    def close(self) -> None:
        """Nothing to release: arrays only."""

    def _obs(self) -> Obs:
        return (np.ascontiguousarray(self.state.T, dtype=np.float32),)
