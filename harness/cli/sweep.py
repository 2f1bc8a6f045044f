"""`harness sweep`: validate policies on every card against each other and the CPU."""

from __future__ import annotations

import argparse
import sys

from harness.run.options import SweepConfig, add_arguments


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("sweep", help="validate policies on every card against each other and the CPU")
    add_arguments(parser, SweepConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.run.options import config_from_args
    from harness.run.sweep import run_sweep

    outcome = run_sweep(config_from_args(args, SweepConfig), command=" ".join(sys.argv))
    return 0 if outcome.passed else 1
