"""`*.onnx`: an ML-Agents export (its known layout, read node by node), else any graph."""

from __future__ import annotations

from pathlib import Path

from harness.policies.base import ActionKind, PolicyNet


def load_onnx(path: Path, onnx_output: str | None, action_kind: ActionKind | None) -> PolicyNet:
    from harness.policies.mlagents_onnx import load_mlagents_onnx

    return load_mlagents_onnx(path)
