"""`harness diagnose RUN_ID`: after a failed sweep, the layers to keep in float32 so that each
failing float16 or bfloat16 passes (harness/diagnose/search.py); prints each step of the search and
the path of the plan file, which `harness sweep --keep-float32 PLAN` verifies."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="after a FAIL: the fewest layers to keep in float32 for a failing dtype to pass, as a plan file",
        description="For each policy and float16/bfloat16 whose port or closed-loop verdict failed in RUN_ID, search "
        "the fewest layers to compute in float32 for which it passes every check (bisection over the layers in "
        "forward order, then linear refinement), on the run's own cards and faults. Prints each step and the path "
        "of the plan; `harness sweep --keep-float32 PLAN` verifies it.",
        epilog="exit: 0 a plan was found for every failing dtype (or nothing needed one), 1 none passes even with "
        "every layer in float32, 2 bad input, 3 Ray did not start or the run has not finished (stderr says how to finish it)",
    )
    rerun_arguments(parser, "search")
    parser.set_defaults(func=run)


def rerun_arguments(parser: argparse.ArgumentParser, doing: str) -> None:
    """RUN_ID, --results and --address: of the commands that run units of a failed sweep again."""
    parser.add_argument("run_id", metavar="RUN_ID", help="the failed sweep")
    parser.add_argument(
        "--results", default="results", metavar="DIR", help="folder of the Parquet datasets (default: results)"
    )
    parser.add_argument(
        "--address", default=None, metavar="ADDR", help=f"Ray cluster to {doing} on (default: the run's own, else a local Ray)"
    )


def run(args: argparse.Namespace) -> int:
    from harness.diagnose.search import diagnose
    from harness.config.precision_plan import read_plan
    from harness.store.paths import check_run_id
    from harness.store.views import require_results

    check_run_id(args.run_id, "RUN_ID")
    results = Path(args.results)
    require_results(results)
    path = diagnose(results, args.run_id, args.address)
    if path is None:
        return 0
    print(f"plan: {path}")
    return 0 if all(p.verified for p in read_plan(path).plans) else 1
