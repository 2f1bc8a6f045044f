"""The closed loop against the environment alone, side by side in one run.

A sweep's episodes as its actors play them (`run_episodes` at lockstep batching: the lockstep
environments, one batched forward per step, on a simulated card) beside the same environments
stepped with a constant action and no policy: the physical limit on this machine. CartPole is
`seals/CartPole-v0` on the numpy environment a sweep plays, with the project's own policy;
Pendulum is gymnasium's `Pendulum-v1`, one environment per episode, with an untrained SB3 PPO
MlpPolicy (64x64 tanh: its speed, not its return, is measured). Every episode runs to its horizon.

The environment and the policy's forward (`Stepper`, as a lockstep step calls it) are each timed
alone as well. A closed-loop step does both, plus the harness's own work (observations to the
card and actions back, clipping, the episodes' bookkeeping: 25-45 us a step at 1 environment, more at 128, timed by hand),
and both run slower interleaved than alone, each evicting the other from the caches. Target: the
environment and the forward alone add up to at least half a closed-loop step at every size.
Times are this process's CPU seconds (the machine is shared; waiting for a core is not the
harness's), the best of a few runs, torch on one thread as a sweep's actor runs it.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from benchmarks import Comparison
from harness.devices import cpu_reference
from harness.envs.cartpole import ENV_ID as CARTPOLE_ID
from harness.envs.lockstep import make_lockstep
from harness.inference.episodes import Stepper, run_episodes
from harness.policies import PolicySpec, load_policy
from harness.policies.base import PolicyNet

PENDULUM_ID = "Pendulum-v1"
SIZES = (1, 16, 128)
REPEATS = 3
TARGET = 0.5


@dataclass(frozen=True)
class Case:
    """One environment at one batch size: seconds per lockstep step of each side."""

    env: str
    n_envs: int
    bare_s: float
    forward_s: float
    loop_s: float

    @property
    def limit_ratio(self) -> float:
        """Closed-loop steps/s over the bare environment's."""
        return self.bare_s / self.loop_s

    @property
    def env_and_forward(self) -> float:
        """The share of a closed-loop step that the environment and the forward take."""
        return (self.bare_s + self.forward_s) / self.loop_s


def bare_step_s(env: str, n_envs: int, action: np.ndarray) -> float:
    """Seconds per step of `n_envs` environments made, reset to seeds 0 .. n_envs - 1 and stepped
    together with `action` until every episode ends, as `run_episodes` makes, resets and steps them."""
    start = time.process_time()
    envs = make_lockstep(env, n_envs)
    try:
        envs.reset(list(range(n_envs)))
        steps, running = 0, True
        while running and steps < envs.horizon:
            _, _, terminated, truncated = envs.step(action)
            steps, running = steps + 1, not (terminated | truncated).all()
    finally:
        envs.close()
    return (time.process_time() - start) / steps


def forward_s(policy: PolicyNet, env: str, n_envs: int, steps: int) -> float:
    """Seconds per forward over a batch of the environment's first observations, as a lockstep
    step makes one (`Stepper`), the actions back as an array."""
    envs = make_lockstep(env, n_envs)
    try:
        obs = tuple(torch.from_numpy(o) for o in envs.reset(list(range(n_envs))))
    finally:
        envs.close()
    stepper, starts = Stepper(policy, n_envs), np.zeros(n_envs, dtype=bool)
    start = time.process_time()
    for _ in range(steps):
        stepper(obs, None, starts, None).cpu().numpy()
    return (time.process_time() - start) / steps


def loop_step_s(policy: PolicyNet, env: str, n_envs: int) -> tuple[float, int]:
    """Seconds per lockstep step of a sweep's deterministic episodes of seeds 0 .. n_envs - 1, and the steps."""
    start = time.process_time()
    episodes = run_episodes(policy, cpu_reference(), env, list(range(n_envs)), False, "lockstep")
    steps = max(e.length for e in episodes)
    return (time.process_time() - start) / steps, steps


def measure(env: str, policy: PolicyNet, action: Callable[[int], np.ndarray], n_envs: int, repeats: int) -> Case:
    bare, forward, loop = [], [], []
    for _ in range(repeats):  # interleaved, so a burst of load on the machine hits every side alike
        seconds, steps = loop_step_s(policy, env, n_envs)
        loop.append(seconds)
        bare.append(bare_step_s(env, n_envs, action(n_envs)))
        forward.append(forward_s(policy, env, n_envs, steps))
    return Case(env, n_envs, min(bare), min(forward), min(loop))


def pendulum_policy(folder: str) -> PolicyNet:
    from stable_baselines3 import PPO

    path = f"{folder}/pendulum.zip"
    PPO("MlpPolicy", PENDULUM_ID, seed=0, device="cpu").save(path)
    return load_policy(PolicySpec(source=path, env_id=PENDULUM_ID, env_source="--env"))


def run(sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS) -> Comparison:
    torch.set_num_threads(1)
    cases = []
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as folder, torch.inference_mode():
        warnings.simplefilter("ignore")  # gymnasium's Box precision notes, once per environment
        played: dict[str, tuple[PolicyNet, Callable[[int], np.ndarray]]] = {
            CARTPOLE_ID: (load_policy("cartpole"), lambda n: np.zeros(n, dtype=np.int64)),
            PENDULUM_ID: (pendulum_policy(folder), lambda n: np.zeros((n, 1), dtype=np.float32)),
        }
        for env, (policy, action) in played.items():
            loop_step_s(policy, env, 1)  # the first forward and the environment's imports are not what this measures
            cases += [measure(env, policy, action, n, repeats) for n in sizes]
    measured = {
        f"{c.env}, {c.n_envs} envs": (
            f"closed loop {c.n_envs / c.loop_s:,.0f} steps/s, bare environment {c.n_envs / c.bare_s:,.0f}: "
            f"{c.limit_ratio:.2f} of the limit; per step env {c.bare_s * 1e6:,.0f} us + forward "
            f"{c.forward_s * 1e6:,.0f} us of {c.loop_s * 1e6:,.0f} us"
        )
        for c in cases
    }
    worst = min(cases, key=lambda c: c.env_and_forward)
    return Comparison(
        name="closed loop vs bare environment stepping (one card, lockstep, torch on 1 thread)",
        measured=measured,
        ratio=worst.env_and_forward,
        ratio_label=f"(environment + forward) / closed-loop step, the worst case ({worst.env}, {worst.n_envs} envs)",
        target=TARGET,
        limit=1.0,
        notes='"of the limit": closed-loop steps/s over the bare environment\'s, the physical limit on this machine',
    )
