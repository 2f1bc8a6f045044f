"""The card a process drives, by its kind's name: opened in a precision mode, described for every
result, and waited for. Each call asks the kind's `Accelerator` (harness/devices/registry.py)."""

from __future__ import annotations

from harness.devices.base import Device
from harness.devices.registry import accelerator, names


def open_card(kind: str, index: int, precision: str = "strict") -> Device:
    """Select the card this process drives, set it to `precision` (see harness/devices/precision.py)
    and describe it. Raises UsageError if it is not really there."""
    return accelerator(kind).open(index, precision)


def synchronize(device: Device) -> None:
    """Wait for queued work on the card, so a timer measures the work and not its launch."""
    accelerator(device.kind).synchronize()


def runtime_versions(kind: str) -> dict[str, str]:
    return accelerator(kind).runtime()


def apply_precision(kind: str, mode: str) -> dict[str, object]:
    """Set this process's card to `mode`; returns what was set (see `Accelerator.apply_precision`)."""
    return accelerator(kind).apply_precision(mode)


def read_precision(kind: str) -> dict[str, object]:
    return accelerator(kind).read_precision()


def ray_card_id(kind: str, position: int) -> int:
    """The card's id on its node as Ray assigned it to this actor (`position` outside Ray)."""
    return accelerator(kind).ray_card_id(position)


def reduced_float32_matmul(settings: object) -> str | None:
    """The reduced format a card's float32 matmuls ran in, from its recorded settings ("tf32",
    "hf32", "bf16", "fp16"); None when they ran in full float32. Each registered accelerator
    reads the settings that are its own; an unreadable matmul setting is a UsageError."""
    if not isinstance(settings, dict):
        return None
    for kind in names():
        found = accelerator(kind).reduced_float32_matmul(settings)
        if found is not None:
            return found
    return None
