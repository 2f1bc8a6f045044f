"""`harness bench`: latency, throughput across cards, closed-loop decisions/s."""

from __future__ import annotations

import argparse
import sys

from harness.config.fields import add_arguments
from harness.config.options import BenchConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench", help="latency, throughput across cards, closed-loop decisions/s, the server scenario; audits the timed path"
    )
    add_arguments(parser, BenchConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The options are checked before the driver (torch, Ray) is imported: a mistake is answered at once."""
    from harness.api import run_bench_config
    from harness.config.options import config_from_args

    return run_bench_config(config_from_args(args, BenchConfig), command=" ".join(sys.argv)).exit_code
