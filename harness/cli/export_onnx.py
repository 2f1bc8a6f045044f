"""`harness export-onnx POLICY OUT.onnx`: write a policy as ONNX (ML-Agents layout for continuous ones)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("export-onnx", help="export a policy to ONNX (ML-Agents names for continuous policies)")
    parser.add_argument("policy", help="policy name or path")
    parser.add_argument("out", help="output .onnx path")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.policies import load_policy
    from harness.policies.export_onnx import export_onnx

    export_onnx(load_policy(args.policy), Path(args.out))
    print(f"wrote {args.out}")
    return 0
