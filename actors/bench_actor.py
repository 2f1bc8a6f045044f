"""BenchActor: one per card for `harness bench`. It times its own work, so no Ray round trip is
inside its clocks; inputs are moved to the card before any clock starts (device time). It holds
a plain runner: a bench injects no faults."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from actors.policy_actor import describe_runner
from harness.devices import Kind, open_card, ray_card_id, synchronize
from harness.envs.spec import EnvSpec
from harness.inference.forward import forward_outputs, to_device
from harness.inference.runner import Runner
from harness.inference.timing import (
    WARMUP_ITERATIONS,
    ClosedLoop,
    LatencyStats,
    Throughput,
    closed_loop,
    keep_freed_host_memory,
    measure_latency,
    run_for,
    timed_iterations,
)
from harness.outputs import Outputs
from harness.policies import PolicySpec


class BenchActor:
    def __init__(self, kind: Kind, position: int, policies: list[PolicySpec], threads: int, precision: str) -> None:
        self.runner = Runner(open_card(kind, ray_card_id(kind, position), precision), policies, threads)
        self.device = self.runner.device
        self.holds_host_memory = self.device.simulated and keep_freed_host_memory()
        self._sync = partial(synchronize, self.device)
        self._warm: set[tuple[str, str, tuple[tuple[int, ...], ...]]] = set()  # (policy, dtype, input shapes)

    def _decide(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Callable[[], object]:
        """One batched decision on inputs already on the card, as a body for the timers."""
        policy = self.runner.policy(key, dtype)
        obs_t = to_device(obs, self.device)
        noise_t = to_device((noise,), self.device)[0]
        return partial(forward_outputs, policy, obs_t, noise_t)

    def describe(self) -> dict[str, object]:
        return describe_runner(self.runner) | {"holds_host_memory": self.holds_host_memory}

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Outputs:
        """One round trip's worth of work, for the driver's end-to-end clock."""
        return self.runner.run_batch(key, dtype, obs, noise)

    def latency(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray, budget_s: float) -> LatencyStats:
        stats = measure_latency(self._decide(key, dtype, obs, noise), self._sync, budget_s)
        self._warm.add((key, dtype, tuple(a.shape for a in obs)))
        return stats

    def warm_up(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> None:
        """Compile and cache before a throughput window, so no card spends its window compiling.
        Shapes are compiled once per card: what a latency run already warmed is not run again."""
        warm_key = (key, dtype, tuple(a.shape for a in obs))
        if warm_key not in self._warm:
            timed_iterations(self._decide(key, dtype, obs, noise), self._sync, 1 + WARMUP_ITERATIONS)
            self._warm.add(warm_key)

    def throughput(
        self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray, start_at: float, duration_s: float
    ) -> Throughput:
        body = self._decide(key, dtype, obs, noise)
        calls, elapsed, cpu = run_for(body, self._sync, start_at, duration_s)
        return Throughput(calls, calls * len(obs[0]), elapsed, cpu)

    def closed_loop(
        self, key: str, dtype: str, env: EnvSpec, env_impl: str | None, n_envs: int, seed: int, duration_s: float
    ) -> ClosedLoop:
        return closed_loop(self.runner.policy(key, dtype), self.device, env, env_impl, n_envs, seed, duration_s)
