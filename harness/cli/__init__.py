"""The `harness` command: one module per subcommand, registered here explicitly. Heavy imports
(torch, onnx, Ray) happen inside each command's `run`, after its options are checked, so `--help`,
a usage mistake and `harness query` never import torch (tests/test_cli_imports.py). Exit codes: 0
every check passed, 1 a check failed, 2 bad usage (one line on stderr, no traceback), 3 a run that
ended incomplete (a card or node lost or hung, Ray that did not start, results that could not be
written; a sweep is resumable), 130 interrupted (Ctrl-C or SIGTERM; a sweep is resumable)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, NoReturn

from harness.cli import bench, diagnose, down, export_onnx, info, query, report, repro, sweep, up
from harness.errors import InfrastructureError, RunLost, RunUnfinished, UsageError, one_line
from harness.registry import Registry
from harness.cluster.signals import sigterm_interrupts

# By the name each module registers its subcommand as, in the order `harness --help` lists them.
# A module that fails to import fails the command line, loudly: a subcommand never goes missing
# in silence.
COMMANDS: Registry[ModuleType] = Registry(
    "command",
    {
        "info": info,
        "sweep": sweep,
        "bench": bench,
        "query": query,
        "report": report,
        "export-onnx": export_onnx,
        "diagnose": diagnose,
        "repro": repro,
        "up": up,
        "down": down,
    },
)


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake in one line, like every other error of ours."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # Python 3.11's argparse drops the value of `--cards=--` as if it were the end of the
        # options and hands the option an empty list, which no option's code expects.
        # A positional of one value given as `--` after `--` is handed an empty list the same way.
        if arg_strings == ["--"] and (action.option_strings or action.nargs is None):
            self.error(
                f"argument {'/'.join(action.option_strings) or action.metavar or action.dest}: expected a value, not --"
            )
        return super()._get_values(action, arg_strings)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="harness",
        description="Prove an accelerator port of an RL policy right, and measure its speed.",
        epilog="exit codes: 0 every gating check passed; 1 a gating check failed; 2 bad usage, config or input "
        "(one line on stderr, before Ray starts); 3 a run ended incomplete: the cluster lost or hung a card or "
        "node and could not recover, Ray did not start, or the results could not be written (a full or failing "
        "disk); a sweep's finished units are kept, and `harness sweep --resume RUN_ID` finishes it; 130 "
        "interrupted (Ctrl-C, SIGTERM), resumable the same way",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if words and not words[0].startswith("-") and words[0] not in COMMANDS:
        return answer(lambda: _unknown(words[0]))
    args = build_parser().parse_args(words)
    return answer(lambda: int(args.func(args)))


def _unknown(command: str) -> int:
    raise COMMANDS.unknown(command)


def answer(command: Callable[[], int], name: str = "harness") -> int:
    """Run `command` and end as every entry point (`name`) ends: its exit code, and for a mistake,
    a machine's failure or an interrupt, one line on stderr and no traceback."""
    try:
        with sigterm_interrupts():
            return command()
    except UsageError as exc:
        print(f"{name}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except InfrastructureError as exc:  # a sweep says this with its resume command; here before a run exists
        print(f"{name}: incomplete: {one_line(str(exc))}", file=sys.stderr)
        return 3
    except RunLost as exc:  # another process holds the run now: this one published nothing, and says no verdict
        print(f"{name}: stopped: {one_line(str(exc))}", file=sys.stderr)
        return 3
    except RunUnfinished as exc:
        print(f"{name}: unfinished: {one_line(str(exc))}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`harness query ... | head`): not an error of ours or theirs.
        sys.stderr.close()
        return 0
