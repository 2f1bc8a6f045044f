"""The `harness` command: one module per subcommand, registered here explicitly. Heavy imports
(torch, Ray) happen inside each command's `run`, so `harness --help` is instant. Exit codes: 0
every check passed, 1 a check failed, 2 bad usage (one line on stderr, no traceback), 3 a sweep
that ended incomplete (a card or node lost or hung; resumable)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from harness.cli import bench, export_onnx, info, query, report, sweep
from harness.errors import UsageError

# In the order `harness --help` lists them. A module that fails to import fails the command
# line, loudly: a subcommand never goes missing in silence.
COMMANDS = (info, sweep, bench, query, report, export_onnx)


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake in one line, like every other error of ours."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="harness",
        description="Prove an accelerator port of an RL policy right, and measure its speed.",
        epilog="exit codes: 0 every gating check passed; 1 a gating check failed; 2 bad usage, config or input "
        "(one line on stderr, before Ray starts); 3 a sweep ended incomplete: the cluster lost or hung a card or "
        "node and could not recover, the finished units are kept, and `harness sweep --resume RUN_ID` finishes it",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`harness query ... | head`): not an error of ours or theirs.
        sys.stderr.close()
        return 0
