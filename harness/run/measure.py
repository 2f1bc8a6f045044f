"""What a bench measurement is, shared by the driver (harness/run/bench.py) and the server
scenario (harness/run/server.py): the work, how windows run and are kept, the row with its raw
samples and what it sampled for the audit."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import numpy as np

from harness.judge.bench_stats import (
    Interval,
    invalid_reason,
    median_interval,
    quick_look,
    starved,
    too_few_iterations,
    too_few_windows,
    windows_disagree,
)
from harness.outputs import Outputs
from harness.run.options import BenchConfig
from harness.run.place import BenchCard
from harness.store.schema import BenchRow, BenchSampleRow
from harness.workloads import ObsBatch

W = TypeVar("W")


@dataclass(frozen=True)
class Measured:
    """One (policy, dtype, batch) combination, its batch made on the driver from the seed."""

    policy: str
    dtype: str
    batch: ObsBatch


@dataclass(frozen=True)
class Windows:
    """How every measurement runs: `count` windows, each at least `seconds` long and holding at
    least `min_iterations` calls; `quick` for a quick look (one window, never a valid row)."""

    count: int
    seconds: float
    min_iterations: int
    max_spread: float
    quick: bool = False

    @classmethod
    def of(cls, config: BenchConfig) -> Windows:
        if config.duration is not None:
            return cls(1, config.duration, config.min_iterations, config.max_spread, quick=True)
        return cls(config.windows, config.window, config.min_iterations, config.max_spread)

    def reasons(self, clean: int, measured: int, calls: list[int]) -> list[str | None]:
        """The rules every windowed row answers to: enough windows, fed cards, enough calls."""
        head = quick_look(self.seconds) if self.quick else too_few_windows(self.count)
        return [head, starved(clean, measured, self.count), too_few_iterations(calls, self.min_iterations)]

    def disagree(self, median: float, interval: Interval | None, what: str) -> str | None:
        return windows_disagree(median, interval, self.max_spread, what) if interval else None


@dataclass(frozen=True)
class AuditSample:
    """Outputs of the timed path, sampled at the end of a measurement, for the audit."""

    row_id: str
    card: BenchCard
    work: Measured
    outputs: Outputs


@dataclass
class Measurement:
    """A bench row, its raw timings (`bench_samples` columns), and what it sampled for the audit."""

    row: BenchRow
    samples: dict[str, np.ndarray]
    audit: list[AuditSample] = field(default_factory=list)


def repeat_windows(measure: Callable[[int], list[W]], is_bad: Callable[[W], bool], wanted: int) -> list[W]:
    """`wanted` windows, then as many again as were bad, until `wanted` are good or `wanted`
    more have been measured: load that comes and goes costs time, not validity."""
    got = measure(wanted)
    while (more := min(wanted - sum(not is_bad(w) for w in got), 2 * wanted - len(got))) > 0:
        got += measure(more)
    return got


def kept_windows(bad: list[bool], wanted: int) -> list[bool]:
    """The windows a row's figures come from: the good ones where there are enough of them,
    else all (and the row is invalid: `starved`)."""
    if bad.count(False) >= wanted:
        return [not b for b in bad]
    return [True] * len(bad)


def median_of_windows(values: list[float], windows: Windows) -> tuple[float, Interval | None]:
    """The median of the windows' figures and its 95% interval (none for a quick look)."""
    return float(np.median(values)), None if windows.quick else median_interval(np.asarray(values))


def judged_row(
    *,
    row_id: str,
    policy: str,
    dtype: str,
    batch_size: int,
    mode: str,
    timing: str,
    device: str,
    reasons: list[str | None],
    ci_of: str,
    interval: Interval | None,
    detail: dict[str, object],
    n_cards: int = 1,
    first_call_ms: float | None = None,
    p50_ms: float | None = None,
    p95_ms: float | None = None,
    p99_ms: float | None = None,
    mean_ms: float | None = None,
    decisions_per_s: float | None = None,
    scaling_efficiency: float | None = None,
    scaling: Interval | None = None,
    windows: int | None = None,
    cpu_share: float | None = None,
    max_qps: float | None = None,
    latency_bound_ms: float | None = None,
) -> BenchRow:
    """A bench row: valid when it met every rule in `reasons`; its intervals' bounds in the
    columns and their ranks in `detail`, so that SQL can pick the same order statistics."""
    reason = invalid_reason(reasons)
    detail = detail | {"ci_ranks": _ranks(interval)} | ({"scaling_ci_ranks": _ranks(scaling)} if scaling else {})
    return BenchRow(
        policy=policy,
        dtype=dtype,
        device=device,
        n_cards=n_cards,
        batch_size=batch_size,
        mode=mode,
        first_call_ms=first_call_ms,
        p50_ms=p50_ms,
        p95_ms=p95_ms,
        p99_ms=p99_ms,
        mean_ms=mean_ms,
        decisions_per_s=decisions_per_s,
        scaling_efficiency=scaling_efficiency,
        timing=timing,
        detail=json.dumps(detail),
        row_id=row_id,
        valid=not reason,
        invalid_reason=reason,
        ci_of=ci_of,
        ci_low=interval.low if interval else None,
        ci_high=interval.high if interval else None,
        scaling_ci_low=scaling.low if scaling else None,
        scaling_ci_high=scaling.high if scaling else None,
        windows=windows,
        cpu_share=cpu_share,
        max_qps=max_qps,
        latency_bound_ms=latency_bound_ms,
    )


def _ranks(interval: Interval | None) -> list[int] | None:
    return [interval.lower, interval.upper] if interval else None


def sample_columns(
    row_id: str,
    window_index: list[int],
    device: list[str],
    kept: list[bool],
    latency_ms: np.ndarray | None = None,
    decisions_per_s: list[float] | None = None,
    cpu_share: list[float | None] | None = None,
    offered_qps: list[float] | None = None,
    sample: list[int] | np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """One row's `bench_samples`, column by column; NaN stands for null."""
    n = len(window_index)

    def floats(values: Any) -> np.ndarray:
        return np.full(n, np.nan) if values is None else np.asarray([np.nan if v is None else v for v in values], float)

    return {
        "row_id": np.full(n, row_id, dtype=object),
        "window_index": np.asarray(window_index, dtype=np.int64),
        "sample": np.zeros(n, dtype=np.int64) if sample is None else np.asarray(sample, dtype=np.int64),
        "device": np.asarray(device, dtype=object),
        "latency_ms": floats(latency_ms),
        "decisions_per_s": floats(decisions_per_s),
        "cpu_share": floats(cpu_share),
        "kept": np.asarray(kept, dtype=bool),
        "offered_qps": floats(offered_qps),
    }


def sample_table(measured: list[Measurement]) -> dict[str, np.ndarray]:
    names = [f.name for f in fields(BenchSampleRow)]
    return {name: np.concatenate([m.samples[name] for m in measured]) if measured else np.array([]) for name in names}
