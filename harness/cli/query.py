"""`harness query "SQL"`: DuckDB over the results, one view per table (runs, checks, episodes, bench).

The query runs in a thread of its own: while DuckDB computes, the thread that called it is inside
C++, where neither Ctrl-C nor SIGTERM's handler (harness/cluster/signals.py) runs until the query ends,
for ever in a runaway one. The main thread waits instead, takes the signal or `--timeout`, and
interrupts the query (`connection.interrupt()`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from harness.config.fields import finite_number

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

FORMATS = ("table", "csv", "json")
# What stops a query, and how often the waiting thread looks (a signal's handler runs between waits).
STOPPING = (signal.SIGINT, signal.SIGTERM)
POLL_S = 0.05
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
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="stop a query still running after S seconds: exit 2 (default: none; Ctrl-C or SIGTERM stop it, exit 130)",
    )
    parser.set_defaults(func=run)


def _seconds(text: str) -> float:
    value = finite_number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be more than 0 seconds")
    return value


def run(args: argparse.Namespace) -> int:
    from harness.store.views import connect, require_results, run_sql

    results = Path(args.results)
    require_results(results)
    signalled = threading.Event()
    with contextlib.ExitStack() as stack:
        # From before the views are made: a signal that comes while DuckDB registers them (a busy
        # machine takes seconds) would otherwise surface as DuckDB's own "Query interrupted".
        with _signals_set(signalled):
            con = stack.enter_context(connect(results))
            rows = _interruptible(con, lambda: run_sql(con, args.sql), args.timeout, signalled)
        if args.format == "table":
            # All rows up to DuckDB's display cap, never cut to the terminal's width.
            con.from_arrow(rows).show(max_width=1_000_000, max_rows=1_000_000, max_col_width=1_000_000)
        elif args.format == "csv":
            sys.stdout.write(_csv(rows))
        else:
            json.dump([_json_safe(r) for r in rows.to_pylist()], sys.stdout, default=str, allow_nan=False)
            sys.stdout.write("\n")
    return 0


def _interruptible(
    con: duckdb.DuckDBPyConnection, query: Callable[[], pa.Table], timeout: float | None, signalled: threading.Event
) -> pa.Table:
    """`query`'s rows, computed in a thread while this one waits for them, for Ctrl-C or SIGTERM
    (`signalled`, then KeyboardInterrupt) or for `timeout` (then a UsageError); either interrupts
    the query. The signals only set the flag meanwhile (`_signals_set`): raised at any point of
    this, a KeyboardInterrupt could leave the query running (the thread starting, its join
    marking it ended: CPython gh-90882)."""
    from harness.errors import UsageError

    if signalled.is_set():
        raise KeyboardInterrupt
    outcome: list[pa.Table | BaseException] = []
    done = threading.Event()

    def work() -> None:
        try:
            outcome.append(query())
        except BaseException as exc:  # handed to the main thread, which raises it
            outcome.append(exc)
        finally:
            done.set()

    deadline = math.inf if timeout is None else time.monotonic() + timeout
    threading.Thread(target=work, name="harness-query", daemon=True).start()
    while not done.wait(POLL_S) and not signalled.is_set() and time.monotonic() < deadline:
        pass
    stopped = not done.is_set()
    while not done.is_set():
        con.interrupt()  # again and again: the query may not have begun at the first
        done.wait(POLL_S)
    if signalled.is_set():
        raise KeyboardInterrupt
    if stopped:
        raise UsageError(f"the query ran past --timeout {timeout:g} s and was stopped")
    [result] = outcome
    if isinstance(result, BaseException):
        raise result
    return result


@contextlib.contextmanager
def _signals_set(flag: threading.Event) -> Iterator[None]:
    """While inside, Ctrl-C and SIGTERM set `flag` (in the main thread: elsewhere none comes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, lambda _s, _f: flag.set()) for s in STOPPING}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


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
