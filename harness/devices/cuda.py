"""What a CUDA card runs on, read inside its actor; "" where a value is not readable."""

from __future__ import annotations

import os
import re
from importlib import metadata

import torch

from harness.devices.reading import guarded


def cuda_runtime() -> dict[str, str]:
    def read(value: object) -> str:
        return "" if value is None else str(value)

    return {
        "cuda": read(torch.version.cuda),
        "cudnn": read(guarded(torch.backends.cudnn.version)),
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
