"""`harness sweep`: validate policies on every card against each other and the CPU."""

from __future__ import annotations

import argparse
import shlex
import sys

from harness.config.fields import add_arguments
from harness.config.options import SweepConfig

EPILOG = (
    "exit: 0 every gating check passed, 1 a gating check failed, 2 bad usage, config or input, 3 incomplete: a card "
    "or node was lost or hung and the cluster could not recover, Ray did not start, or the results could not be "
    "written; the finished units are kept, and the command printed (--resume RUN_ID) runs the rest; 130 interrupted "
    "(Ctrl-C, SIGTERM), resumable the same way"
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sweep", help="validate policies on every card against each other and the CPU", epilog=EPILOG
    )
    add_arguments(parser, SweepConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, name: str = "harness", again: str = "harness sweep") -> int:
    """The sweep, as the entry point `name` runs it; `again` is how that entry point is run to
    resume (DASHBOARD in it stands for the cluster's dashboard). The options are checked before
    the driver (torch, Ray) is imported: a mistake is answered at once."""
    from harness.api import run_sweep_config
    from harness.config.fields import config_from, given_by_args
    from harness.config.options import validate

    # The options given, not only their values: --resume refuses one that differs from the run's.
    given = given_by_args(args, SweepConfig)
    result = run_sweep_config(validate(config_from(SweepConfig, given)), command=" ".join(sys.argv), given=set(given.values))
    if result.exit_code not in (0, 1):
        why = f"{result.reason}; " if result.reason else ""
        if result.resume_args:
            command = f"{again.replace('DASHBOARD', result.dashboard or 'DASHBOARD')} {shlex.join(result.resume_args)}"
            print(f"{name}: {result.status}: {why}finish it with: {command}", file=sys.stderr)
        else:
            print(f"{name}: {result.status}: {why}nothing was kept: run it again", file=sys.stderr)
    return result.exit_code
