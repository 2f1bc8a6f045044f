"""`harness query` sees the results and nothing else: each way out is refused with exit 2 and one
line, and did not happen; ordinary queries over the views still work.

The results are real Parquet written with `harness.store.writer.write_rows`, queried by real DuckDB.
Beside the results folder lie files a query must not reach; their content is a marker that must
never appear in the output.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.store.views import connect, load_table
from harness.store.writer import write_rows
from tests.helpers import REPO, assert_usage_error, cli
from tests.builders import bench_row

SECRET = "outside-the-results-7f3a"
PERMISSION = "Permission Error"


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results folder of two bench rows, with a text, a CSV and a Parquet file outside it."""
    folder = tmp_path / "results"
    write_rows(folder, "bench", "r1", [bench_row(), bench_row(batch_size=1, p50_ms=0.37)])
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    (tmp_path / "secret.csv").write_text(f"word\n{SECRET}\n")
    pq.write_table(pa.table({"word": [SECRET]}), tmp_path / "secret.parquet")
    return folder


def committed(results: Path) -> Path:
    return results / "bench" / "run_id=r1" / "part-0.parquet"


def query(results: Path, sql: str, *args: str) -> tuple[int, str, str]:
    proc = cli("query", sql, "--results", str(results), *args)
    return proc.returncode, proc.stdout, proc.stderr


def assert_refused(results: Path, sql: str, *words: str) -> None:
    """Exit 2 with one line naming the reason, and nothing of the outside files in the output."""
    proc = cli("query", sql, "--results", str(results))
    assert_usage_error(proc, *words)
    assert SECRET not in proc.stdout and SECRET not in proc.stderr


def test_copy_to_outside_writes_nothing(results: Path) -> None:
    target = results.parent / "copied.csv"
    assert_refused(results, f"COPY (SELECT * FROM bench) TO '{target}'", PERMISSION, "copied.csv")
    assert not target.exists()


def test_the_results_cannot_be_overwritten_or_added_to(results: Path) -> None:
    before = committed(results).read_bytes()
    target = committed(results)
    assert_refused(results, f"COPY (SELECT 1 AS x) TO '{target}' (FORMAT csv, USE_TMP_FILE false)", PERMISSION)
    # EXPLAIN ANALYZE runs the statement it explains.
    assert_refused(results, f"EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{target}' (USE_TMP_FILE false)", PERMISSION)
    assert_refused(results, f"COPY (SELECT 1 AS x) TO '{results}/new.csv'", PERMISSION)
    assert_refused(results, f"EXPORT DATABASE '{results}/exported'", PERMISSION)
    assert committed(results).read_bytes() == before
    assert sorted(p.name for p in results.iterdir()) == ["bench"]


def test_the_in_memory_database_has_no_file_of_its_own(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Had the lock been given to `duckdb.connect`, DuckDB would allow these names here.
    monkeypatch.chdir(results.parent)
    for name in (":memory:", ":memory:.wal"):
        assert_refused(results, f"COPY (SELECT 1) TO '{name}' (FORMAT csv)", PERMISSION)
        assert not (results.parent / name).exists()


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_attach_creates_no_database_file(results: Path, where: str) -> None:
    target = (results.parent if where == "outside" else results) / "attached.duckdb"
    assert_refused(results, f"ATTACH '{target}' AS other", PERMISSION)
    assert not target.exists()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_text('{tmp}/secret.txt')",
        "SELECT * FROM read_blob('{tmp}/secret.txt')",
        "SELECT * FROM read_csv('{tmp}/secret.csv')",
        "SELECT * FROM read_json('{tmp}/secret.txt')",
        "SELECT * FROM read_parquet('{tmp}/secret.parquet')",
        "SELECT * FROM read_parquet('{tmp}/*.parquet')",
        "SELECT * FROM glob('{tmp}/*')",
        "SELECT * FROM '{tmp}/secret.csv'",
        "SELECT * FROM read_text('{results}/../secret.txt')",
        "SELECT * FROM read_text('/etc/passwd')",
        "CREATE TABLE copied AS SELECT * FROM read_csv('{tmp}/secret.csv')",
    ],
)
def test_files_outside_the_results_are_not_read(results: Path, sql: str) -> None:
    assert_refused(results, sql.format(tmp=results.parent, results=results), PERMISSION, "no file")


def test_no_file_is_read_by_path_inside_the_results_either(results: Path) -> None:
    (results / "notes.txt").write_text(SECRET)
    (results / "link.txt").symlink_to(results.parent / "secret.txt")
    assert_refused(results, f"SELECT * FROM read_text('{results}/notes.txt')", PERMISSION)
    assert_refused(results, f"SELECT * FROM read_text('{results}/link.txt')", PERMISSION)
    assert_refused(results, f"SELECT * FROM read_parquet('{committed(results)}')", PERMISSION)
    assert_refused(results, f"SELECT * FROM glob('{results}/*')", PERMISSION)


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("INSTALL httpfs", (PERMISSION,)),
        ("FORCE INSTALL httpfs", (PERMISSION,)),
        ("LOAD httpfs", ("Loading external extensions is disabled",)),
        ("SELECT * FROM read_parquet('https://example.com/results.parquet')", (PERMISSION,)),
    ],
)
def test_no_extension_is_installed_or_loaded_and_no_network(results: Path, sql: str, words: tuple[str, ...]) -> None:
    assert_refused(results, sql, *words)


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("", ("no SQL statement",)),
        ("  \n\t ", ("no SQL statement",)),
        ("-- only a comment", ("no SQL statement",)),
        ("/* only a comment */ ;", ("no SQL statement",)),
        ("SELECT 1; SELECT 2", ("one SQL statement", "holds 2")),
        ("SELECT count(*) FROM bench; SELECT * FROM read_text('/etc/passwd')", ("one SQL statement",)),
        ("SELEC * FROM bench; SELECT 1", ("syntax error",)),
    ],
)
def test_exactly_one_statement(results: Path, sql: str, words: tuple[str, ...]) -> None:
    assert_refused(results, sql, *words)


def test_one_statement_may_end_with_a_semicolon_and_a_comment(results: Path) -> None:
    code, out, err = query(results, "SELECT count(*) AS n FROM bench; -- the end", "--format", "json")
    assert (code, json.loads(out)) == (0, [{"n": 2}]), err


@pytest.mark.parametrize(
    "sql",
    [
        "SET enable_external_access = true",
        "RESET enable_external_access",
        "SET allowed_directories = ['/']",
        "SET allowed_paths = ['/etc/passwd']",
        "SET lock_configuration = false",
        "RESET lock_configuration",
        "SET autoinstall_known_extensions = true",
        "SET temp_directory = '/tmp'",
        "SET GLOBAL enable_external_access = true",
        "PRAGMA enable_profiling",
        "SELECT * FROM enable_logging(storage = 'file', storage_path = '/tmp/harness-query-log')",
    ],
)
def test_settings_cannot_be_unlocked(results: Path, sql: str) -> None:
    assert_refused(results, sql, "the configuration has been locked")


def test_internal_users_get_the_locked_connection(results: Path) -> None:
    """`harness report` and `load_table` use `connect` too; a refused SET leaves the lock in place."""
    with connect(results) as con:
        with pytest.raises(duckdb.Error, match="locked"):
            con.sql("SET enable_external_access = true")
        with pytest.raises(duckdb.PermissionException):
            con.sql(f"SELECT * FROM read_text('{results.parent}/secret.txt')").fetchall()
        settings = dict(con.sql("SELECT name, value FROM duckdb_settings()").fetchall())
        assert settings["enable_external_access"] == "false" and settings["lock_configuration"] == "true"
        assert settings["allowed_paths"] == settings["allowed_directories"] == "[]"
        assert con.sql("SELECT count(*) FROM bench").fetchall() == [(2,)]
    assert load_table("bench", results).num_rows == 2


def test_a_table_file_that_is_a_link_is_read_through_it(results: Path) -> None:
    """As docs/results.md says: the views read each committed file, following a link, and nothing else."""
    write_rows(results.parent / "elsewhere", "bench", "r2", [bench_row(detail="linked in")])
    (results / "bench" / "run_id=r2").symlink_to(results.parent / "elsewhere" / "bench" / "run_id=r2")
    code, out, err = query(results, "SELECT run_id, detail FROM bench WHERE run_id = 'r2'", "--format", "json")
    assert (code, json.loads(out)) == (0, [{"run_id": "r2", "detail": "linked in"}]), err


def test_a_results_folder_reached_through_a_link_works(results: Path) -> None:
    link = results.parent / "linked-results"
    link.symlink_to(results, target_is_directory=True)
    code, out, err = query(link, "SELECT count(*) AS n FROM bench", "--format", "json")
    assert (code, json.loads(out)) == (0, [{"n": 2}]), err


@pytest.fixture
def odd_results(tmp_path: Path) -> Path:
    """A results folder whose path holds a quote and glob characters, beside one its glob matches."""
    folder = tmp_path / "it's *?[x]" / "results"
    write_rows(folder, "bench", "r1", [bench_row(), bench_row(batch_size=1, p50_ms=0.37)])
    # `it's *?[x]` as a glob matches `it's abx`: read as a pattern, the view would show this row.
    write_rows(tmp_path / "it's abx" / "results", "bench", "r1", [bench_row(detail=SECRET)])
    return folder


SQL = "SELECT run_id, batch_size, p50_ms, detail, [batch_size, 2] AS xs FROM bench ORDER BY batch_size"


def test_selects_over_the_views_in_all_three_formats(odd_results: Path) -> None:
    code, out, err = query(odd_results, SQL, "--format", "json")
    assert code == 0, err
    assert json.loads(out) == [
        {"run_id": "r1", "batch_size": 1, "p50_ms": 0.37, "detail": "", "xs": [1, 2]},
        {"run_id": "r1", "batch_size": 8, "p50_ms": 0.9, "detail": "", "xs": [8, 2]},
    ]
    code, out, err = query(odd_results, SQL, "--format", "csv")
    assert code == 0, err
    assert list(csv.DictReader(io.StringIO(out))) == [
        {"run_id": "r1", "batch_size": "1", "p50_ms": "0.37", "detail": "", "xs": "[1, 2]"},
        {"run_id": "r1", "batch_size": "8", "p50_ms": "0.9", "detail": "", "xs": "[8, 2]"},
    ]
    code, out, err = query(odd_results, SQL)
    assert code == 0, err
    assert "0.37" in out and "r1" in out and SECRET not in out
    assert sorted(p.name for p in odd_results.iterdir()) == ["bench"]  # the CSV was written elsewhere


@pytest.mark.parametrize(
    "sql",
    [
        "DESCRIBE bench",
        "SUMMARIZE bench",
        "SHOW TABLES",
        "FROM bench SELECT count(*)",
        "PIVOT bench ON batch_size USING count(*)",
        "PRAGMA table_info('bench')",
        "CALL pragma_version()",
        "WITH b AS (SELECT * FROM bench) SELECT max(p50_ms) FROM b",
        "SELECT count(*) FROM checks",
    ],
)
def test_other_statements_that_read_still_run(odd_results: Path, sql: str) -> None:
    code, out, err = query(odd_results, sql, "--format", "json")
    assert code == 0, err
    assert json.loads(out)


RUNAWAY = "SELECT count(*) FROM range(10000000000000::BIGINT)"  # hours of work, and no bound of its own


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_runaway_query_stops_on_ctrl_c_and_sigterm(results: Path, sig: signal.Signals) -> None:
    """DuckDB computes in C++, where Python runs no signal handler until the query ends: the
    command interrupts the query itself. The signal comes once the command has had time to
    begin the query; sent sooner, it must stop it as well."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "query", RUNAWAY, "--results", str(results)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        time.sleep(5)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)  # it stops: never the hours the query would take
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines() == ["harness: interrupted"] and not out


def test_a_signal_while_the_query_runs_interrupts_it_in_process(results: Path) -> None:
    """The same in this process, the signal sent once DuckDB is computing (its own thread shows it)."""
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        proc = cli("query", RUNAWAY, "--results", str(results))
    finally:
        timer.cancel()
    assert (proc.returncode, proc.stderr) == (130, "harness: interrupted\n")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handler before is put back"


def test_timeout_bounds_a_query(results: Path) -> None:
    assert_usage_error(
        cli("query", RUNAWAY, "--results", str(results), "--timeout", "0.5"),
        "the query ran past --timeout 0.5 s and was stopped",
    )
    done = cli("query", "SELECT count(*) AS n FROM bench", "--results", str(results), "--timeout", "60", "--format", "csv")
    assert (done.returncode, done.stdout) == (0, "n\n2\n")
    for bad in ("0", "-1", "inf", "nan", "soon"):
        refused = cli("query", "SELECT 1", "--results", str(results), "--timeout", bad)
        assert refused.returncode == 2 and refused.stderr.startswith("harness query: error: argument --timeout: ")
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
