"""Timing loops for `harness bench`, run inside a card's actor so no Ray round trip is inside
their clocks. The driver times end-to-end calls with the same `measure_latency`, and the
benchmarks measure the loop's own overhead with an empty body."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch

from harness.devices import Device
from harness.envs.lockstep import make_lockstep
from harness.envs.registry import check_env
from harness.envs.spec import EnvSpec
from harness.inference.episodes import choose_actions, play
from harness.outputs import EpisodeOutput
from harness.policies.base import PolicyNet

# Warm-up before the first window: at least this many calls and this long (trtexec's 200 ms).
WARMUP_ITERATIONS = 5
WARMUP_S = 0.2
# A window stops at this many calls however short they are: it bounds the samples a window
# keeps of a very fast body.
MAX_ITERATIONS = 20_000
# glibc mallopt parameters (malloc.h) and the largest mmap threshold it accepts on 64-bit.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024

T = TypeVar("T")


@dataclass(frozen=True)
class LatencyWindow:
    """One window of back-to-back timed calls."""

    times_ms: np.ndarray  # float64 (calls,): each call, synchronized before and after
    elapsed_s: float
    cpu_s: float  # CPU time of the timing process in the window

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.elapsed_s


@dataclass(frozen=True)
class LatencyRun(Generic[T]):
    first_call_ms: float | None  # the first call alone (operator compile on NPUs), never in a window; None once warm
    windows: tuple[LatencyWindow, ...]
    last: T  # what the last timed call returned: the bench's audit compares it


@dataclass(frozen=True)
class Throughput:
    """One card's share of a throughput window."""

    calls: int
    decisions: int
    elapsed_s: float
    cpu_s: float  # CPU time of this card's process in the window

    @property
    def decisions_per_s(self) -> float:
        return self.decisions / self.elapsed_s

    @property
    def cpu_share(self) -> float:
        """Below 1 on simulated cards with one thread: something else took the core (contention)."""
        return self.cpu_s / self.elapsed_s


@dataclass(frozen=True)
class ClosedLoop:
    decisions: int  # actions the episodes took; an ended episode's masked rows are not decisions
    steps: int  # batched forwards, each followed by an environment step: a round takes its longest episode's length
    elapsed_s: float
    cpu_s: float  # CPU time of the card's process while the episodes ran
    seeds: np.ndarray  # int64 (episodes,): episode i was reset with seeds[i]
    returns: np.ndarray  # float64 (episodes,)
    first_round: tuple[EpisodeOutput, ...]  # to prove two runs (or a run and a sweep) took the same episodes

    @property
    def decisions_per_s(self) -> float:
        return self.decisions / self.elapsed_s

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.elapsed_s


def keep_freed_host_memory() -> bool:
    """Make glibc keep freed blocks up to 32 MiB in the heap instead of returning them to the OS.

    By default a forward at batch 65536 frees its 16 MiB activations back to the OS, and the
    next forward pays page faults to zero them again: the same card runs at about half speed
    or full speed depending on the process's allocation history, which makes one simulated
    card's throughput bimodal and scaling ratios noise. Real cards cache device memory in their
    allocators; this gives the CPU stand-in the same habit. Outputs are unchanged. False where
    the C library is not glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))


def timed_iterations(body: Callable[[], object], sync: Callable[[], None], iterations: int) -> np.ndarray:
    """Milliseconds of each call of `body`, synchronized before and after so that the timer
    sees the work itself and not its launch or a previous call's tail."""
    elapsed_ns: list[int] = []
    record, clock = elapsed_ns.append, time.perf_counter_ns  # bound once: the loop is the overhead
    for _ in range(iterations):
        sync()
        start = clock()
        body()
        sync()
        record(clock() - start)
    return np.asarray(elapsed_ns, dtype=np.int64) / 1e6


def warm_up(body: Callable[[], object], sync: Callable[[], None], seconds: float) -> float:
    """Call `body` at least WARMUP_ITERATIONS times and for at least `seconds`; the mean call
    in milliseconds, so that windows can be sized to hold their minimum of calls."""
    times = timed_iterations(body, sync, WARMUP_ITERATIONS)
    spent_ms = float(times.sum())
    while spent_ms < seconds * 1e3:
        more = timed_iterations(body, sync, WARMUP_ITERATIONS)
        times, spent_ms = np.concatenate([times, more]), spent_ms + float(more.sum())
    return float(times.mean())


def latency_window(
    body: Callable[[], T], sync: Callable[[], None], seconds: float, min_iterations: int
) -> tuple[LatencyWindow, T]:
    """Timed calls back to back until the window has lasted `seconds` and held `min_iterations`
    calls (trtexec's rule: a duration and a count, both met), at most MAX_ITERATIONS; with what
    the last call returned."""
    elapsed_ns: list[int] = []
    record, clock = elapsed_ns.append, time.perf_counter_ns
    cpu_start, start = time.process_time(), clock()
    deadline = start + int(seconds * 1e9)
    while True:
        sync()
        begin = clock()
        last = body()
        sync()
        end = clock()
        record(end - begin)
        if len(elapsed_ns) >= MAX_ITERATIONS or (end >= deadline and len(elapsed_ns) >= min_iterations):
            break
    cpu = time.process_time() - cpu_start
    return LatencyWindow(np.asarray(elapsed_ns, dtype=np.int64) / 1e6, (end - start) / 1e9, cpu), last


def measure_latency(
    body: Callable[[], T],
    sync: Callable[[], None],
    windows: int,
    window_s: float,
    min_iterations: int,
    first_call: bool = True,
) -> LatencyRun[T]:
    """The first call alone and a warm-up (unless `first_call` is False: the body is warm
    already), then `windows` (at least 1) windows."""
    first_ms = None
    if first_call:
        first_ms = float(timed_iterations(body, sync, 1)[0])
        warm_up(body, sync, min(WARMUP_S, window_s))
    timed = [latency_window(body, sync, window_s, min_iterations) for _ in range(windows)]
    return LatencyRun(first_ms, tuple(w for w, _ in timed), timed[-1][1])


def run_for(
    body: Callable[[], T], sync: Callable[[], None], start_at: float, duration_s: float
) -> tuple[int, float, float, T]:
    """Call `body` back to back (at least once) for `duration_s` from wall-clock `start_at`:
    (calls, seconds, CPU seconds of this process, what the last call returned).

    Actors that share `start_at` run their windows at the same time, so their sum is a rate
    the cards reach together, not one after another."""
    time.sleep(max(0.0, start_at - time.time()))
    sync()
    start, cpu_start = time.perf_counter(), time.process_time()
    deadline = start + duration_s
    last, calls = body(), 1
    while time.perf_counter() < deadline:
        last = body()
        calls += 1
    sync()  # queued work belongs to the window
    return calls, time.perf_counter() - start, time.process_time() - cpu_start, last


@torch.inference_mode()
def closed_loop(
    policy: PolicyNet, device: Device, env: EnvSpec | str, env_impl: str | None, n_envs: int, seed: int, duration_s: float
) -> ClosedLoop:
    """Rounds of `n_envs` seeded deterministic episodes in lockstep, one batched forward per
    step, until `duration_s` has passed (at least one round): the sweep's `run_episodes` at
    lockstep batching, timed. Round r, env i is reset with seed `seed + r * n_envs + i`, so the
    episodes are the same whatever the batch size."""
    check_env(env, policy.info)
    envs = make_lockstep(env, n_envs, env_impl)
    try:
        warm = tuple(torch.from_numpy(i.zeros(n_envs)).to(device.torch_device) for i in policy.info.inputs)
        choose_actions(policy, warm, None).cpu()  # the first call is not what this measures
        first_round: list[EpisodeOutput] = []
        returns: list[float] = []
        decisions = steps = rounds = 0
        start, cpu_start = time.perf_counter(), time.process_time()
        while rounds == 0 or time.perf_counter() - start < duration_s:
            first = seed + rounds * n_envs
            episodes = play(policy, device, envs, range(first, first + n_envs), stochastic=False, batching="lockstep")
            first_round = first_round or episodes
            returns += [e.episode_return for e in episodes]
            decisions += sum(e.length for e in episodes)
            steps += max(e.length for e in episodes)
            rounds += 1
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        envs.close()
    seeds = np.arange(seed, seed + rounds * n_envs, dtype=np.int64)
    return ClosedLoop(decisions, steps, elapsed, cpu, seeds, np.asarray(returns, dtype=np.float64), tuple(first_round))
