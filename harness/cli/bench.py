"""`harness bench`: latency, throughput across cards, closed-loop decisions/s."""

from __future__ import annotations

import argparse
import sys

from harness.run.options import BenchConfig, add_arguments


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench", help="latency, throughput across cards, closed-loop decisions/s, the server scenario; audits the timed path"
    )
    add_arguments(parser, BenchConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.cli.sweep import INCOMPLETE
    from harness.errors import RunLost
    from harness.run.bench import run_bench
    from harness.run.options import config_from_args

    try:
        outcome = run_bench(config_from_args(args, BenchConfig), command=" ".join(sys.argv))
    except RunLost as exc:
        print(f"harness: stopped: {exc}", file=sys.stderr)
        return INCOMPLETE
    return 0 if outcome.passed else 1
