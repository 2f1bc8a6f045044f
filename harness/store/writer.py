"""The writer: Parquet datasets under `<results>/<table>/run_id=<id>/`, each file made atomically.

It knows rows and files, nothing about Ray or comparison. A file is written under a hidden
temporary name, flushed to disk and renamed, so a reader (pyarrow, DuckDB) sees the whole file
or none. While a run runs, it holds its run id (harness/store/claim.py) and its work is staged
under `<results>/.staging/<run_id>/` (hidden from readers): a sweep's finished units there are
what `--resume` reads. A run publishes at its end: each table's file, written whole into its
staging, is moved into place, then the `runs` row says how the run ended, then the staging goes.
A run that ends early keeps its staging for `--resume`. Every write first checks that this
process still holds the run: one that no longer does stops (RunLost) and writes nothing more.

A write that fails (a full or failing disk) is an InfrastructureError naming the file and the
cause, and leaves no temporary file behind: what was written before it stays whole. While a run
runs, its staging holds a reserve (RESERVE_BYTES): a run stopped by a full disk frees it to write
its status, so no run is left `running` after its process is gone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harness.errors import InfrastructureError, first_line
from harness.store.claim import Claim
from harness.store.paths import table_dir
from harness.store.schema import SCHEMAS, CheckRow, EpisodeRow, RunRow

# Room for a run's last `runs` row on a disk that filled up under it (the row is tens of KiB).
RESERVE_BYTES = 1024 * 1024
RESERVE = ".reserve"


def new_run_id() -> str:
    """Sortable by time, unique across concurrent sweeps, never mistaken for a number."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def to_table(table: str, rows: list[Any]) -> pa.Table:
    # A check row fills its result's columns (Arrow leaves the others null); a runs row its summary's.
    return pa.Table.from_pylist(
        [r.record() if isinstance(r, CheckRow | RunRow) else asdict(r) for r in rows], schema=SCHEMAS[table]
    )


def columns_table(table: str, columns: dict[str, Any]) -> pa.Table:
    """A table given column by column (numpy arrays or lists, NaN read as null): thousands of rows
    without a dataclass each."""
    schema = SCHEMAS[table]
    return pa.Table.from_arrays([pa.array(columns[f.name], type=f.type, from_pandas=True) for f in schema], schema=schema)


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """An OSError while writing `path` as the machine's failure (exit 3), in one line."""
    try:
        yield
    except OSError as exc:
        cause = f"{os.strerror(exc.errno)} (errno {exc.errno})" if exc.errno else first_line(exc)
        raise InfrastructureError(f"cannot write the results: {path}: {cause}") from exc


def write_atomic(table: pa.Table, path: Path, make_folder: bool = True) -> Path:
    """Write `table` to `path` (which the callers check lies in the results) whole or not at all;
    into a folder that exists already where not `make_folder` (a run's staging, never made again
    once removed)."""
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    with writing(path):
        try:
            if make_folder:
                path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):  # the space it took, for the writes that say what happened
                tmp.unlink(missing_ok=True)
            raise
    return path


def write_rows(results: Path, table: str, run_id: str, rows: list[Any], part: str = "part-0") -> Path:
    return write_atomic(to_table(table, rows), table_dir(results, table, run_id) / f"{part}.parquet")


def write_columns(results: Path, table: str, run_id: str, columns: dict[str, Any]) -> Path:
    return write_atomic(columns_table(table, columns), table_dir(results, table, run_id) / "part-0.parquet")


def read_run(results: Path, run_id: str) -> list[dict[str, Any]]:
    """The `runs` row(s) of one run, as written so far."""
    return pq.read_table(table_dir(results, "runs", run_id) / "part-0.parquet", schema=SCHEMAS["runs"]).to_pylist()


def done_units(staging: Path) -> set[str]:
    """The units a run has staged whole (their marker written last)."""
    if not staging.is_dir():
        return set()
    return {p.name.removesuffix(".done") for p in staging.glob("*.done")}


def read_staged(staging: Path) -> tuple[pa.Table, pa.Table]:
    """The checks and episodes of the units a run has staged so far."""
    merged = []
    for table in ("checks", "episodes"):
        files = [staging / f"{u}.{table}.parquet" for u in sorted(done_units(staging))]
        parts = [pq.read_table(f, schema=SCHEMAS[table]) for f in files if f.exists()]
        merged.append(pa.concat_tables(parts) if parts else SCHEMAS[table].empty_table())
    return merged[0], merged[1]


class RunWriter:
    """Stages a run's work, then publishes one file per table and its final `runs` row."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        self.results, self.run_id, self.staging = claim.results, claim.run_id, claim.staging

    def begin(self, row: RunRow) -> None:
        """The run's first `runs` row (status running), after the reserve: from here on a sweep
        killed before its first unit can still be resumed, and one refused before this leaves
        nothing behind."""
        reserve = self.staging / RESERVE
        with self._staging(), writing(reserve):
            reserve.write_bytes(bytes(RESERVE_BYTES))
        self.write_run(row)

    def write_run(self, row: RunRow) -> None:
        self.claim.check()
        write_rows(self.results, "runs", self.run_id, [row])

    def end(self, row: RunRow) -> None:
        """The `runs` row of a run that stopped early (incomplete, interrupted), written into the
        space of the reserve; the staging stays for `--resume`."""
        with self._staging(), writing(self.staging):
            (self.staging / RESERVE).unlink(missing_ok=True)
        self.write_run(row)

    def stage_unit(self, unit_id: str, checks: list[CheckRow], episodes: list[EpisodeRow]) -> None:
        # The marker is written last: a unit counts as done only once all its rows are on disk.
        done = self.staging / f"{unit_id}.done"
        with self._staging():
            write_atomic(to_table("checks", checks), self.staging / f"{unit_id}.checks.parquet", make_folder=False)
            if episodes:  # most units play none: no file rather than an empty one
                write_atomic(to_table("episodes", episodes), self.staging / f"{unit_id}.episodes.parquet", make_folder=False)
            with writing(done):
                done.touch()

    @contextlib.contextmanager
    def _staging(self) -> Iterator[None]:
        """Writes into the staging, after checking the claim; one that fails because the staging
        went away meanwhile is the claim lost (RunLost), not the machine's failure."""
        self.claim.check()
        try:
            yield
        except InfrastructureError:
            self.claim.check()
            raise

    def done_units(self) -> set[str]:
        return done_units(self.staging)

    def staged_episodes(self, unit_id: str) -> list[EpisodeRow]:
        """The episode rows a done unit staged (none for most units)."""
        path = self.staging / f"{unit_id}.episodes.parquet"
        if not path.exists():
            return []
        return [EpisodeRow(**row) for row in pq.read_table(path, schema=SCHEMAS["episodes"]).to_pylist()]

    def staged(self) -> tuple[pa.Table, pa.Table]:
        return read_staged(self.staging)

    def publish(self, tables: dict[str, pa.Table], row: RunRow) -> None:
        """Each table's file, written whole into the staging and then moved into place; then the
        `runs` row with the run's final status; then the staging removed. A reader
        (harness/store/views.py) shows a run's rows once that row says the run ended, and by
        then every table is in place: the run whole, or (before) its runs row alone."""
        ready = self.staging / "publish"
        with self._staging():
            with writing(ready):
                ready.mkdir(exist_ok=True)  # exists where a publish was cut short: this one writes it again
            staged = {name: write_atomic(rows, ready / f"{name}.parquet", make_folder=False) for name, rows in tables.items()}
        self.claim.check()
        for name, path in staged.items():
            final = table_dir(self.results, name, self.run_id) / "part-0.parquet"
            with writing(final):
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, final)
        self.write_run(row)
        self.claim.end()
