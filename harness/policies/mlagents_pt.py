"""ML-Agents `.pt` checkpoints (the Huggy format): a `Policy` state dict of a SimpleActor; and the
other `.pt` that must never be read as one, a TorchScript module, refused by name."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

import torch

from harness.errors import PolicyLoadError, first_line
from harness.files import read_whole, sha256_of
from harness.policies.base import PolicyNet
from harness.policies.loader import Peek, PolicyFormat, PolicySpec
from harness.policies.mlagents import LayoutError, weights_from_state_dict

# Read once, into memory, so that the bytes hashed are the bytes loaded. An ML-Agents actor is an
# MLP: its checkpoint, critic and optimizer state included, is megabytes (Huggy's weights: 2.3 MB).
MAX_CHECKPOINT_BYTES = 256 * 1024 * 1024
# torch.save writes a zip whose members sit in one folder (`<name>/data.pkl`, `<name>/data/0`, ...);
# before torch 1.6 it wrote a pickle stream, which starts with the PROTO opcode.
PICKLE_MAGIC = b"\x80"


def _is_torchscript(peek: Peek) -> bool:
    """torch.jit.save's archive: the same zip as torch.save's, with the module's code in it."""
    return peek.zip_members is not None and any("/code/" in m or m.endswith("/constants.pkl") for m in peek.zip_members)


class MLAgentsCheckpoint(PolicyFormat):
    name = "mlagents-pt"
    suffixes = (".pt",)
    what = "a torch.save checkpoint (a zip with data.pkl, or a pickle stream) that is no TorchScript module"

    @classmethod
    def claims(cls, peek: Peek) -> bool:
        if peek.zip_members is None:
            return peek.head.startswith(PICKLE_MAGIC)
        return any(m.endswith("/data.pkl") for m in peek.zip_members) and not _is_torchscript(peek)

    @classmethod
    def load(cls, path: Path, spec: PolicySpec) -> PolicyNet:
        return load_mlagents_pt(path)


class TorchScript(PolicyFormat):
    """Claimed so that it is refused by what it is: its loader would have to run its code."""

    name = "torchscript"
    suffixes = (".pt",)
    what = "a torch.jit.save archive (a zip with the module's code)"

    @classmethod
    def claims(cls, peek: Peek) -> bool:
        return _is_torchscript(peek)

    @classmethod
    def load(cls, path: Path, spec: PolicySpec) -> PolicyNet:
        raise PolicyLoadError(
            path,
            "is a TorchScript module (torch.jit.save): loading it would run its code, which this harness never does; "
            "save the actor's state dict with torch.save instead (an ML-Agents checkpoint), or export it to ONNX",
        )


def load_mlagents_pt(path: Path) -> PolicyNet:
    """Load an ML-Agents checkpoint (`{"Policy": state_dict, ...}` or the state dict itself)."""
    content = read_whole(path, MAX_CHECKPOINT_BYTES, "an ML-Agents checkpoint", PolicyLoadError)
    try:
        # weights_only: a checkpoint is user input and must never run pickled code.
        checkpoint = torch.load(io.BytesIO(content), map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a file that is not a checkpoint
        raise PolicyLoadError(path, f"not a readable torch checkpoint ({_first_line(error)})") from None
    try:
        weights = weights_from_state_dict(_policy_state_dict(checkpoint))
    except LayoutError as error:
        raise PolicyLoadError(path, str(error)) from None
    return weights.to_policy(
        name=str(path),
        source="mlagents-pt",
        sha256=sha256_of(content),
        detail=f"ML-Agents checkpoint, {weights.describe()}",
    )


def _policy_state_dict(checkpoint: object) -> Mapping[str, object]:
    if not isinstance(checkpoint, Mapping):
        raise LayoutError(f"holds a {type(checkpoint).__name__}, not an ML-Agents checkpoint dict")
    policy = checkpoint.get("Policy", checkpoint)
    if not isinstance(policy, Mapping):
        raise LayoutError(f"'Policy' is a {type(policy).__name__}, not a state dict")
    return policy


def _first_line(error: Exception) -> str:
    """torch's errors name little by their message alone: the type goes first."""
    return f"{type(error).__name__}: {first_line(error)}" if str(error).strip() else type(error).__name__
