"""The tables as rows: one dataclass per table, the Parquet schema derived from its fields.

These are the public columns (docs/results.md); the writer stores them and `harness query`
reads them. Nothing here knows how a row was computed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import pyarrow as pa

from harness.judge.results import COLUMNS, Result, columns_of

TABLES = ("runs", "checks", "episodes", "bench", "bench_samples")


@dataclass
class CheckRow:
    """One comparison: where it was made, and its result, whose fields are the columns it fills
    (harness/judge/results.py); the other result columns are null in its row (docs/results.md)."""

    # where: the unit, its output, the two sides and the bytes that went in
    unit_id: str
    policy: str
    dtype: str  # the card's dtype, with its precision mode where reduced: float32-tf32, float32-hf32
    workload: str
    output: str
    kind: str  # a CheckKind: cross_card, cpu_reference, decisions, ... (harness/judge/kinds.py)
    device_a: str
    device_b: str
    input_sha256: str
    # the verdict: the run passes when every gating row passes
    gating: bool
    result: Result

    @property
    def passed(self) -> bool:
        return self.result.passed

    @property
    def detail(self) -> str:
        return self.result.detail

    def note(self, text: str) -> None:
        """Add `text` to the row's detail (what a later search found)."""
        self.result = replace(self.result, detail=f"{self.detail}; {text}" if self.detail else text)

    def record(self) -> dict[str, Any]:
        """The row as the table's columns by name: where, then what the result fills."""
        where = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "result"}
        return {**where, **columns_of(self.result)}


@dataclass
class EpisodeRow:
    """One episode on one device: a card, the CPU float32 (`cpu`), or the CPU float32 replaying
    the seed under the honest-card model (`cpu-ulp-noise`: where an honest port parts from it)."""

    unit_id: str
    policy: str
    dtype: str
    device: str
    env_id: str
    mode: str  # deterministic or stochastic
    batching: str  # lockstep (all the unit's episodes in one batch) or single (batch 1)
    batch_size: int
    episode_seed: int
    episode_return: float
    length: int
    actions_sha256: str
    first_divergent_step: int | None  # vs the CPU reference; None when identical (or the reference)


@dataclass
class BenchRow:
    """One measurement of `harness bench` (docs/bench.md). Its figures come from the windows
    kept in `bench_samples` under the same `row_id`; `ci_low`/`ci_high` bound the column that
    `ci_of` names, and `valid` says whether the row is a result (`invalid_reason` says why not)."""

    policy: str
    dtype: str
    device: str
    n_cards: int
    batch_size: int
    mode: str  # latency, throughput, closed_loop, server
    first_call_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    decisions_per_s: float | None
    scaling_efficiency: float | None
    timing: str  # device (inside the actor) or end_to_end (through Ray)
    detail: str
    row_id: str = ""
    valid: bool = False
    invalid_reason: str = ""
    ci_of: str = ""  # p50_ms (latency), decisions_per_s (throughput, closed_loop), p99_ms (server)
    ci_low: float | None = None
    ci_high: float | None = None
    scaling_ci_low: float | None = None  # throughput at k > 1 cards: the interval of scaling_efficiency
    scaling_ci_high: float | None = None
    windows: int | None = None  # windows kept (server: queries in the trial at max_qps)
    cpu_share: float | None = None  # simulated cards: the least share of a core any card got (median over windows)
    max_qps: float | None = None  # server: the highest request rate whose p99 stayed under latency_bound_ms
    latency_bound_ms: float | None = None


@dataclass
class BenchSampleRow:
    """One raw timing behind a `bench` row: a call's latency (latency, server), or one card's
    decisions/s in a window (throughput, closed_loop). `kept` marks what the row's figures come
    from: windows a starved simulated card ran are measured again and left out, and of a server
    search only the trial at max_qps is kept."""

    row_id: str
    window_index: int  # the window (server: the trial) within the row, from 0 (`window` is an SQL keyword)
    sample: int  # the call within the window (latency, server); 0 for a window's throughput
    device: str  # the card timed (server: the card that served the request)
    latency_ms: float | None
    decisions_per_s: float | None
    cpu_share: float | None  # of the card's process in the window (device timing)
    kept: bool
    offered_qps: float | None = None  # server: the trial's arrival rate


@dataclass
class RunRow:
    started_at: str
    finished_at: str | None
    status: str  # a RunStatus (harness/judge/outcome.py)
    accelerator: str
    n_cards: int
    devices: str  # JSON list of device descriptors
    harness_version: str
    torch_version: str
    ray_version: str
    config_json: str
    faults: str
    git_revision: str
    hostname: str
    policies: str  # JSON: name, source, sha256, synthetic, detail
    command: str
    summary: str


def _arrow_type(annotation: str) -> pa.DataType:
    base = annotation.replace(" | None", "")
    return {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}[base]


def schema_of(row_type: type) -> pa.Schema:
    return pa.schema([pa.field(f.name, _arrow_type(str(f.type))) for f in fields(row_type)])


def _checks_schema() -> pa.Schema:
    """Where each check was made, then the columns of every kind's result (harness/judge/results.py)."""
    where = [pa.field(f.name, _arrow_type(str(f.type))) for f in fields(CheckRow) if f.name != "result"]
    return pa.schema([*where, *(pa.field(name, _arrow_type(annotation)) for name, annotation in COLUMNS)])


SCHEMAS = {
    "runs": schema_of(RunRow),
    "checks": _checks_schema(),
    "episodes": schema_of(EpisodeRow),
    "bench": schema_of(BenchRow),
    "bench_samples": schema_of(BenchSampleRow),
}
