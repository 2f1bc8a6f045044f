"""`harness bench`: latency, throughput across cards, closed-loop decisions/s."""

from __future__ import annotations

import argparse
import sys

from harness.run.option_fields import add_arguments
from harness.run.options import BenchConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench", help="latency, throughput across cards, closed-loop decisions/s, the server scenario; audits the timed path"
    )
    add_arguments(parser, BenchConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The options are checked before the driver (torch, Ray) is imported: a mistake is answered at once."""
    from harness.run.command_plan import bench_plan
    from harness.run.options import config_from_args
    from harness.run.phases import Phases

    plan = bench_plan(config_from_args(args, BenchConfig))
    phases = Phases()
    with phases("imports"):
        from harness.run.bench import run_bench

    outcome = run_bench(plan, command=" ".join(sys.argv), phases=phases)
    return 0 if outcome.passed else 1
