"""CUDA GPUs: Ray's GPU resource, torch.cuda, and the TF32 switches of the torch in use.

TF32 is what reduces float32 on a CUDA card. torch >= 2.9 sets it per backend and operator
(`fp32_precision`); before, `torch.backends.cuda.matmul.allow_tf32` (off by default, and tied to
`torch.set_float32_matmul_precision`) and `torch.backends.cudnn.allow_tf32` (on by default).
float16 and bfloat16 GEMMs may also reduce in their own dtype (split-K) or accumulate in it;
`strict` turns those off as well, where this torch has them.
"""

from __future__ import annotations

import os
import re
from importlib import metadata

import torch

from harness.devices.base import Accelerator, Detection
from harness.devices.precision import Switch, fp32_precision_api, matmul_precision_switch, torch_attribute
from harness.devices.reading import read_setting, read_version

FP32_PRECISION = (
    "torch.backends.cuda.matmul.fp32_precision",
    "torch.backends.cudnn.fp32_precision",
    "torch.backends.cudnn.conv.fp32_precision",
    "torch.backends.cudnn.rnn.fp32_precision",
)
LEGACY_TF32 = ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32")
REDUCED_REDUCTIONS = (
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
    "torch.backends.cuda.matmul.allow_fp16_accumulation",  # torch >= 2.7
)
# Recorded as they are: whether cuDNN picks kernels deterministically.
DETERMINISM = ("torch.backends.cudnn.deterministic", "torch.backends.cudnn.benchmark")
# CUBLAS_WORKSPACE_CONFIG makes cuBLAS deterministic; CUDA_LAUNCH_BLOCKING makes every launch synchronous.
ENVIRONMENT = ("CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING")


class Cuda(Accelerator):
    display = "a CUDA"
    ray_resource = "GPU"

    def _detect(self) -> Detection:
        if torch.cuda.is_available():
            return Detection(True, "")
        return Detection(False, "torch.cuda.is_available() is False")

    def actor_options(self) -> dict[str, object]:
        return {"num_gpus": 1}  # Ray's own name for its GPU resource

    def select(self) -> str:
        return torch.cuda.get_device_name(0)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def runtime(self) -> dict[str, str]:
        return super().runtime() | cuda_runtime()

    def switches(self) -> tuple[Switch, ...]:
        if fp32_precision_api():
            tf32 = tuple(torch_attribute(path, "ieee") for path in FP32_PRECISION)
        else:
            tf32 = (*(torch_attribute(path, False) for path in LEGACY_TF32), matmul_precision_switch())
        return tf32 + tuple(torch_attribute(path, False, optional=True) for path in REDUCED_REDUCTIONS)

    def readings(self) -> dict[str, object]:
        flags = {path: read_setting(torch_attribute(path, None).get) for path in DETERMINISM}
        return super().readings() | flags | {name: os.environ.get(name) for name in ENVIRONMENT}

    def cards(self) -> list[str]:
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def cuda_runtime() -> dict[str, str]:
    """What a CUDA card runs on, read inside its actor; "" where a value is not readable."""
    return {
        "cuda": read_version(lambda: torch.version.cuda),
        "cudnn": read_version(torch.backends.cudnn.version),
        "cublas": cublas_version(),
        "driver": driver_version(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }


def cublas_version() -> str:
    """torch does not report cuBLAS's version; its CUDA wheels ship cuBLAS as a package
    (nvidia-cublas-cu12, nvidia-cublas for CUDA 13), so its version is the one in use."""
    for dist in metadata.distributions():
        if (dist.metadata["Name"] or "").lower().startswith("nvidia-cublas"):
            return dist.version
    return ""


def driver_version() -> str:
    """The NVIDIA kernel driver's version, as the driver itself reports it on Linux."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            # "NVRM version: NVIDIA UNIX [Open] Kernel Module [for x86_64]  570.124.06  Release Build ..."
            found = re.search(r"\s(\d+\.\d+(?:\.\d+)*)\s", f.readline())
    except OSError:
        return ""
    return found.group(1) if found else ""
