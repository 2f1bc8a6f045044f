"""Ascend NPUs through torch_npu: make a card compute in full float32, and say how it computes and
what it runs on.

torch_npu is imported here, in a guard, never by torch's backend autoload (which the `harness`
package turns off before torch can load: see harness/__init__.py). Without the CANN toolkit
`import torch_npu` raises, and the reason is reported instead of a crash. Ray's NPU resource sets
ASCEND_RT_VISIBLE_DEVICES, so inside a card's actor the card is always `npu:0`.

Names are torch_npu 2.13.0's, and each is defined in every supported wheel (2.6.0.post5 to 2.13.0:
tests/test_torch_npu_wheel.py). Most of these calls initialize the device, so they run inside the
card's actor, after `set_device`. Every read is guarded: a call that fails without CANN records
`unreadable: <why>` (or "" for a version) and never fails the card's description.
"""

from __future__ import annotations

import os
from importlib import metadata
from types import ModuleType
from typing import Any

import torch

from harness.devices.base import Accelerator, Detection
from harness.devices.precision import Switch
from harness.devices.reading import read_setting, read_version

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
# What a torch_npu option reads while never set: the SoC's default.
NEVER_SET = "never set"


def import_torch_npu() -> tuple[ModuleType | None, str]:
    """torch_npu and "" if it imports, else None and why not. Never raises."""
    try:
        import torch_npu
    except Exception as exc:  # ImportError without CANN; OSError for broken shared libraries
        return None, f"{type(exc).__name__}: {exc}"
    return torch_npu, ""


def required_torch_npu() -> Any:
    """torch_npu, or a RuntimeError that says why it is not importable (recorded as the reason a
    setting is unreadable, or the reason strict could not set it)."""
    torch_npu, why = import_torch_npu()
    if torch_npu is None:
        raise RuntimeError(f"torch_npu is not importable ({why})")
    return torch_npu


def _matmul_allow_hf32() -> object:
    torch_npu = required_torch_npu()
    return torch_npu.npu.matmul.allow_hf32


def _conv_allow_hf32() -> object:
    torch_npu = required_torch_npu()
    return torch_npu.npu.conv.allow_hf32


def _cube_math_type() -> object:
    torch_npu = required_torch_npu()
    value = torch_npu.npu.matmul.cube_math_type
    return NEVER_SET if value is None else value  # never set: the matmul follows allow_hf32


def _strict_matmul() -> None:
    torch_npu = required_torch_npu()
    torch_npu.npu.matmul.allow_hf32 = False


def _strict_conv() -> None:
    torch_npu = required_torch_npu()
    torch_npu.npu.conv.allow_hf32 = False


def _strict_cube_math_type() -> None:
    torch_npu = required_torch_npu()
    torch_npu.npu.matmul.cube_math_type = torch_npu.npu.CubeMathType.KEEP_DTYPE


# HF32 (float32 matmuls and convolutions on a 10-bit mantissa) off, and no cube math type that
# computes float32 in less; torch_npu turns HF32 on for convolutions by default.
SWITCHES = (
    Switch("torch_npu.npu.matmul.allow_hf32", False, _matmul_allow_hf32, _strict_matmul),
    Switch("torch_npu.npu.matmul.cube_math_type", "KEEP_DTYPE", _cube_math_type, _strict_cube_math_type),
    Switch("torch_npu.npu.conv.allow_hf32", False, _conv_allow_hf32, _strict_conv),
)


def _jit_compile_false() -> object:
    torch_npu = required_torch_npu()
    return torch_npu.npu.is_jit_compile_false()


def _allow_internal_format() -> object:
    torch_npu = required_torch_npu()
    value = torch_npu._C._npu_getOption("ALLOW_INTERNAL_FORMAT")
    return value or NEVER_SET


class Npu(Accelerator):
    display = "an NPU"
    ray_resource = "NPU"

    def _detect(self) -> Detection:
        torch_npu, why = import_torch_npu()
        if torch_npu is None:
            return Detection(False, f"torch_npu is not importable ({why})")
        try:
            if torch_npu.npu.is_available():
                return Detection(True, "")
        except Exception as exc:
            return Detection(False, f"torch_npu.npu.is_available() raised {type(exc).__name__}: {exc}")
        return Detection(False, "torch_npu imported but torch_npu.npu.is_available() is False")

    def select(self) -> str:
        torch_npu = required_torch_npu()
        torch_npu.npu.set_device("npu:0")
        return str(torch_npu.npu.get_device_name(0))

    def synchronize(self) -> None:
        torch.npu.synchronize()  # type: ignore[attr-defined]  # torch_npu attaches torch.npu

    def runtime(self) -> dict[str, str]:
        return super().runtime() | npu_runtime(import_torch_npu()[0])

    def switches(self) -> tuple[Switch, ...]:
        return SWITCHES

    def readings(self) -> dict[str, object]:
        return (
            super().readings()
            | {
                # True: operators come precompiled from the binary kernel packages; False: compiled online.
                "torch_npu.npu.is_jit_compile_false()": read_setting(_jit_compile_false),
                # Settable only, so read as the option it sets: "enable", "disable", or "never set" (the SoC's default).
                "torch_npu.npu.config.allow_internal_format": read_setting(_allow_internal_format),
            }
            | {name: os.environ.get(name) for name in NPU_ENVIRONMENT}
        )

    def reduced_float32_matmul(self, settings: dict[str, object]) -> str | None:
        from harness.devices.precision import refuse_unreadable

        for name in ("torch_npu.npu.matmul.allow_hf32", "torch_npu.npu.matmul.cube_math_type"):
            refuse_unreadable(name, settings.get(name))
        cube = settings.get("torch_npu.npu.matmul.cube_math_type")
        if cube == "USE_FP16":
            return "fp16"
        # ALLOW_FP32_DOWN_PRECISION is HF32 on the Ascend 910B family.
        if settings.get("torch_npu.npu.matmul.allow_hf32") is True or cube in ("ALLOW_FP32_DOWN_PRECISION", "USE_HF32"):
            return "hf32"
        return None

    def cards(self) -> list[str]:
        torch_npu = required_torch_npu()
        return [torch_npu.npu.get_device_name(i) for i in range(torch_npu.npu.device_count())]

    def warnings(self) -> list[str]:
        mismatch = version_mismatch()
        return [mismatch] if mismatch else []


def npu_runtime(torch_npu: Any) -> dict[str, str]:
    """What the card is and runs on: versions, the SoC, and its id as Ray assigned it; "" where
    unreadable (and everywhere but the id with torch_npu None)."""
    return {
        "torch_npu": read_version(lambda: torch_npu.__version__),
        "cann": read_version(lambda: torch_npu.utils.get_cann_version()),
        "driver": read_version(lambda: torch_npu.utils.get_cann_version("DRIVER")),
        "soc_version": read_version(lambda: torch_npu.npu.get_soc_version()),
        "ASCEND_RT_VISIBLE_DEVICES": os.environ.get("ASCEND_RT_VISIBLE_DEVICES", ""),
    }


def version_mismatch() -> str:
    """torch_npu X.Y is built for torch X.Y alone: "" when the installed pair agrees (or no
    torch-npu is installed), else what is wrong. Read from the installed packages' metadata, so
    it is said even where torch_npu cannot import."""
    try:
        torch_version, npu_version = metadata.version("torch"), metadata.version("torch-npu")
    except metadata.PackageNotFoundError:
        return ""
    if torch_version.split(".")[:2] == npu_version.split(".")[:2]:
        return ""
    pair = ".".join(npu_version.split(".")[:2])
    return (
        f"torch {torch_version} and torch-npu {npu_version} are not the same X.Y: torch_npu {pair} runs only on "
        f"torch {pair} (docs/versions.md: the support matrix)"
    )
