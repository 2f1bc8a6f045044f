"""`harness sweep`: validate policies on every card against each other and the CPU."""

from __future__ import annotations

import argparse
import shlex
import sys

from harness.run.options import SweepConfig, add_arguments

# Exit code of a run that ended early (the cluster lost or hung a card): nothing failed yet,
# the finished units are kept, and `--resume` completes the run.
INCOMPLETE = 3


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="validate policies on every card against each other and the CPU",
        epilog="exit: 0 every gating check passed, 1 a gating check failed, 2 bad usage, config or input, "
        "3 incomplete: a card or node was lost or hung and the cluster could not recover; the finished units are "
        "kept, and the command printed (--resume RUN_ID) runs the rest; or the run lost its run id to another process "
        "(its staging removed, or taken over) and published nothing",
    )
    add_arguments(parser, SweepConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, name: str = "harness", again: str = "harness sweep") -> int:
    """The sweep, as the entry point `name` runs it; `again` is how that entry point is run to
    resume (DASHBOARD in it stands for the cluster's dashboard)."""
    from harness.errors import RunLost
    from harness.run.options import config_from_args
    from harness.run.sweep import run_sweep

    try:
        outcome = run_sweep(config_from_args(args, SweepConfig), command=" ".join(sys.argv))
    except RunLost as exc:
        print(f"{name}: stopped: {exc}", file=sys.stderr)
        return INCOMPLETE
    if outcome.status == "incomplete":
        command = f"{again.replace('DASHBOARD', outcome.dashboard or 'DASHBOARD')} {shlex.join(outcome.resume_args)}"
        print(f"{name}: incomplete: finish it with: {command}", file=sys.stderr)
        return INCOMPLETE
    return 0 if outcome.passed else 1
