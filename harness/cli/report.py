"""`harness report [RUN_ID] [--out DIR]` and `harness report --compare RUN_A RUN_B [--out DIR]`.

The exit code follows the run reported (harness/judge/outcome.py): 0 passed (or a bench whose
audit passed), 1 a gating check failed (or nothing was proved), 3 the run has not finished (the
command that finishes it on stderr); with --compare 1 when B regressed against A; 2 for bad input
such as an unknown run id.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from harness.config.fields import finite_number


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="what a run found: verdicts, failed checks, precision; a sign-off page with --out",
        description="Report one run (the latest by default) in the terminal; with --out also its sign-off page, one "
        "self-contained HTML file. With --compare, how RUN_A and RUN_B were made differently and what got worse.",
        epilog="exit: 0 passed (or a bench whose audit passed), 1 a gating check failed or nothing was proved, "
        "3 the run has not finished (stderr says how to finish it); --compare: 1 when B regressed; 2 bad input",
    )
    parser.add_argument(
        "run_id", nargs="?", metavar="RUN_ID", help="run to report, or a unique prefix of its id (default: the latest started)"
    )
    parser.add_argument(
        "--results", default="results", metavar="DIR", help="folder of the Parquet datasets (default: results)"
    )
    parser.add_argument(
        "--out", metavar="DIR", help="write the sign-off page into DIR: report-RUN_ID.html (compare-RUN_A-RUN_B.html)"
    )
    parser.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="show what got worse from RUN_A to RUN_B")
    parser.add_argument(
        "--error-factor",
        type=finite_number,
        default=2.0,
        help="with --compare: flag max_abs that grew more than this factor (default: 2)",
    )
    parser.add_argument(
        "--drop-percent",
        type=finite_number,
        default=10.0,
        help="with --compare: flag decisions/s that dropped more than this (default: 10)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.errors import UsageError
    from harness.store.paths import check_run_id, check_writable_folder
    from harness.store.views import connect, require_results, resolve_run

    results = Path(args.results)
    if args.out is not None:
        check_writable_folder(Path(args.out), "--out")
    if args.compare and args.run_id:
        raise UsageError("--compare RUN_A RUN_B takes no RUN_ID")
    for where, run_id in [("RUN_ID", args.run_id), *(("--compare", r) for r in args.compare or [])]:
        if run_id is not None:
            check_run_id(run_id, where)
    require_results(results)
    with connect(results, staged=True) as con:
        if args.compare:
            from harness.report.run_diff import Thresholds, compare_runs, print_diff

            thresholds = Thresholds(args.error_factor, args.drop_percent)
            diff = compare_runs(con, resolve_run(con, args.compare[0]), resolve_run(con, args.compare[1]), thresholds)
            print_diff(diff, sys.stdout)
            if args.out:
                from harness.report.diff_page import write_diff_page

                print(f"\nwrote {_page(lambda: write_diff_page(con, diff, results, Path(args.out)), args.out)}")
            return 1 if diff.regressed else 0

        from harness.report.run_report import build_report, print_report

        report = build_report(con, resolve_run(con, args.run_id), results)
        print_report(report, sys.stdout)
        if args.out:
            from harness.report.run_page import write_page

            print(f"\nwrote {_page(lambda: write_page(con, report, Path(args.out)), args.out)}")
        if report.next_step():
            print(f"harness: {str(report.verdict).lower()}: {report.next_step()}", file=sys.stderr)
        return report.exit_code


def _page(write: Callable[[], Path], out: str) -> Path:
    """The page `write` made; a folder the checks let through that the system still refuses (as
    root, `os.access` says yes to /proc) is a one-line error, the report above it printed."""
    from harness.errors import UsageError
    from harness.store.paths import unusable

    try:
        return write()
    except OSError as exc:
        raise UsageError(f"--out {out}: the page cannot be written there: {unusable(exc)}") from None
