"""BenchActor: one per card for `harness bench`. It times its own work, so no Ray round trip is
inside its clocks; inputs are moved to the card before any clock starts (device time).

Two paths compute a decision here: the timed path (`_decide`: the policy called on inputs
already on the card, what the windows time) and `sweep_path`, the sweep's own path (numpy in,
numpy out: what the end-to-end and server requests call). The bench audits the first against
the second, bit for bit. An injected fault goes into the timed path's copy of the policy only,
so that the audit has something to find.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np
import torch

from actors.policy_actor import describe_runner
from harness.devices import Kind, open_card, ray_card_id, synchronize
from harness.envs.spec import EnvSpec
from harness.inference.fault_specs import Fault
from harness.inference.faults import inject
from harness.inference.forward import forward_outputs, outputs_to_numpy, to_device
from harness.inference.runner import Described, Runner
from harness.inference.timing import (
    WARMUP_S,
    ClosedLoop,
    LatencyRun,
    Throughput,
    closed_loop,
    keep_freed_host_memory,
    measure_latency,
    run_for,
    timed_iterations,
    warm_up,
)
from harness.outputs import Outputs
from harness.policies import PolicySpec

Shapes = tuple[tuple[int, ...], ...]


class BenchActor:
    def __init__(
        self, kind: Kind, position: int, policies: list[PolicySpec], threads: int, precision: str, faults: list[Fault]
    ) -> None:
        self.runner = Runner(open_card(kind, ray_card_id(kind, position), precision), policies, threads)
        self.device = self.runner.device
        self.faults = faults
        self.timed = Runner(self.device, policies, threads, prepare=partial(inject, faults=faults)) if faults else self.runner
        self.holds_host_memory = self.device.simulated and keep_freed_host_memory()
        self._sync = partial(synchronize, self.device)
        self._warm: set[tuple[str, str, Shapes]] = set()  # (policy, dtype, input shapes) compiled on this card

    def _decide(
        self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray
    ) -> Callable[[], dict[str, torch.Tensor]]:
        """One batched decision on inputs already on the card, as a body for the timers."""
        policy = self.timed.policy(key, dtype)
        obs_t = to_device(obs, self.device)
        noise_t = to_device((noise,), self.device)[0]
        return partial(forward_outputs, policy, obs_t, noise_t)

    def _first_time(self, key: str, dtype: str, obs: tuple[np.ndarray, ...]) -> bool:
        """True the first time this card sees the shape (its first call compiles on NPUs)."""
        warm_key = (key, dtype, tuple(a.shape for a in obs))
        first = warm_key not in self._warm
        self._warm.add(warm_key)
        return first

    def describe(self) -> Described:
        faults = tuple(f"{f} (timed path only)" for f in self.faults)
        return replace(describe_runner(self.runner), holds_host_memory=self.holds_host_memory, faults=faults)

    def sweep_path(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Outputs:
        """The sweep's path, one round trip's worth of work: for the driver's end-to-end clock,
        the server scenario's requests, and the audit's reference."""
        return self.runner.run_batch(key, dtype, obs, noise)

    def latency(
        self,
        key: str,
        dtype: str,
        obs: tuple[np.ndarray, ...],
        noise: np.ndarray,
        windows: int,
        window_s: float,
        min_iterations: int,
    ) -> LatencyRun[Outputs]:
        """Device time: the first call alone (the first time only), then `windows` windows; the
        last call's outputs come back as numpy for the audit."""
        body = self._decide(key, dtype, obs, noise)
        run = measure_latency(body, self._sync, windows, window_s, min_iterations, self._first_time(key, dtype, obs))
        return LatencyRun(run.first_call_ms, run.windows, outputs_to_numpy(run.last))

    def warm_up(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> float:
        """Compile (the first time) and warm up before throughput windows, so no card spends its
        window compiling; the mean call in milliseconds, to size the windows."""
        body = self._decide(key, dtype, obs, noise)
        if self._first_time(key, dtype, obs):
            timed_iterations(body, self._sync, 1)
            return warm_up(body, self._sync, WARMUP_S)
        return warm_up(body, self._sync, 0.0)

    def throughput(
        self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray, schedule: list[tuple[float, float]]
    ) -> tuple[list[Throughput], Outputs]:
        """A window per (wall-clock start, seconds) of `schedule`, in order; the outputs of the
        last call of the last window, for the audit."""
        body = self._decide(key, dtype, obs, noise)
        windows = []
        for start_at, seconds in schedule:
            calls, elapsed, cpu, last = run_for(body, self._sync, start_at, seconds)
            windows.append(Throughput(calls, calls * len(obs[0]), elapsed, cpu))
        return windows, outputs_to_numpy(last)

    def closed_loop(
        self, key: str, dtype: str, env: EnvSpec, env_impl: str | None, n_envs: int, seed: int, window_s: float, windows: int
    ) -> list[ClosedLoop]:
        """`windows` windows of the same seeded episodes, so that windows differ in their timing
        only; the episodes themselves come back once, with the first."""
        policy = self.runner.policy(key, dtype)
        runs = [closed_loop(policy, self.device, env, env_impl, n_envs, seed, window_s) for _ in range(windows)]
        return [runs[0], *(replace(r, first_round=()) for r in runs[1:])]
