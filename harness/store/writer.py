"""The writer: Parquet datasets under `<results>/<table>/run_id=<id>/`, each file made atomically.

It knows rows and files, nothing about Ray or comparison. A file is written under a hidden
temporary name, flushed to disk and renamed, so a reader (pyarrow, DuckDB) sees the whole file
or none. While a sweep runs, each finished unit is staged under `<results>/.staging/<run_id>/`
(hidden from readers); `--resume` reads what was staged and the end of the run turns the staged
parts into one file per table. A run that ends incomplete keeps its staging for `--resume`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harness.store.paths import STAGING, check_run_id, inside, table_dir
from harness.store.schema import SCHEMAS, CheckRow, EpisodeRow, RunRow


def new_run_id() -> str:
    """Sortable by time, unique across concurrent sweeps, never mistaken for a number."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def to_table(table: str, rows: list[Any]) -> pa.Table:
    return pa.Table.from_pylist([asdict(r) for r in rows], schema=SCHEMAS[table])


def columns_table(table: str, columns: dict[str, Any]) -> pa.Table:
    """A table given column by column (numpy arrays or lists, NaN read as null): thousands of rows
    without a dataclass each."""
    schema = SCHEMAS[table]
    return pa.Table.from_arrays([pa.array(columns[f.name], type=f.type, from_pandas=True) for f in schema], schema=schema)


def write_atomic(table: pa.Table, path: Path) -> Path:
    """Write `table` to `path` (which the callers check lies in the results) whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def write_rows(results: Path, table: str, run_id: str, rows: list[Any], part: str = "part-0") -> Path:
    return write_atomic(to_table(table, rows), table_dir(results, table, run_id) / f"{part}.parquet")


def write_columns(results: Path, table: str, run_id: str, columns: dict[str, Any]) -> Path:
    return write_atomic(columns_table(table, columns), table_dir(results, table, run_id) / "part-0.parquet")


def read_run(results: Path, run_id: str) -> list[dict[str, Any]]:
    """The `runs` row(s) of one run, as written so far."""
    return pq.read_table(table_dir(results, "runs", run_id) / "part-0.parquet", schema=SCHEMAS["runs"]).to_pylist()


class RunWriter:
    """Stages each finished unit, then writes one file per table for the run."""

    def __init__(self, results: Path, run_id: str) -> None:
        self.results = results
        self.run_id = check_run_id(run_id)
        self.staging = inside(results, results / STAGING / run_id)

    def begin(self, row: RunRow) -> None:
        """The run's first `runs` row. From here on the staging exists: a run killed before its
        first unit can still be resumed, and a sweep refused before this leaves nothing behind."""
        self.staging.mkdir(parents=True, exist_ok=True)
        self.write_run(row)

    def write_run(self, row: RunRow) -> None:
        write_rows(self.results, "runs", self.run_id, [row])

    def stage_unit(self, unit_id: str, checks: list[CheckRow], episodes: list[EpisodeRow]) -> None:
        # The marker is written last: a unit counts as done only once all its rows are on disk.
        write_atomic(to_table("checks", checks), self.staging / f"{unit_id}.checks.parquet")
        if episodes:  # most units play none: no file rather than an empty one
            write_atomic(to_table("episodes", episodes), self.staging / f"{unit_id}.episodes.parquet")
        (self.staging / f"{unit_id}.done").touch()

    def done_units(self) -> set[str]:
        if not self.staging.is_dir():
            return set()
        return {p.name.removesuffix(".done") for p in self.staging.glob("*.done")}

    def staged_episodes(self, unit_id: str) -> list[EpisodeRow]:
        """The episode rows a done unit staged (none for most units)."""
        path = self.staging / f"{unit_id}.episodes.parquet"
        if not path.exists():
            return []
        return [EpisodeRow(**row) for row in pq.read_table(path, schema=SCHEMAS["episodes"]).to_pylist()]

    def staged(self) -> tuple[pa.Table, pa.Table]:
        """The checks and episodes of the units done so far."""
        done = sorted(self.done_units())
        merged = []
        for table in ("checks", "episodes"):
            files = [self.staging / f"{u}.{table}.parquet" for u in done]
            parts = [pq.read_table(f, schema=SCHEMAS[table]) for f in files if f.exists()]
            merged.append(pa.concat_tables(parts) if parts else SCHEMAS[table].empty_table())
        return merged[0], merged[1]

    def finish(self) -> tuple[pa.Table, pa.Table]:
        """Merge the staged units into the final files; drop the staging."""
        checks, episodes = self.staged()
        for table, rows in (("checks", checks), ("episodes", episodes)):
            write_atomic(rows, table_dir(self.results, table, self.run_id) / "part-0.parquet")
        shutil.rmtree(inside(self.results, self.staging), ignore_errors=True)
        return checks, episodes
