"""The driver's typed clients of the actors: one method per actor method, with its signature,
that sends the call across Ray and returns the call's ObjectRef (typed by what `ray.get` gives
back). Ray's handles are untyped here (pyproject.toml), so a `.remote(...)` is checked by mypy
only when it goes through a client; every call from the driver does."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import ray
from ray import ObjectRef

from harness.cluster.keeper import WarmCards
from harness.envs.spec import EnvSpec
from harness.inference.fault_specs import Fault
from harness.inference.runner import Described
from harness.inference.timing import ClosedLoop, LatencyRun, Throughput
from harness.outputs import Busy, EpisodeOutput, Outputs, Produced
from harness.policies import PolicySpec


# The concurrency group a sweep's actor answers `progress` in: a thread of its own, so the question
# is answered while a unit runs on the default group's one thread, which keeps the units in order.
WATCH_GROUP = "watch"


@dataclass(frozen=True)
class ActorClient:
    """An actor's handle, for what the driver asks of every actor (its description) and what it
    does to one (kill it, ask Ray its state)."""

    handle: ray.actor.ActorHandle

    def describe(self) -> ObjectRef[Described]:
        return self.handle.describe.remote()


class SweepClient(ActorClient):
    """A sweep's actor, card or reference, which the driver watches while it works."""

    def progress(self) -> ObjectRef[int]:
        """Episode steps it played so far: answered on a thread of its own while a unit runs."""
        return self.handle.progress.options(concurrency_group=WATCH_GROUP).remote()

    def busy_time(self) -> ObjectRef[Busy]:
        """What it spent computing what it was sent: answered after the work sent before it."""
        return self.handle.busy_time.remote()


class PolicyClient(SweepClient):
    """A sweep's card (actors/policy_actor.py)."""

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> ObjectRef[Produced[Outputs]]:
        return self.handle.run_batch.remote(key, dtype, obs, noise)

    def run_episodes(
        self, key: str, dtype: str, env: EnvSpec, seeds: list[int], stochastic: bool, batching: str
    ) -> ObjectRef[Produced[list[EpisodeOutput]]]:
        return self.handle.run_episodes.remote(key, dtype, env, seeds, stochastic, batching)

    def capture(self, key: str, dtype: str, obs: tuple[np.ndarray, ...]) -> ObjectRef[Produced[dict[str, np.ndarray]]]:
        return self.handle.capture.remote(key, dtype, obs)

    def export(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> ObjectRef[bytes]:
        return self.handle.export.remote(key, dtype, obs, noise)


class ReferenceClient(SweepClient):
    """A sweep's CPU reference (actors/reference_actor.py)."""

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> ObjectRef[Produced[Outputs]]:
        return self.handle.run_batch.remote(key, dtype, obs, noise)

    def run_episodes(
        self, key: str, dtype: str, env: EnvSpec, seeds: list[int], stochastic: bool, batching: str, honest: bool
    ) -> ObjectRef[Produced[list[EpisodeOutput]]]:
        return self.handle.run_episodes.remote(key, dtype, env, seeds, stochastic, batching, honest)

    def capture(self, key: str, dtype: str, obs: tuple[np.ndarray, ...]) -> ObjectRef[Produced[dict[str, np.ndarray]]]:
        return self.handle.capture.remote(key, dtype, obs)

    def compute_seconds(self) -> ObjectRef[dict[str, float]]:
        return self.handle.compute_seconds.remote()

    def run_onnx(self, key: str, obs: tuple[np.ndarray, ...]) -> ObjectRef[Produced[Outputs]]:
        return self.handle.run_onnx.remote(key, obs)


class BenchClient(ActorClient):
    """A bench's card (actors/bench_actor.py)."""

    def sweep_path(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> ObjectRef[Outputs]:
        return self.handle.sweep_path.remote(key, dtype, obs, noise)

    def latency(
        self,
        key: str,
        dtype: str,
        obs: tuple[np.ndarray, ...],
        noise: np.ndarray,
        windows: int,
        window_s: float,
        min_iterations: int,
    ) -> ObjectRef[LatencyRun[Outputs]]:
        return self.handle.latency.remote(key, dtype, obs, noise, windows, window_s, min_iterations)

    def warm_up(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> ObjectRef[float]:
        return self.handle.warm_up.remote(key, dtype, obs, noise)

    def throughput(
        self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray, schedule: list[tuple[float, float]]
    ) -> ObjectRef[tuple[list[Throughput], Outputs]]:
        return self.handle.throughput.remote(key, dtype, obs, noise, schedule)

    def closed_loop(
        self, key: str, dtype: str, env: EnvSpec, env_impl: str | None, n_envs: int, seed: int, window_s: float, windows: int
    ) -> ObjectRef[list[ClosedLoop]]:
        return self.handle.closed_loop.remote(key, dtype, env, env_impl, n_envs, seed, window_s, windows)


class WarmCardClient(PolicyClient):
    """A warm card of `harness up` (actors/warm.py), which a sweep sets up for itself before it
    sends it work; a bench sets it up with `begin_bench` and sends it work through a BenchClient
    of the same handle."""

    def ready(self) -> ObjectRef[str]:
        return self.handle.ready.remote()

    def begin(
        self, run_id: str, policies: list[PolicySpec], threads: int, precision: str, faults: list[Fault], fault_marker: str
    ) -> ObjectRef[Described]:
        return self.handle.begin.remote(run_id, policies, threads, precision, faults, fault_marker)

    def begin_bench(
        self, run_id: str, policies: list[PolicySpec], threads: int, precision: str, faults: list[Fault]
    ) -> ObjectRef[Described]:
        return self.handle.begin_bench.remote(run_id, policies, threads, precision, faults)


class WarmReferenceClient(ReferenceClient):
    """The warm CPU reference of `harness up` (actors/warm.py)."""

    def ready(self) -> ObjectRef[str]:
        return self.handle.ready.remote()

    def begin(self, run_id: str, policies: list[PolicySpec], threads: int) -> ObjectRef[Described]:
        return self.handle.begin.remote(run_id, policies, threads)


@dataclass(frozen=True)
class KeeperClient:
    """The keeper of the warm cards (harness/cluster/keeper.py)."""

    handle: ray.actor.ActorHandle

    def info(self) -> ObjectRef[WarmCards]:
        return self.handle.info.remote()

    def lease(self, run_id: str, job_id: str) -> ObjectRef[str | None]:
        return self.handle.lease.remote(run_id, job_id)

    def idle_s(self) -> ObjectRef[float | None]:
        return self.handle.idle_s.remote()

    def stop(self) -> ObjectRef[None]:
        return self.handle.stop.remote()
