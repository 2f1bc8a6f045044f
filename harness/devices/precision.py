"""Precision modes: a card computes float32 in full float32 before anything runs (`strict`), or as
it comes (`device-default`); either way every card's description records how it computed.

Measured on an H200: with TF32 on for float32 matmuls a card's float32 error is 884-2302x the
CPU's. Ascend's HF32 is the same idea, and torch_npu turns it on for convolutions by default. A
card whose float32 matmuls ran reduced is labelled so (`reduced_float32_matmul`), never judged as
float32.

torch >= 2.9 sets float32 precision per backend and operator (`fp32_precision`: "ieee" is full
float32, "tf32" and "bf16" are reduced, "none" takes the level above's) and raises when these and
the legacy flags (`allow_tf32`, `set_float32_matmul_precision`) are mixed. So only the new names
are read and set where they exist; the legacy flags only on an older torch, which has no others.
"""

from __future__ import annotations

import os
from functools import partial

import torch

from harness.devices.detect import Kind, import_torch_npu
from harness.devices.npu import NPU_ENVIRONMENT, make_npu_strict, npu_settings
from harness.devices.reading import guarded
from harness.errors import UsageError

PRECISIONS = ("strict", "device-default")

FP32_PRECISION_API = hasattr(torch.backends, "fp32_precision")  # torch >= 2.9

# The float32 precision of each backend a kind computes with; strict sets each to "ieee". NPU
# matmuls go through torch_npu's own switches (harness/devices/npu.py).
FP32_PRECISION: dict[Kind, tuple[str, ...]] = {
    "cuda": (
        "torch.backends.cuda.matmul.fp32_precision",
        "torch.backends.cudnn.fp32_precision",
        "torch.backends.cudnn.conv.fp32_precision",
        "torch.backends.cudnn.rnn.fp32_precision",
    ),
    "cpu": (
        "torch.backends.mkldnn.fp32_precision",
        "torch.backends.mkldnn.matmul.fp32_precision",
        "torch.backends.mkldnn.conv.fp32_precision",
        "torch.backends.mkldnn.rnn.fp32_precision",
    ),
    "npu": (),
}
# The same before torch 2.9; strict sets each to False. The CPU had no switch to read.
LEGACY_TF32: dict[Kind, tuple[str, ...]] = {
    "cuda": ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"),
    "cpu": (),
    "npu": (),
}
# float16/bfloat16 GEMMs allowed to reduce (split-K) or accumulate in their own dtype rather than
# float32; strict sets each to False. A torch that lacks one is left without it.
REDUCED_REDUCTIONS: dict[Kind, tuple[str, ...]] = {
    "cuda": (
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
        "torch.backends.cuda.matmul.allow_fp16_accumulation",
    ),
    "cpu": (),
    "npu": (),
}
# Recorded as they are: whether a kind picks kernels deterministically.
DETERMINISM: dict[Kind, tuple[str, ...]] = {
    "cuda": ("torch.backends.cudnn.deterministic", "torch.backends.cudnn.benchmark"),
    "cpu": (),
    "npu": (),
}
# CUBLAS_WORKSPACE_CONFIG makes cuBLAS deterministic; *_LAUNCH_BLOCKING makes every launch synchronous.
ENVIRONMENT: dict[Kind, tuple[str, ...]] = {
    "cuda": ("CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING"),
    "cpu": (),
    "npu": NPU_ENVIRONMENT,
}


def apply_precision(kind: Kind, mode: str) -> None:
    """Set this process's card to `mode`; call it inside the card's actor before any policy runs.
    `strict` turns off every reduced float32 mode the card has, `device-default` changes nothing."""
    if mode not in PRECISIONS:
        raise UsageError(f"--precision {mode!r} is not one of {', '.join(PRECISIONS)}")
    if mode == "device-default":
        return
    for path in fp32_switches(kind):
        _set(path, "ieee" if FP32_PRECISION_API else False)
    for path in REDUCED_REDUCTIONS[kind]:
        _set(path, False)
    if kind == "npu":
        torch_npu, why = import_torch_npu()
        if torch_npu is None:
            raise UsageError(f"--precision strict on an NPU card, but torch_npu is not importable ({why})")
        make_npu_strict(torch_npu)


def read_precision(kind: Kind) -> dict[str, object]:
    """How this process's card computes, keyed by the setting's own name: None where this version
    has no such setting (or an environment variable is unset). Never raises."""
    paths = fp32_switches(kind) + REDUCED_REDUCTIONS[kind] + DETERMINISM[kind]
    settings = {path: guarded(partial(_get, path)) for path in paths}
    settings["torch.are_deterministic_algorithms_enabled()"] = guarded(torch.are_deterministic_algorithms_enabled)
    settings |= {name: os.environ.get(name) for name in ENVIRONMENT[kind]}
    if kind == "npu":
        settings |= npu_settings(import_torch_npu()[0])
    return settings


def reduced_float32_matmul(settings: dict[str, object]) -> str | None:
    """The reduced format float32 matmuls ran in, from a card's `read_precision`: "tf32" (CUDA),
    "hf32" (NPU), "bf16", "fp16"; None when they ran in full float32."""
    for path, value in settings.items():
        if path.endswith(".matmul.fp32_precision") and value not in (None, "none", "ieee"):
            return str(value)
    if settings.get("torch.backends.cuda.matmul.allow_tf32"):
        return "tf32"
    cube = settings.get("torch_npu.npu.matmul.cube_math_type")
    if cube == "USE_FP16":
        return "fp16"
    # ALLOW_FP32_DOWN_PRECISION is HF32 on the Ascend 910B family.
    if settings.get("torch_npu.npu.matmul.allow_hf32") or cube in ("ALLOW_FP32_DOWN_PRECISION", "USE_HF32"):
        return "hf32"
    return None


def fp32_switches(kind: Kind) -> tuple[str, ...]:
    return (FP32_PRECISION if FP32_PRECISION_API else LEGACY_TF32)[kind]


def _owner(path: str) -> tuple[object, str]:
    """`torch.backends.cudnn.conv.fp32_precision` -> (torch.backends.cudnn.conv, "fp32_precision")."""
    _torch, *parents, name = path.split(".")
    owner: object = torch
    for part in parents:
        owner = getattr(owner, part)
    return owner, name


def _get(path: str) -> object:
    owner, name = _owner(path)
    return getattr(owner, name)


def _set(path: str, value: object) -> None:
    owner, name = _owner(path)
    if hasattr(owner, name):
        setattr(owner, name, value)
