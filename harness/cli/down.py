"""`harness down`: stop the warm cards `harness up` started."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "down", help="stop the warm cards of harness up", epilog="exit: 0 stopped; 2 no warm cards up there"
    )
    parser.add_argument(
        "--address", default=None, metavar="ADDR", help="the warm cards' address (default: those harness up recorded)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.cluster.warm_record import Recorded, adopt_auth

    recorded = Recorded.read()
    target = args.address or (recorded.address if recorded else None)
    adopt_auth(target)  # before Ray's import, which harness.cluster.warm takes
    from harness.cluster.warm import down

    print(f"warm cards at {down(target, recorded)}: down")
    return 0
