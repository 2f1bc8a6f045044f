"""The latency mode: each card alone, one after another, calls back to back; device time inside
the actor, then end to end through Ray. The p50 is the median of the kept windows' own p50s, with
its interval; p95, p99 and the mean pool the calls of the kept windows."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, partial

import numpy as np
import ray

from harness.inference.timing import LatencyWindow, measure_latency
from harness.judge.bench_stats import Interval, latency_percentiles, quantile_interval, too_few_for_percentile, window_p50s
from harness.outputs import Outputs
from harness.benches.modes import Bench, Mode
from harness.benches.rows import BenchResult, Figures, Measurement, RowKey, Sampled, Summary, judged, sample_columns
from harness.benches.rules import Rule
from harness.benches.windows import (
    Tally,
    WindowRuns,
    Windows,
    median_of_windows,
    repeat_windows,
    starved_window,
    window_rules,
)
from harness.benches.work import Work
from harness.cluster.place import BenchCard

DEVICE, END_TO_END = "device", "end_to_end"


@dataclass(frozen=True)
class Latency(WindowRuns[LatencyWindow]):
    """One card's latency windows of one batch: device time (`timing` "device") or round trips
    through Ray ("end_to_end")."""

    work: Work
    device: str
    timing: str
    first_call_ms: float | None
    audited: tuple[Sampled, ...] = ()

    @cached_property
    def pooled(self) -> np.ndarray:
        return np.concatenate([t.times_ms for t in self.used])

    @cached_property
    def p50s(self) -> list[float]:
        return window_p50s([t.times_ms for t in self.used])

    @cached_property
    def percentiles(self) -> tuple[float, float, float]:
        return latency_percentiles(self.p50s, self.pooled)

    @cached_property
    def interval(self) -> Interval | None:
        return median_of_windows(self.p50s, self.windows)[1]

    @property
    def p99_ms(self) -> float:
        return self.percentiles[2]

    @property
    def mean_ms(self) -> float:
        return float(self.pooled.mean())

    @property
    def tally(self) -> Tally:
        return Tally(self.windows, self.bad.count(False), len(self.timed), [len(t.times_ms) for t in self.used])

    def summary(self) -> Summary:
        w, device_timed = self.work, self.timing == DEVICE
        p50, p95, p99 = self.percentiles
        p99_interval = quantile_interval(self.pooled, 0.99)
        detail: dict[str, object] = {
            "input_sha256": w.batch.sha256,
            "window_s": self.windows.seconds,
            "iterations": [len(t.times_ms) for t in self.used],
            "windows_measured": len(self.timed),
            "p99_interval_ms": [p99_interval.low, p99_interval.high] if p99_interval else None,
        }
        if not device_timed:
            detail["first_call"] = "after the device row's warm-up: first round trip of this batch"
        row_id = f"latency/{self.timing}/{w.policy}/{w.dtype}/b{w.batch.size}/{self.device}"
        figures = Figures(
            first_call_ms=self.first_call_ms,
            p50_ms=p50,
            p95_ms=p95,
            p99_ms=p99,
            mean_ms=self.mean_ms,
            decisions_per_s=w.batch.size / (self.mean_ms / 1e3),
            windows=len(self.used),
            cpu_share=statistics.median(t.cpu_share for t in self.used) if device_timed else None,
        )
        key = RowKey(row_id, w.policy, w.dtype, w.batch.size, "latency", self.timing, self.device)
        return Summary(key, figures, "p50_ms", self.interval, detail)

    def samples(self, row_id: str) -> dict[str, np.ndarray]:
        counts = [len(t.times_ms) for t in self.timed]
        device_timed = self.timing == DEVICE
        return sample_columns(
            row_id,
            window_index=np.repeat(np.arange(len(self.timed)), counts).tolist(),
            device=[self.device] * sum(counts),
            kept=np.repeat(self.kept, counts).tolist(),
            latency_ms=np.concatenate([t.times_ms for t in self.timed]),
            cpu_share=np.repeat([t.cpu_share if device_timed else None for t in self.timed], counts).tolist(),
            sample=np.concatenate([np.arange(c) for c in counts]),
        )

    def sampled(self) -> list[Sampled]:
        return list(self.audited)


RULES: tuple[Rule[Latency], ...] = (
    *window_rules(lambda m: m.tally),
    Rule("enough calls for a p99", lambda m: too_few_for_percentile(len(m.pooled), 0.99)),
    Rule("windows agree", lambda m: m.windows.disagree(m.percentiles[0], m.interval, "p50")),
)


def latency_measurement(
    w: Work,
    device: str,
    timing: str,
    first_call_ms: float | None,
    timed: list[LatencyWindow],
    bad: list[bool],
    windows: Windows,
) -> BenchResult:
    """The row of latency windows measured elsewhere."""
    return judged(Latency(timed, bad, windows, work=w, device=device, timing=timing, first_call_ms=first_call_ms), RULES)


def measure(bench: Bench, _: Sequence[Measurement]) -> list[Latency]:
    """Each card alone, one after another: device time, then end to end through Ray."""
    measured = []
    for w in bench.work:
        for card in bench.cards:
            measured += [_device_latency(card, w, bench.windows), _end_to_end_latency(card, w, bench.windows)]
            bench.bar.update(1)
    return measured


def unloaded(earlier: Sequence[Measurement], card: BenchCard) -> dict[tuple[str, str, int], Latency]:
    """`card`'s end-to-end latency of each batch: the round trip of a request with nothing else
    in flight."""
    return {m.work.key: m for m in earlier if isinstance(m, Latency) and m.timing == END_TO_END and m.device == card.label}


def _device_latency(card: BenchCard, w: Work, windows: Windows) -> Latency:
    runs = []

    def measure(n: int) -> list[LatencyWindow]:
        runs.append(
            ray.get(
                card.actor.latency(w.policy, w.dtype, w.batch.obs, w.batch.noise, n, windows.seconds, windows.min_iterations)
            )
        )
        return list(runs[-1].windows)

    starved = partial(starved_window, card)
    timed = repeat_windows(measure, starved, windows.count)
    bad = [starved(t) for t in timed]
    return Latency(
        timed,
        bad,
        windows,
        work=w,
        device=card.label,
        timing=DEVICE,
        first_call_ms=runs[0].first_call_ms,
        audited=(Sampled(card, w, runs[-1].last),),
    )


def _end_to_end_latency(card: BenchCard, w: Work, windows: Windows) -> Latency:
    # The device row warmed this batch up: the first round trip is Ray's first, not the card's.
    run = measure_latency(partial(_round_trip, card, w), _no_sync, windows.count, windows.seconds, windows.min_iterations)
    return Latency(
        list(run.windows),
        [False] * windows.count,
        windows,
        work=w,
        device=card.label,
        timing=END_TO_END,
        first_call_ms=run.first_call_ms,
    )


def _round_trip(card: BenchCard, w: Work) -> Outputs:
    # The batch goes through Ray on every call: shipping it is part of the end-to-end time.
    outputs: Outputs = ray.get(card.actor.sweep_path(w.policy, w.dtype, w.batch.obs, w.batch.noise))
    return outputs


def _no_sync() -> None:
    """ray.get returns numpy already copied off the card: nothing is left queued to wait for."""


MODE = Mode("latency", measure, RULES, lambda b: len(b.work) * len(b.cards))
