"""What the harness asks of torch_npu on a card: make it compute in full float32, and say how it
computes and what it runs on.

Names are torch_npu 2.13.0's. Most of these calls initialize the device, so they run inside the
card's actor, after `set_device`. Every read is guarded: a name that an older torch_npu lacks, or
a call that fails without CANN, leaves its field empty (None, or "" for versions) and never fails
the card's description.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from harness.devices.reading import guarded

# Every torch_npu attribute path used in harness/devices (`torch.npu` is `torch_npu.npu` once
# torch_npu has imported). tests/test_torch_npu_wheel.py checks that this list is exactly what
# the code uses, and that each path is defined in the installed wheel's sources, so a renamed
# API fails a test here instead of a sweep on an Ascend host.
TORCH_NPU_API = (
    "torch_npu.__version__",
    "torch_npu._C._npu_getOption",
    "torch_npu.npu.CubeMathType.KEEP_DTYPE",
    "torch_npu.npu.conv.allow_hf32",
    "torch_npu.npu.device_count",
    "torch_npu.npu.get_device_name",
    "torch_npu.npu.get_soc_version",
    "torch_npu.npu.is_available",
    "torch_npu.npu.is_jit_compile_false",
    "torch_npu.npu.matmul.allow_hf32",
    "torch_npu.npu.matmul.cube_math_type",
    "torch_npu.npu.set_device",
    "torch_npu.npu.synchronize",
    "torch_npu.utils.get_cann_version",
)

# Environment variables that change how the card computes: HCCL_DETERMINISTIC makes collective
# reductions deterministic, ASCEND_LAUNCH_BLOCKING makes every launch synchronous.
NPU_ENVIRONMENT = ("HCCL_DETERMINISTIC", "ASCEND_LAUNCH_BLOCKING")


def open_npu(torch_npu: ModuleType) -> str:
    """Select the card Ray gave this process (always ordinal 0) and return its name."""
    torch_npu.npu.set_device("npu:0")
    return torch_npu.npu.get_device_name(0)


def npu_cards(torch_npu: ModuleType) -> list[str]:
    """The name of every card this process sees (all of the node's, outside a Ray actor)."""
    return [torch_npu.npu.get_device_name(i) for i in range(torch_npu.npu.device_count())]


def make_npu_strict(torch_npu: ModuleType) -> None:
    """Turn off HF32 (float32 matmuls and convolutions on a 10-bit mantissa) and any cube math
    type that computes float32 in less; torch_npu turns HF32 on for convolutions by default."""
    torch_npu.npu.matmul.allow_hf32 = False
    torch_npu.npu.conv.allow_hf32 = False
    torch_npu.npu.matmul.cube_math_type = torch_npu.npu.CubeMathType.KEEP_DTYPE


def npu_settings(torch_npu: Any) -> dict[str, object]:
    """How the card computes, under the names they have in torch_npu. `torch_npu` is the module,
    or None where it does not import: every read is then None."""
    return {
        "torch_npu.npu.matmul.allow_hf32": guarded(lambda: torch_npu.npu.matmul.allow_hf32),
        # None: never set, so the matmul follows allow_hf32.
        "torch_npu.npu.matmul.cube_math_type": guarded(lambda: torch_npu.npu.matmul.cube_math_type),
        "torch_npu.npu.conv.allow_hf32": guarded(lambda: torch_npu.npu.conv.allow_hf32),
        # True: operators come precompiled from the binary kernel packages; False: compiled online.
        "torch_npu.npu.is_jit_compile_false()": guarded(lambda: torch_npu.npu.is_jit_compile_false()),
        # Settable only, so read as the option it sets: "enable", "disable", or None or "" while
        # never set (the SoC's default).
        "torch_npu.npu.config.allow_internal_format": guarded(lambda: torch_npu._C._npu_getOption("ALLOW_INTERNAL_FORMAT")),
    } | {name: os.environ.get(name) for name in NPU_ENVIRONMENT}


def npu_runtime(torch_npu: Any) -> dict[str, str]:
    """What the card is and runs on: versions, the SoC, and its id as Ray assigned it; "" where
    unreadable (and everywhere but the id with torch_npu None)."""

    def read(get: Callable[[], object]) -> str:
        value = guarded(get)
        return "" if value is None else str(value)

    return {
        "torch_npu": read(lambda: torch_npu.__version__),
        "cann": read(lambda: torch_npu.utils.get_cann_version()),
        "driver": read(lambda: torch_npu.utils.get_cann_version("DRIVER")),
        "soc_version": read(lambda: torch_npu.npu.get_soc_version()),
        "ASCEND_RT_VISIBLE_DEVICES": os.environ.get("ASCEND_RT_VISIBLE_DEVICES", ""),
    }
