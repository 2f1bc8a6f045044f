"""`harness query` and `harness.store.views` on Parquet written by a real sweep, and on hand-written rows.

The real sweep is the session's shared clean run (tests/conftest.py); the error cases and the
partial folders use rows written with `harness.store.writer.write_rows`, real Parquet in seconds.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.errors import UsageError
from harness.store.schema import SCHEMAS, TABLES
from harness.store.views import load_dataframe, load_table
from harness.store.writer import write_rows
from tests.builders import bench_row
from tests.conftest import CLEAN_RUN as CLEAN
from tests.conftest import SharedSweeps
from tests.helpers import assert_usage_error, cli


@pytest.fixture(scope="module")
def results(shared_sweeps: SharedSweeps) -> Path:
    return shared_sweeps.clean()


@pytest.fixture
def bench_only(tmp_path: Path) -> Path:
    """A results folder that holds only the bench table, as after a bare `harness bench`."""
    write_rows(tmp_path, "bench", "20240101", [bench_row(), bench_row(batch_size=1, p50_ms=0.37)])
    return tmp_path


def query_json(results: Path, sql: str) -> list[dict[str, object]]:
    proc = cli("query", sql, "--results", str(results), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))


@pytest.mark.slow
def test_check_counts_match_the_parquet_files(results: Path) -> None:
    written = pq.read_table(results / "checks" / f"run_id={CLEAN}" / "part-0.parquet")
    rows = query_json(
        results,
        f"SELECT count(*) AS n, count(*) FILTER (gating AND NOT passed) AS failed, count(DISTINCT kind) AS kinds FROM "
        f"checks WHERE run_id = '{CLEAN}'",
    )
    assert rows == [{"n": written.num_rows, "failed": 0, "kinds": 6}]
    assert written.num_rows > 0


@pytest.mark.slow
def test_every_table_is_a_view_with_a_varchar_run_id(results: Path) -> None:
    rows = query_json(
        results,
        f"SELECT table_name, table_type FROM information_schema.tables WHERE table_name IN {TABLES}",
    )
    assert {r["table_name"]: r["table_type"] for r in rows} == {name: "VIEW" for name in TABLES}
    for name in TABLES:
        described = query_json(results, f"DESCRIBE {name}")
        columns = {r["column_name"]: r["column_type"] for r in described}
        assert columns["run_id"] == "VARCHAR"
        assert set(SCHEMAS[name].names) <= set(columns)
    runs = query_json(results, f"SELECT run_id, status FROM runs WHERE run_id = '{CLEAN}'")
    assert runs == [{"run_id": CLEAN, "status": "passed"}]
    episodes = query_json(results, f"SELECT count(*) AS n FROM episodes WHERE run_id = '{CLEAN}'")
    assert episodes[0]["n"] > 0


@pytest.mark.slow
def test_csv_and_table_formats(results: Path) -> None:
    sql = (
        f"SELECT dtype, kind, count(*) AS n, max(max_abs) AS worst FROM checks WHERE run_id = '{CLEAN}' AND kind IN "
        "('cross_card', 'cpu_reference') GROUP BY ALL ORDER BY ALL"
    )
    proc = cli("query", sql, "--results", str(results), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    parsed = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert {(r["dtype"], r["kind"]) for r in parsed} == {
        (d, k) for d in ("float32", "float16") for k in ("cross_card", "cpu_reference")
    }
    assert all(int(r["n"]) > 0 and float(r["worst"]) >= 0 for r in parsed)
    table = cli("query", sql, "--results", str(results))
    assert table.returncode == 0 and "cpu_reference" in table.stdout and "float16" in table.stdout


@pytest.mark.slow
def test_load_table_from_python(results: Path) -> None:
    checks = load_table("checks", results, run_id=CLEAN)
    assert checks.num_rows == pq.read_table(results / "checks" / f"run_id={CLEAN}").num_rows
    assert checks.schema.names[0] == "run_id" and set(checks.column("run_id").to_pylist()) == {CLEAN}
    assert load_table("checks", results, run_id="no-such-run").num_rows == 0


def test_load_table_on_a_partial_folder(bench_only: Path) -> None:
    bench = load_table("bench", bench_only)
    assert bench.num_rows == 2 and bench.column("run_id").to_pylist() == ["20240101"] * 2  # a number-like id stays text
    checks = load_table("checks", bench_only)
    assert checks.num_rows == 0 and checks.schema.names == ["run_id", *SCHEMAS["checks"].names]
    with pytest.raises(UsageError, match="did you mean checks"):
        load_table("check", bench_only)
    with pytest.raises(UsageError, match="does not exist"):
        load_table("runs", bench_only / "missing")


def test_load_dataframe_needs_pandas(bench_only: Path) -> None:
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            load_dataframe("bench", bench_only)
    else:
        assert len(load_dataframe("bench", bench_only)) == 2


def test_queries_on_a_folder_with_only_some_tables(bench_only: Path) -> None:
    rows = query_json(
        bench_only,
        "SELECT (SELECT count(*) FROM checks) AS checks, (SELECT count(*) FROM runs) AS runs, (SELECT max(p50_ms) "
        "FROM bench) AS p50, (SELECT typeof(any_value(run_id)) FROM bench) AS t",
    )
    assert rows == [{"checks": 0, "runs": 0, "p50": 0.9, "t": "VARCHAR"}]


def test_staging_and_unfinished_files_are_ignored(bench_only: Path) -> None:
    (bench_only / ".staging" / "r1").mkdir(parents=True)
    write_rows(bench_only / ".staging" / "r1", "bench", "r1", [bench_row()])
    tmp = bench_only / "bench" / "run_id=20240101" / ".part-1.parquet.0123.tmp"
    tmp.write_bytes(b"half a file")
    rows = query_json(bench_only, "SELECT run_id, count(*) AS n FROM bench GROUP BY run_id ORDER BY run_id")
    assert rows == [{"run_id": "20240101", "n": 2}]


def test_nan_becomes_null_in_json(bench_only: Path) -> None:
    assert query_json(bench_only, "SELECT 'nan'::DOUBLE AS x, [1.0, 'inf'::DOUBLE] AS xs") == [{"x": None, "xs": [1.0, None]}]


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("SELEC * FROM bench", ("syntax error",)),
        ("SELECT * FROM chekcs", ("unknown table chekcs", "runs, checks, episodes, bench")),
        ("SELECT no_such_column FROM bench", ("no_such_column",)),
    ],
)
def test_bad_sql_is_one_line_exit_2(bench_only: Path, sql: str, words: tuple[str, ...]) -> None:
    assert_usage_error(cli("query", sql, "--results", str(bench_only)), *words)


def test_empty_or_missing_results_folder_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "checks").mkdir()
    assert_usage_error(cli("query", "SELECT 1", "--results", str(tmp_path)), "holds no results")
    assert_usage_error(cli("query", "SELECT 1", "--results", str(tmp_path / "nope")), "does not exist")


def test_a_damaged_runs_file_is_one_line_exit_2(bench_only: Path) -> None:
    (bench_only / "runs" / "run_id=r1").mkdir(parents=True)
    (bench_only / "runs" / "run_id=r1" / "part-0.parquet").write_bytes(b"not parquet")
    assert_usage_error(cli("query", "SELECT 1", "--results", str(bench_only)), "its runs table cannot be read")


def test_a_results_path_with_a_quote_and_glob_characters_is_read_literally(tmp_path: Path) -> None:
    folder = tmp_path / "it's *?[x]" / "results"
    write_rows(folder, "bench", "r1", [bench_row()])
    # As a glob, `it's *?[x]` matches `it's abx`: DuckDB, handed the listed path, read this one instead.
    write_rows(tmp_path / "it's abx" / "results", "bench", "r1", [bench_row(detail="the other folder")])
    assert query_json(folder, "SELECT run_id, detail FROM bench") == [{"run_id": "r1", "detail": ""}]
    assert load_table("bench", folder).column("detail").to_pylist() == [""]
