"""The tables as rows: one dataclass per table, the Parquet schema derived from its fields.

These are the public columns (README, "Results"); the writer stores them and `harness query`
reads them. Nothing here knows how a row was computed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import pyarrow as pa

TABLES = ("runs", "checks", "episodes", "bench", "bench_samples")
# A run's `runs.status` once all its tables are in place: the writer publishes them before the
# row that says so, and the views show the other tables' rows of such runs only.
PUBLISHED = ("passed", "failed", "bench")


@dataclass
class CheckRow:
    """One comparison. No column means two things: each group below is filled by the kinds of
    check it belongs to and left null by the others (README, "Results")."""

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
    passed: bool
    # a against b, element by element (cross_card, tolerance, batch_invariance; cpu_reference and
    # onnx_reference: a against the float64 golden)
    bitwise_equal: bool | None = None
    n_elements: int | None = None
    n_mismatch: int | None = None
    max_ulp: int | None = None
    max_abs: float | None = None
    mean_abs: float | None = None
    max_rel: float | None = None
    cosine: float | None = None
    # the port rule (cpu_reference, onnx_reference): pass when error_ratio <= ratio_limit and max_ratio <= ratio_limit
    golden_rmse: float | None = None
    cpu_golden_rmse: float | None = None
    rmse_floor: float | None = None
    error_ratio: float | None = None  # golden_rmse / max(cpu_golden_rmse, rmse_floor)
    cpu_golden_max_abs: float | None = None
    max_floor: float | None = None
    max_ratio: float | None = None  # max_abs / max(cpu_golden_max_abs, max_floor)
    ratio_limit: float | None = None
    # elements not finite on the card where the golden is, all where the CPU in the dtype is not either: the
    # dtype's overflow, forgiven by the port rule (the ratios then cover the values both computed finitely)
    n_overflow: int | None = None
    # the tolerance rule (tolerance): pass when max_abs <= atol + rtol * ref_max_abs and cosine >= min_cos
    ref_max_abs: float | None = None
    atol: float | None = None
    rtol: float | None = None
    min_cos: float | None = None
    # decisions: pass when every flip is a near-tie, i.e. max_flip_margin <= flip_margin_limit
    n_flips: int | None = None
    n_near_ties: int | None = None
    max_flip_margin: float | None = None
    flip_margin_limit: float | None = None
    # episodes (cross_card on trajectories, episode_return): the first episode that parts from the other side's
    episode_seed: int | None = None
    first_divergent_step: int | None = None
    # closed-loop returns as distributions (episode_return, published_return; README, "Closed-loop returns"):
    # a's and b's mean and interquartile mean with their 95% intervals (b: the CPU float32's, or the published
    # mean), the difference a - b (paired by seed) with its interval; outcome pass when return_diff_low >
    # -return_margin, fail when return_diff_high < -return_margin, else inconclusive
    outcome: str | None = None
    return_a: float | None = None
    return_a_low: float | None = None
    return_a_high: float | None = None
    iqm_a: float | None = None
    iqm_a_low: float | None = None
    iqm_a_high: float | None = None
    return_b: float | None = None
    return_b_low: float | None = None
    return_b_high: float | None = None
    iqm_b: float | None = None
    iqm_b_low: float | None = None
    iqm_b_high: float | None = None
    return_diff: float | None = None
    return_diff_low: float | None = None
    return_diff_high: float | None = None
    return_margin: float | None = None
    episodes_needed: int | None = None  # inconclusive: how many episodes would likely decide
    published_std: float | None = None
    detail: str = ""


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
    """One measurement of `harness bench` (README, "Speed"). Its figures come from the windows
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
    status: str  # running, then passed, failed or bench (PUBLISHED), or incomplete or interrupted (resumable)
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


SCHEMAS = {
    "runs": schema_of(RunRow),
    "checks": schema_of(CheckRow),
    "episodes": schema_of(EpisodeRow),
    "bench": schema_of(BenchRow),
    "bench_samples": schema_of(BenchSampleRow),
}
