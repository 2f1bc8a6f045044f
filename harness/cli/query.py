"""`harness query "SQL"`: DuckDB over the results, one view per table (runs, checks, episodes, bench)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

FORMATS = ("table", "csv", "json")
EXAMPLE = 'harness query "SELECT run_id, policy, dtype, kind, detail FROM checks WHERE NOT passed"'


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "query",
        help="SQL over the results (views: runs, checks, episodes, bench)",
        description="Run one SQL statement (DuckDB) over the Parquet results. Each table is a view of the same name, "
        "with the run id as a VARCHAR column run_id. The query reads those views (their own Parquet files) and no "
        "other file: it cannot write files, install or load extensions, or change DuckDB's settings. "
        f"Example: {EXAMPLE}",
    )
    parser.add_argument("sql", help="one SQL statement that reads: SELECT, DESCRIBE, SUMMARIZE, PIVOT, ...")
    parser.add_argument(
        "--results", default="results", metavar="DIR", help="folder of the Parquet datasets (default: results)"
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.store.views import connect, require_results, run_sql

    results = Path(args.results)
    require_results(results)
    with connect(results) as con:
        rows = run_sql(con, args.sql)
        if args.format == "table":
            # All rows up to DuckDB's display cap, never cut to the terminal's width.
            con.from_arrow(rows).show(max_width=1_000_000, max_rows=1_000_000, max_col_width=1_000_000)
        elif args.format == "csv":
            sys.stdout.write(_csv(rows))
        else:
            json.dump([_json_safe(r) for r in rows.to_pylist()], sys.stdout, default=str, allow_nan=False)
            sys.stdout.write("\n")
    return 0


def _csv(rows: pa.Table) -> str:
    # DuckDB's writer handles every type a query can return (lists, structs, timestamps); it
    # writes files only, and COPY to /dev/stdout would truncate a redirected output file. The
    # query's connection may write no file at all, so a connection of its own writes this one.
    import duckdb

    with tempfile.TemporaryDirectory() as tmp, duckdb.connect() as writer:
        path = Path(tmp) / "out.csv"
        writer.from_arrow(rows).write_csv(str(path), header=True)
        return path.read_text()


def _json_safe(value: Any) -> Any:
    """NaN and inf (errors of a card that produced nothing) become null: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value
