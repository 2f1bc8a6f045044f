"""`harness up`: warm cards between sweeps (harness/cluster/warm.py). Starts the private Ray cluster
a sweep starts for itself, with its card actors and CPU reference, says its address and stays up
until `harness down`, Ctrl-C, or its idle timeout."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

DEFAULT_IDLE_TIMEOUT_S = 1800.0  # harness.cluster.warm's, without importing Ray for --help


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "up",
        help="start warm cards that later sweeps use (--address), until harness down",
        epilog="exit: 0 once stopped (harness down, the idle timeout, Ctrl-C); 2 warm cards already up, or bad usage; "
        "3 Ray did not start",
    )
    parser.add_argument(
        "--accelerator", default="auto", metavar="KIND", help="auto, npu, cuda or cpu (simulated cards), as for a sweep"
    )
    parser.add_argument(
        "--cards", type=_positive(int), default=None, metavar="N", help="number of cards (default: as a sweep places)"
    )
    parser.add_argument(
        "--idle-timeout",
        type=_positive(float),
        default=DEFAULT_IDLE_TIMEOUT_S,
        metavar="S",
        help=f"stop after S seconds without a sweep (default {DEFAULT_IDLE_TIMEOUT_S:g})",
    )
    parser.set_defaults(func=run)


def _positive(type_: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = type_(text)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(text)
        return value

    parse.__name__ = f"positive {getattr(type_, '__name__', 'number')}"  # argparse names the type in its error
    return parse


def run(args: argparse.Namespace) -> int:
    from harness.cluster.warm import up
    from harness.devices import resolve_accelerator

    up(resolve_accelerator(args.accelerator), args.cards, args.idle_timeout)
    return 0
