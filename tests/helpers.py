"""Running the command line from tests, as a user runs it or in-process, and reading the Parquet
it wrote."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

REPO = Path(__file__).resolve().parents[1]


def harness(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`harness ARGS` as a user runs it, in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`harness ARGS` in this process: the same parser, commands and exit codes, without the
    second or two a fresh interpreter costs. argparse's own exits are caught as exit codes."""
    from harness.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["harness", *args], code, out.getvalue(), err.getvalue())


def assert_usage_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2 with one line on stderr, no traceback, naming what was wrong."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness: error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def read_table(results: Path, table: str) -> pa.Table:
    return ds.dataset(results / table, format="parquet", partitioning="hive").to_table()


def duckdb_rows(results: Path, sql_on_table: str, table: str) -> list[tuple]:
    path = (results / table / "*" / "*.parquet").as_posix()
    con = duckdb.connect()
    con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{path}', hive_partitioning=true)")
    return con.execute(sql_on_table).fetchall()
