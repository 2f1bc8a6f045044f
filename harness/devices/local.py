"""What `harness info` says about this machine's accelerators."""

from __future__ import annotations

from harness.devices.registry import accelerator, names, resolve_accelerator


def describe_local() -> dict[str, object]:
    """Each registered accelerator by name: available or why not; where available, every card this
    process sees, what they run on, and how a card computes before a sweep applies its precision
    mode (the compile mode among it: a sweep's cards start from the same); and what `auto` picks."""
    found: dict[str, object] = {kind: accelerator(kind).local() for kind in names()}
    return found | {"auto": resolve_accelerator("auto")}
