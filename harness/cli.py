"""`harness` command line. Heavy imports (torch, Ray) happen inside the subcommands so that
`harness --help` is instant. Exit codes: 0 every check passed, 1 a check failed, 2 bad usage."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from harness.errors import UsageError


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake in one line, like every other error of ours."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def cmd_info(args: argparse.Namespace) -> int:
    from harness.info import print_info

    print_info(args.json, args.address)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from harness.config import config_from_args
    from harness.sweep import run_sweep

    outcome = run_sweep(config_from_args(args), command=" ".join(sys.argv))
    return 0 if outcome.passed else 1


def cmd_export_onnx(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.export_onnx import export_onnx
    from harness.policies import load_policy

    export_onnx(load_policy(args.policy), Path(args.out))
    print(f"wrote {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from harness.config import add_sweep_arguments

    parser = Parser(prog="harness", description="Prove an accelerator port of an RL policy right, and measure its speed.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = sub.add_parser("info", help="versions, accelerators found, Ray resources")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.add_argument("--address", help="also list the resources of this Ray cluster")
    info.set_defaults(func=cmd_info)

    sweep = sub.add_parser("sweep", help="validate policies on every card against each other and the CPU")
    add_sweep_arguments(sweep)
    sweep.set_defaults(func=cmd_sweep)

    export = sub.add_parser("export-onnx", help="export a policy to ONNX (ML-Agents names for continuous policies)")
    export.add_argument("policy", help="policy name or path")
    export.add_argument("out", help="output .onnx path")
    export.set_defaults(func=cmd_export_onnx)

    for name, register in _optional_commands().items():
        register(sub)
    return parser


def _optional_commands() -> dict[str, Callable[[argparse._SubParsersAction], None]]:
    """Subcommands that live in their own modules and register their own flags."""
    commands = {}
    for module_name in ("bench", "query", "report"):
        try:
            module = __import__(f"harness.{module_name}_cli", fromlist=["register"])
        except ModuleNotFoundError:
            continue
        commands[module_name] = module.register
    return commands


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


if __name__ == "__main__":
    sys.exit(main())
