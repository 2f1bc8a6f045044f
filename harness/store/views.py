"""Reading results back: one DuckDB view per table, and pyarrow (or pandas) Tables for Python.

Every view has the full column set of `harness.store.schema.SCHEMAS` plus `run_id` (VARCHAR, taken
from the hive partition path), even when a table has no files yet: a results folder that holds
only `bench`, or only a sweep, answers every query that names the other tables with no rows.

The views read the Parquet files through pyarrow; the DuckDB connection itself is locked once
they exist: it opens no file, installs and loads no extension, and its settings cannot change.

A run is seen whole or not at all, while runs write beside the reader: `runs` is read first, as
it is at that moment, and the other views hold the rows of the runs it shows published (their
status in `PUBLISHED`, written after every other table of the run is in place) and of folders
with no `runs` row (tables written by hand). A run that is running, or publishing, shows its
`runs` row alone.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from harness.errors import UsageError, first_line
from harness.store.paths import RUN_ID, STAGING, unusable
from harness.judge.outcome import PUBLISHED
from harness.store.schema import SCHEMAS, TABLES
from harness.store.writer import read_staged

if TYPE_CHECKING:
    import pandas


def table_schema(name: str) -> pa.Schema:
    """A view's columns: run_id first, as docs/results.md lists them, then the row's fields."""
    return pa.schema([pa.field("run_id", pa.string()), *SCHEMAS[name]])


def parquet_files(results: Path, name: str, withheld: frozenset[str] = frozenset()) -> list[Path]:
    # Only the committed files: `.staging` lives beside the tables, and in-flight writes are
    # hidden `.part-0.parquet.<uuid>.tmp` names that do not end in `.parquet`.
    files = sorted((results / name).glob("run_id=*/*.parquet"))
    return [f for f in files if f.parent.name.removeprefix("run_id=") not in withheld]


def require_results(results: Path) -> None:
    """A folder with no committed Parquet at all is a mistake worth one clear line."""
    try:
        folder = results.is_dir()
    except OSError as exc:  # a name too long; a loop or a file on the way reads as no folder
        raise UsageError(f"results folder {results}: cannot be read: {unusable(exc)}") from None
    if not folder:
        raise UsageError(
            f"results folder {results} does not exist (run `harness sweep --results {results}` first, or pass --results DIR)"
        )
    if not any(parquet_files(results, name) for name in TABLES):
        raise UsageError(f"results folder {results} holds no results (run `harness sweep --results {results}` first)")


# What a sweep stages per unit while it runs (harness/store/writer.py).
STAGED_TABLES = ("checks", "episodes")


def _dataset(results: Path, name: str, withheld: frozenset[str] = frozenset()) -> ds.Dataset:
    """A table's committed files as one dataset with the view's columns, `run_id` from the folder name.

    Files are listed here rather than globbed so that a results path holding `*`, `?` or `[` is
    read literally (DuckDB globs every path it is given, a listed one too). The explicit schema
    fixes columns and types: files written by an older harness that lack a column read as null.
    """
    schema = table_schema(name)
    return ds.dataset(
        [str(f) for f in parquet_files(results, name, withheld)],
        schema=schema,
        format="parquet",
        partitioning=ds.HivePartitioning(pa.schema([schema.field("run_id")]), segment_encoding="none"),
        partition_base_dir=str(results / name),
    )


def staged_units(results: Path, name: str) -> pa.Table:
    """The `checks` or `episodes` rows of the units that runs which have not finished have done
    so far (their staging, harness/store/writer.py), with the view's columns. A run whose files
    are committed is left out, should its staging still be there."""
    committed = {p.parent.name.removeprefix("run_id=") for p in parquet_files(results, name)}
    parts = []
    for folder in sorted((results / STAGING).glob("*")):
        if folder.is_dir() and RUN_ID.fullmatch(folder.name) and folder.name not in committed:
            checks, episodes = read_staged(folder)
            rows = checks if name == "checks" else episodes
            parts.append(rows.add_column(0, "run_id", pa.array([folder.name] * rows.num_rows, pa.string())))
    return pa.concat_tables(parts) if parts else table_schema(name).empty_table()


def connect(results: str | Path = "results", staged: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the views `runs`, `checks`, `episodes`, `bench`, locked.

    With `staged`, `checks` and `episodes` also hold the units done so far by runs that have not
    finished (`harness report` of such a run); `harness query` sees only what is committed."""
    results = Path(results)
    con = duckdb.connect()
    runs = _runs_now(results)
    withheld = frozenset(
        r for r, status in zip(runs["run_id"].to_pylist(), runs["status"].to_pylist(), strict=True) if status not in PUBLISHED
    )
    for name in TABLES:
        con.register(f"_{name}", runs if name == "runs" else _dataset(results, name, withheld))
        if staged and name in STAGED_TABLES:
            con.register(f"_staged_{name}", staged_units(results, name))
            con.sql(f"CREATE VIEW {name} AS SELECT * FROM _{name} UNION ALL BY NAME SELECT * FROM _staged_{name}")
        else:
            con.sql(f"CREATE VIEW {name} AS SELECT * FROM _{name}")
    _lock(con)
    return con


def _runs_now(results: Path) -> pa.Table:
    """The `runs` table as it is now, read before the other tables are listed."""
    try:
        return _dataset(results, "runs").to_table()
    except (OSError, pa.ArrowException) as exc:
        raise UsageError(f"results folder {results}: its runs table cannot be read: {first_line(exc)}") from None


# Set in this order once the views exist, then locked. Extensions: a query that needs one not
# loaded (httpfs for a URL) fails rather than fetch it. No temporary directory: DuckDB would spill
# large intermediates into `.tmp` in the working directory. External access off, with no path
# allowed (allowed_paths and allowed_directories stay empty): no statement opens a file, so COPY,
# ATTACH and EXPORT have nowhere to write, and no Python variable is scanned by name. SET after
# `duckdb.connect`, not given to it: given there, enable_external_access = false leaves the
# in-memory database's own names (":memory:", ":memory:.wal") writable in the working directory.
_LOCK = (
    "autoinstall_known_extensions = false",
    "autoload_known_extensions = false",
    "temp_directory = ''",
    "enable_external_access = false",
    "lock_configuration = true",
)


def _lock(con: duckdb.DuckDBPyConnection) -> None:
    """From here on the connection opens no file and its settings stay as they are."""
    for setting in _LOCK:
        con.execute(f"SET {setting}")


def sql_error_line(exc: duckdb.Error) -> str:
    """DuckDB's message cut to one line, with a useful hint for an unknown table."""
    message = first_line(exc)
    missing = re.search(r"Table with name (\S+) does not exist", message)
    if missing:
        return f"unknown table {missing.group(1)}; the tables are {', '.join(TABLES)}"
    if isinstance(exc, duckdb.PermissionException):
        return f"{message} (a query reads the views {', '.join(TABLES)} and no file)"
    return message


def check_statement(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse anything but exactly one statement, as DuckDB's own parser splits them."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise UsageError(sql_error_line(exc)) from None
    if not statements:  # empty, blank or only comments
        raise UsageError('the query holds no SQL statement: give one, such as "SELECT * FROM runs"')
    if len(statements) > 1:
        raise UsageError(f"harness query runs one SQL statement at a time; this query holds {len(statements)}")


def run_sql(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run one user statement and return its rows; a refused or bad statement is a UsageError."""
    check_statement(con, sql)
    try:
        relation = con.sql(sql)
        return relation.to_arrow_table() if relation is not None else pa.table({})
    except duckdb.Error as exc:
        raise UsageError(sql_error_line(exc)) from None


def check_table_name(name: str) -> None:
    if name not in TABLES:
        close = difflib.get_close_matches(name, TABLES, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"unknown table {name!r}: {hint}available: {', '.join(TABLES)}")


def load_table(name: str, results: str | Path = "results", run_id: str | None = None) -> pa.Table:
    """One table of a results folder as a pyarrow Table, all runs or only `run_id`.

    A table with no files yet comes back empty with its full schema.
    """
    check_table_name(name)
    if not Path(results).is_dir():
        raise UsageError(f"results folder {results} does not exist")
    with connect(results) as con:
        if run_id is None:
            return con.sql(f"SELECT * FROM {name}").to_arrow_table()
        return con.sql(f"SELECT * FROM {name} WHERE run_id = $run_id", params={"run_id": run_id}).to_arrow_table()


def load_dataframe(name: str, results: str | Path = "results", run_id: str | None = None) -> pandas.DataFrame:
    """`load_table` as a pandas DataFrame; pandas is optional and not installed with harness."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        raise ImportError(
            "load_dataframe needs pandas, which is not installed: `pip install pandas`, or use load_table for a pyarrow Table"
        ) from None
    return load_table(name, results, run_id).to_pandas()


def run_ids(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every run in the folder, latest first by `runs.started_at`; runs with no `runs` row last."""
    rows = con.sql(
        """
        SELECT run_id, max(try_cast(started_at AS TIMESTAMPTZ)) AS started FROM (
            SELECT run_id, started_at FROM runs
            UNION ALL SELECT run_id, NULL FROM checks
            UNION ALL SELECT run_id, NULL FROM episodes
            UNION ALL SELECT run_id, NULL FROM bench)
        GROUP BY run_id ORDER BY started DESC NULLS LAST, run_id DESC
        """
    ).fetchall()
    return [r[0] for r in rows]


def resolve_run(con: duckdb.DuckDBPyConnection, run_id: str | None) -> str:
    """The latest run when none is named; else the run named, or the only one it is a prefix of."""
    ids = run_ids(con)
    if not ids:
        raise UsageError("the results folder holds no runs")
    if run_id is None:
        return ids[0]
    if run_id in ids:
        return run_id
    prefixed = [i for i in ids if i.startswith(run_id)]
    if len(prefixed) == 1:
        return prefixed[0]
    if prefixed:
        raise UsageError(f"run id prefix {run_id!r} matches {len(prefixed)} runs: {', '.join(prefixed[:5])}")
    raise UsageError(f"unknown run id {run_id!r}; latest runs: {', '.join(ids[:5])}")
