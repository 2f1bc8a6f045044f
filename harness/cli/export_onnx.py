"""`harness export-onnx POLICY OUT.onnx [--opset N]`: write a policy as ONNX, every family the
harness reads (docs/own-policy.md, "Exporting to ONNX")."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from harness.errors import UsageError
from harness.files import regular_file_size
from harness.store.paths import unusable

# harness.policies.export_onnx.DEFAULT_OPSET and OPSETS, repeated so that --help imports no torch
# (tests/test_export_onnx.py holds the two equal).
DEFAULT_OPSET = 11
OPSETS = range(9, 19)


def writable_file(out: Path) -> Path:
    """`out`, where a file can be written: a regular file (replaced) or a new name, its nearest
    existing folder writable (the folders between are made). Checked before the policy loads, so
    that a folder, a FIFO (whose writer waits for a reader for ever) or a device is one line."""
    try:
        if out.exists() or out.is_symlink():
            regular_file_size(out, "an ONNX file")
        existing = next(p for p in out.absolute().parents if p.exists())
    except (OSError, RuntimeError) as exc:  # a name too long; RuntimeError: a symlink loop on the way
        raise UsageError(f"OUT {out}: cannot be written: {unusable(exc)}") from None
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"OUT {out}: cannot be written: {existing} is not a folder this process can write")
    return out


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

    out = writable_file(Path(args.out))
    policy = load_policy(args.policy)
    try:
        export_onnx(policy, out, opset=args.opset)
    except OSError as exc:  # a full disk, a folder made read-only meanwhile
        raise UsageError(f"OUT {out}: cannot write: {exc.strerror or exc}") from None
    print(f"wrote {args.out} (opset {args.opset})")
    return 0
