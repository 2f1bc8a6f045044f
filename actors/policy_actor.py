"""PolicyActor: one per card. Runs the work it is sent and returns numpy; never judges."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import ray

from harness.devices import Kind, open_card, ray_card_id
from harness.envs.spec import EnvSpec
from harness.inference.fault_specs import Fault
from harness.inference.faults import inject, strike
from harness.inference.runner import Described, Runner
from harness.outputs import Busy, EpisodeOutput, Outputs, Produced
from harness.policies import PolicySpec

T = TypeVar("T")


class PolicyActor:
    def __init__(
        self,
        kind: Kind,
        position: int,
        policies: list[PolicySpec],
        threads: int,
        precision: str,
        faults: list[Fault],
        fault_marker: str,
    ) -> None:
        self.position = position
        self.faults = faults
        self.fault_marker = Path(fault_marker)
        card = open_card(kind, ray_card_id(kind, position), precision)
        self.runner = Runner(card, policies, threads, prepare=partial(inject, faults=faults))
        self.busy = BusyClock()

    def describe(self) -> Described:
        return replace(describe_runner(self.runner), position=self.position, faults=tuple(map(str, self.faults)))

    def progress(self) -> int:
        """Episode steps played so far: asked on a thread of its own (harness/cluster/clients.py,
        WATCH_GROUP) while a unit runs."""
        return self.runner.steps

    def busy_time(self) -> Busy:
        return self.busy.read()

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Produced[Outputs]:
        strike(self.faults, self.fault_marker)
        with self.busy():
            return produced(self.runner, self.runner.run_batch(key, dtype, obs, noise))

    def run_episodes(
        self, key: str, dtype: str, env: EnvSpec, seeds: list[int], stochastic: bool, batching: str
    ) -> Produced[list[EpisodeOutput]]:
        strike(self.faults, self.fault_marker)
        with self.busy():
            return produced(self.runner, self.runner.run_episodes(key, dtype, env, seeds, stochastic, batching))

    def capture(self, key: str, dtype: str, obs: tuple[np.ndarray, ...]) -> Produced[dict[str, np.ndarray]]:
        with self.busy():
            return produced(self.runner, self.runner.capture(key, dtype, obs))

    def export(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> bytes:
        with self.busy():
            return self.runner.export(key, dtype, obs, noise)


class BusyClock:
    """What an actor spent computing what it was sent (`Busy`), and the wall seconds per kind of
    work where a call names it. The actor whose clock reads highest is the one that sets a sweep's
    time (benchmarks/reference_pool.py)."""

    def __init__(self) -> None:
        self.wall_s = self.cpu_s = 0.0
        self.by_what: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, what: str = "") -> Iterator[None]:
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.wall_s += spent
            self.cpu_s += time.thread_time() - start_cpu
            if what:
                self.by_what[what] += spent

    def read(self) -> Busy:
        return Busy(self.wall_s, self.cpu_s)


def describe_runner(runner: Runner) -> Described:
    """What an actor reports about itself: its device, threads, the bytes it loaded, its node."""
    return runner.described(node_id())


def produced(runner: Runner, value: T) -> Produced[T]:
    """`value` with the device and node that computed it."""
    return Produced(runner.device.label, node_id(), value)


def node_id() -> str:
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
