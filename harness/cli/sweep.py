"""`harness sweep`: validate policies on every card against each other and the CPU."""

from __future__ import annotations

import argparse
import shlex
import sys

from harness.run.option_fields import add_arguments
from harness.run.options import SweepConfig

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
    from harness.run.command_plan import sweep_plan
    from harness.run.option_fields import values_from_args
    from harness.run.options import validate
    from harness.run.phases import Phases

    given = values_from_args(args, SweepConfig)
    plan = sweep_plan(validate(SweepConfig(**given)), set(given))
    phases = Phases()
    with phases("imports"):
        from harness.run.lifecycle import EXIT_CODES
        from harness.run.sweep import run_sweep

    outcome = run_sweep(plan, command=" ".join(sys.argv), phases=phases)
    if outcome.status in EXIT_CODES:
        why = f"{outcome.reason}; " if outcome.reason else ""
        if outcome.resume_args:
            command = f"{again.replace('DASHBOARD', outcome.dashboard or 'DASHBOARD')} {shlex.join(outcome.resume_args)}"
            print(f"{name}: {outcome.status}: {why}finish it with: {command}", file=sys.stderr)
        else:
            print(f"{name}: {outcome.status}: {why}nothing was kept: run it again", file=sys.stderr)
        return EXIT_CODES[outcome.status]
    return 0 if outcome.passed else 1
