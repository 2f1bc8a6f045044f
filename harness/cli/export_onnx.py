"""`harness export-onnx POLICY OUT.onnx [--opset N]`: write a policy as ONNX, every family the
harness reads (README, "Exporting to ONNX")."""

from __future__ import annotations

import argparse
from pathlib import Path

# harness.policies.export_onnx.DEFAULT_OPSET and OPSETS, repeated so that --help imports no torch
# (tests/test_export_onnx.py holds the two equal).
DEFAULT_OPSET = 11
OPSETS = range(9, 19)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "export-onnx",
        help="export a policy to ONNX for deployment (ATC, onnxruntime, Unity): the head and the deterministic action",
    )
    parser.add_argument("policy", help="policy name or path")
    parser.add_argument("out", help="output .onnx path")
    parser.add_argument(
        "--opset",
        type=int,
        default=DEFAULT_OPSET,
        choices=OPSETS,
        metavar="N",
        help=f"ONNX opset, {OPSETS.start} to {OPSETS.stop - 1} (default {DEFAULT_OPSET}: Ascend's ATC takes it in every "
        "CANN release that states a range)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.policies import load_policy
    from harness.policies.export_onnx import export_onnx

    export_onnx(load_policy(args.policy), Path(args.out), opset=args.opset)
    print(f"wrote {args.out} (opset {args.opset})")
    return 0
