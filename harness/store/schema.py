"""The four tables as rows: one dataclass per table, the Parquet schema derived from its fields.

These are the public columns (README, "Results"); the writer stores them and `harness query`
reads them. Nothing here knows how a row was computed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import pyarrow as pa

TABLES = ("runs", "checks", "episodes", "bench")


@dataclass
class CheckRow:
    unit_id: str
    policy: str
    dtype: str
    workload: str
    output: str
    kind: str  # cross_card, cpu_reference, onnx_reference, error
    device_a: str
    device_b: str
    input_sha256: str
    bitwise_equal: bool
    n_elements: int
    n_mismatch: int
    max_ulp: int
    max_abs: float
    mean_abs: float
    max_rel: float
    cosine: float
    atol: float | None
    rtol: float | None
    min_cos: float | None
    passed: bool
    detail: str


@dataclass
class EpisodeRow:
    unit_id: str
    policy: str
    dtype: str
    device: str
    env_id: str
    mode: str  # deterministic or stochastic
    episode_seed: int
    episode_return: float
    length: int
    actions_sha256: str
    first_divergent_step: int | None  # vs the CPU reference; None when identical (or the reference)


@dataclass
class BenchRow:
    policy: str
    dtype: str
    device: str
    n_cards: int
    batch_size: int
    mode: str  # latency, throughput, closed_loop
    first_call_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    decisions_per_s: float | None
    scaling_efficiency: float | None
    timing: str  # device (inside the actor) or end_to_end (through Ray)
    detail: str


@dataclass
class RunRow:
    started_at: str
    finished_at: str | None
    status: str  # running, passed, failed, error
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


SCHEMAS = {"runs": schema_of(RunRow), "checks": schema_of(CheckRow), "episodes": schema_of(EpisodeRow), "bench": schema_of(BenchRow)}
