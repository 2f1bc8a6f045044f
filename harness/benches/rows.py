"""From a mode's typed measurement to its `bench` row, the same for every mode: the measurement
says what it is (`RowKey`), what it found (`Figures`, an interval, a detail) and its raw samples;
its mode's table of rules (harness/benches/rules.py) says whether it is a result."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar

import numpy as np

from harness.judge.bench_stats import Interval
from harness.outputs import Outputs
from harness.benches.rules import Rule, judge, verdict_reason
from harness.benches.work import Work
from harness.cluster.place import BenchCard
from harness.store.schema import BenchRow, BenchSampleRow


@dataclass(frozen=True)
class RowKey:
    """What a row measured, where and how."""

    row_id: str
    policy: str
    dtype: str
    batch_size: int
    mode: str
    timing: str  # device (inside the actor) or end_to_end (through Ray)
    device: str
    n_cards: int = 1


@dataclass(frozen=True)
class Figures:
    """A row's figures; a mode fills those it measures."""

    first_call_ms: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    decisions_per_s: float | None = None
    scaling_efficiency: float | None = None
    windows: int | None = None  # windows kept; a server row: the requests of its trial at max_qps
    cpu_share: float | None = None
    max_qps: float | None = None
    latency_bound_ms: float | None = None


@dataclass(frozen=True)
class Summary:
    """What a measurement reports: its key, its figures, the interval of the figure `ci_of`
    names (and of the scaling efficiency), and the detail JSON."""

    key: RowKey
    figures: Figures
    ci_of: str
    interval: Interval | None
    detail: dict[str, object]
    scaling: Interval | None = None


@dataclass(frozen=True)
class Sampled:
    """Outputs of the timed path, sampled at the end of a measurement, for the audit."""

    card: BenchCard
    work: Work
    outputs: Outputs


@dataclass(frozen=True)
class AuditSample:
    row_id: str
    sampled: Sampled


class Measurement(Protocol):
    """A mode's typed raw measurement: what its windows (rounds, trials) gave, with the
    statistics its row and its rules read."""

    def summary(self) -> Summary: ...

    def samples(self, row_id: str) -> dict[str, np.ndarray]:
        """Its raw timings, `bench_samples` column by column (`sample_columns`)."""
        ...

    def sampled(self) -> list[Sampled]:
        """What it sampled for the audit (empty for most)."""
        ...


M = TypeVar("M", bound=Measurement)


@dataclass
class BenchResult:
    """A bench row, its raw timings (`bench_samples` columns), and what it sampled for the audit."""

    row: BenchRow
    samples: dict[str, np.ndarray]
    audit: list[AuditSample] = field(default_factory=list)


def judged(measurement: M, rules: Sequence[Rule[M]]) -> BenchResult:
    """A measurement's row, valid when it meets every rule of its mode's table."""
    summary = measurement.summary()
    row = bench_row(summary, verdict_reason(judge(measurement, rules)))
    return BenchResult(row, measurement.samples(row.row_id), [AuditSample(row.row_id, s) for s in measurement.sampled()])


def bench_row(summary: Summary, reason: str) -> BenchRow:
    """A bench row: its intervals' bounds in the columns and their ranks in `detail`, so that
    SQL can pick the same order statistics."""
    key, f, interval, scaling = summary.key, summary.figures, summary.interval, summary.scaling
    detail = summary.detail | {"ci_ranks": _ranks(interval)} | ({"scaling_ci_ranks": _ranks(scaling)} if scaling else {})
    return BenchRow(
        policy=key.policy,
        dtype=key.dtype,
        device=key.device,
        n_cards=key.n_cards,
        batch_size=key.batch_size,
        mode=key.mode,
        first_call_ms=f.first_call_ms,
        p50_ms=f.p50_ms,
        p95_ms=f.p95_ms,
        p99_ms=f.p99_ms,
        mean_ms=f.mean_ms,
        decisions_per_s=f.decisions_per_s,
        scaling_efficiency=f.scaling_efficiency,
        timing=key.timing,
        detail=json.dumps(detail),
        row_id=key.row_id,
        valid=not reason,
        invalid_reason=reason,
        ci_of=summary.ci_of,
        ci_low=interval.low if interval else None,
        ci_high=interval.high if interval else None,
        scaling_ci_low=scaling.low if scaling else None,
        scaling_ci_high=scaling.high if scaling else None,
        windows=f.windows,
        cpu_share=f.cpu_share,
        max_qps=f.max_qps,
        latency_bound_ms=f.latency_bound_ms,
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


def sample_table(results: list[BenchResult]) -> dict[str, np.ndarray]:
    names = [f.name for f in fields(BenchSampleRow)]
    return {name: np.concatenate([r.samples[name] for r in results]) if results else np.array([]) for name in names}
