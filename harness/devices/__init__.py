"""The cards: one `Accelerator` class per family (Ascend NPU through torch_npu, CUDA, simulated
cards on the CPU), one registry of them by name, and the card a process drives, opened in a
precision mode and described for every result.

  registry.py   name (a `Kind`, kind.py) -> Accelerator class (imported on first use); `auto`; `register` for more
  base.py       Accelerator: detect, Ray resource and actor options, open/describe, precision, info
  npu.py        Ascend through torch_npu, with the list of its names the harness uses
  cuda.py       CUDA through torch.cuda
  cpu.py        simulated cards, and the CPU reference
  precision.py  strict / device-default: the switches each class sets, reads back and records
  card.py       open_card, synchronize, ...: the card of a kind, by its name
  local.py      what `harness info` says about this machine

Light on purpose: the names here resolve on first use (PEP 562), so `harness --help` and option
validation read the registry without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.devices.base import Accelerator, Detection, Device
    from harness.devices.card import (
        apply_precision,
        open_card,
        ray_card_id,
        read_precision,
        reduced_float32_matmul,
        runtime_versions,
        synchronize,
    )
    from harness.devices.cpu import cpu_reference
    from harness.devices.local import describe_local
    from harness.devices.npu import TORCH_NPU_API
    from harness.devices.kind import Kind
    from harness.devices.precision import PRECISIONS
    from harness.devices.registry import (
        SIMULATED,
        accelerator,
        as_kind,
        choices,
        register,
        registered,
        resolve_accelerator,
    )

_WHERE = {
    "Accelerator": "base",
    "Detection": "base",
    "Device": "base",
    "apply_precision": "card",
    "open_card": "card",
    "ray_card_id": "card",
    "read_precision": "card",
    "reduced_float32_matmul": "card",
    "runtime_versions": "card",
    "synchronize": "card",
    "cpu_reference": "cpu",
    "describe_local": "local",
    "TORCH_NPU_API": "npu",
    "PRECISIONS": "precision",
    "SIMULATED": "registry",
    "Kind": "kind",
    "accelerator": "registry",
    "as_kind": "registry",
    "choices": "registry",
    "register": "registry",
    "registered": "registry",
    "resolve_accelerator": "registry",
}

__all__ = [
    "PRECISIONS",
    "SIMULATED",
    "TORCH_NPU_API",
    "Accelerator",
    "Detection",
    "Device",
    "Kind",
    "accelerator",
    "apply_precision",
    "as_kind",
    "choices",
    "cpu_reference",
    "describe_local",
    "open_card",
    "ray_card_id",
    "read_precision",
    "reduced_float32_matmul",
    "register",
    "registered",
    "resolve_accelerator",
    "runtime_versions",
    "synchronize",
]
assert set(__all__) == set(_WHERE)


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
