"""The tables as rows: one dataclass per table, the Parquet schema derived from its fields.

These are the public columns (docs/results.md); the writer stores them and `harness query`
reads them. Nothing here knows how a row was computed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
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


@dataclass(frozen=True)
class BenchAudit:
    """A bench's audit of its timed path: outputs sampled, and how many differed from the sweep's."""

    checks: int
    failed: int


@dataclass
class RunSummary:
    """What a run says of itself as it ends: `runs` columns of their own, after `summary`, which
    holds the same values as JSON (the keys the run set) for the queries written against it.
    None is what the run did not say: a bench has no units, a sweep that finished stopped nowhere."""

    units: int | None = None  # units planned (with --episodes auto, every round's)
    resumed_units: int | None = None  # units a resumed run found done and did not run again
    done_units: int | None = None  # a run that stopped short: the units done and kept for --resume
    dead_cards: list[str] | None = None  # cards that produced nothing for a unit
    resent_units: int | None = None  # units sent again, their results having come from two nodes
    closed_loop: str | None = None  # what --episodes auto played and why it stopped ("" without it)
    reference_s: dict[str, float] | None = None  # the CPU reference's seconds per dtype (its pool's summed)
    reference_pool: int | None = None  # the CPU reference's actors, sharing its work
    busy_s: dict[str, float] | None = None  # each actor's wall seconds in its calls, by actor
    busy_cpu_s: dict[str, float] | None = None  # each actor's CPU seconds in its calls, by actor
    without_episodes: dict[str, str] | None = None  # policies without an environment, and the flag that gives them one
    env_renames: dict[str, str] | None = None  # each policy whose environment gymnasium renamed: the rename
    env_notes: list[str] | None = None  # policies that played another environment than --env, and why
    replaced: dict[str, list[str]] | None = None  # each actor Ray moved to another node: its label now -> before
    events: list[str] | None = None  # what Ray recovered from: a card hung and restarted, an actor moved
    lost: list[str] | None = None  # what a run that ended incomplete lost
    stopped: str | None = None  # why a run stopped where no summary could be printed (Ray, the disk, a signal)
    bench_rows: int | None = None  # a bench's rows
    invalid_rows: int | None = None  # a bench's rows that are no result
    card_steps: list[int] | None = None  # the card counts a bench's throughput ran on
    audit: BenchAudit | None = None  # a bench's audit of its timed path
    timings_s: dict[str, float] | None = None  # seconds per phase: imports, plan, ray, actors, ..., shutdown

    def as_json(self) -> str:
        """The `summary` column: what the run said, by name."""
        return json.dumps({name: value for name, value in asdict(self).items() if value is not None})

    @classmethod
    def read(cls, row: Mapping[str, Any]) -> RunSummary:
        """A stored `runs` row's summary: from its columns, or from its JSON where a harness that
        wrote no columns made the row; empty where it has neither."""
        names = [f.name for f in fields(cls)]
        stored: Mapping[str, Any] = row
        if all(row.get(name) is None for name in names):
            try:
                stored = json.loads(row.get("summary") or "{}")
            except ValueError:
                stored = {}
        return cls(**{f.name: _plain(str(f.type), stored.get(f.name)) for f in fields(cls)})


def _plain(annotation: str, value: Any) -> Any:
    """A summary value as read back (a Parquet map is a list of pairs, a struct a dict) as its field's type."""
    if value is None:
        return None
    if annotation.startswith("dict[") and not isinstance(value, dict):
        return dict(value)
    if annotation.startswith("BenchAudit"):
        return BenchAudit(**value)
    return value


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
    summary: RunSummary = field(default_factory=RunSummary)  # JSON, and each of its values as a column

    def record(self) -> dict[str, Any]:
        """The row as the table's columns by name: the run, `summary` as JSON, then its columns."""
        run = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "summary"}
        return {**run, "summary": self.summary.as_json(), **asdict(self.summary)}


_ARROW_TYPES = {
    "str": pa.string(),
    "int": pa.int64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
    "list[str]": pa.list_(pa.string()),
    "list[int]": pa.list_(pa.int64()),
    "dict[str, str]": pa.map_(pa.string(), pa.string()),
    "dict[str, float]": pa.map_(pa.string(), pa.float64()),
    "dict[str, list[str]]": pa.map_(pa.string(), pa.list_(pa.string())),
    "BenchAudit": pa.struct([pa.field(f.name, pa.int64()) for f in fields(BenchAudit)]),
}


def _arrow_type(annotation: str) -> pa.DataType:
    return _ARROW_TYPES[annotation.replace(" | None", "")]


def schema_of(row_type: type) -> pa.Schema:
    return pa.schema([pa.field(f.name, _arrow_type(str(f.type))) for f in fields(row_type)])


def _runs_schema() -> pa.Schema:
    """The run's columns, `summary` (JSON) last among them as it always was, then the summary's own."""
    run = [pa.field(f.name, _arrow_type(str(f.type))) for f in fields(RunRow) if f.name != "summary"]
    return pa.schema([*run, pa.field("summary", pa.string()), *schema_of(RunSummary)])


def _checks_schema() -> pa.Schema:
    """Where each check was made, then the columns of every kind's result (harness/judge/results.py)."""
    where = [pa.field(f.name, _arrow_type(str(f.type))) for f in fields(CheckRow) if f.name != "result"]
    return pa.schema([*where, *(pa.field(name, _arrow_type(annotation)) for name, annotation in COLUMNS)])


SCHEMAS = {
    "runs": _runs_schema(),
    "checks": _checks_schema(),
    "episodes": schema_of(EpisodeRow),
    "bench": schema_of(BenchRow),
    "bench_samples": schema_of(BenchSampleRow),
}
