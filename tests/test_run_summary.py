"""The run's summary as a typed record: written once from `RunSummary` into its own `runs` columns
and the `summary` JSON beside them (the keys the run set, as before), read back as the record from
real Parquet, from a row an older harness wrote (JSON only) too, and queried by column."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from harness.store.paths import table_dir
from harness.store.schema import SCHEMAS, BenchAudit, RunSummary
from harness.store.writer import read_run, write_rows
from tests.helpers import cli, run_row

SWEEP = RunSummary(
    units=6,
    resumed_units=0,
    dead_cards=["sim-cpu2"],
    resent_units=1,
    closed_loop="",
    reference_s={"float64": 0.5, "float32": 0.25},
    without_episodes={"huggy-arch": "--env ENV_ID"},
    env_renames={},
    env_notes=[],
    replaced={"sim-cpu0@1d4ca6": ["sim-cpu0@72d75e"]},
    events=["card1 (sim-cpu1) hung on cartpole float32 and was restarted"],
    timings_s={"ray_s": 5.1, "write_s": 0.2},
)


def test_a_summary_reads_back_as_the_record_it_was_written_from(tmp_path: Path) -> None:
    row = replace(run_row("failed"), summary=SWEEP)
    write_rows(tmp_path, "runs", "r1", [row])
    [stored] = read_run(tmp_path, "r1")
    assert stored["units"] == 6 and dict(stored["reference_s"]) == SWEEP.reference_s, "its own columns"
    assert RunSummary.read(stored) == SWEEP
    said = json.loads(stored["summary"])
    assert list(said) == [
        "units",
        "resumed_units",
        "dead_cards",
        "resent_units",
        "closed_loop",
        "reference_s",
        "without_episodes",
        "env_renames",
        "env_notes",
        "replaced",
        "events",
        "timings_s",
    ], "the JSON keeps the keys a sweep set, none it did not"
    assert said["replaced"] == {"sim-cpu0@1d4ca6": ["sim-cpu0@72d75e"]} and said["dead_cards"] == ["sim-cpu2"]


def test_a_bench_summary_keeps_its_audit_nested(tmp_path: Path) -> None:
    bench = RunSummary(bench_rows=18, invalid_rows=18, card_steps=[1, 2], audit=BenchAudit(24, 1))
    write_rows(tmp_path, "runs", "b1", [replace(run_row("bench"), summary=bench)])
    [stored] = read_run(tmp_path, "b1")
    assert RunSummary.read(stored) == bench
    assert json.loads(stored["summary"])["audit"] == {"checks": 24, "failed": 1}


def test_a_row_an_older_harness_wrote_reads_from_its_json(tmp_path: Path) -> None:
    """Its file has no summary columns: the views and read_run give nulls there, and the record
    comes from the JSON."""
    runs = SCHEMAS["runs"]
    schema = pa.schema(list(runs)[: runs.get_field_index("summary") + 1])
    record = replace(run_row("failed"), summary=SWEEP).record()
    path = table_dir(tmp_path, "runs", "old") / "part-0.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{k: record[k] for k in schema.names}], schema=schema), path)
    [stored] = read_run(tmp_path, "old")
    assert stored["units"] is None and stored["summary"], "the file has no summary columns"
    assert RunSummary.read(stored) == SWEEP


def test_the_summary_columns_are_queried_as_columns(tmp_path: Path) -> None:
    write_rows(tmp_path, "runs", "r1", [replace(run_row("failed"), summary=SWEEP)])
    proc = cli(
        "query",
        "SELECT units, dead_cards[1] AS dead, reference_s['float32'] AS f32 FROM runs",
        "--results",
        str(tmp_path),
        "--format",
        "csv",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["units,dead,f32", "6,sim-cpu2,0.25"]
