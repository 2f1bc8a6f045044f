"""What `harness info` says about this machine's accelerators."""

from __future__ import annotations

import os

import torch

from harness.devices.cuda import cuda_runtime
from harness.devices.detect import cpu_model, cuda_available, import_torch_npu, npu_available, resolve_accelerator
from harness.devices.npu import npu_cards, npu_runtime
from harness.devices.precision import read_precision


def describe_local() -> dict[str, object]:
    """Each accelerator: available or why not; where available, every card this process sees, what
    they run on, and how a card computes before a sweep applies its precision mode (the compile
    mode among it: a sweep's cards start from the same)."""
    npu_ok, npu_why = npu_available()
    cuda_ok, cuda_why = cuda_available()
    npu: dict[str, object] = {"available": npu_ok, "reason": npu_why, "devices": []}
    cuda: dict[str, object] = {"available": cuda_ok, "reason": cuda_why, "devices": []}
    if npu_ok:
        torch_npu = import_torch_npu()[0]
        npu |= {"devices": npu_cards(torch_npu), "runtime": npu_runtime(torch_npu), "settings": read_precision("npu")}
    if cuda_ok:
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        cuda |= {"devices": names, "runtime": cuda_runtime(), "settings": read_precision("cuda")}
    return {
        "npu": npu,
        "cuda": cuda,
        "cpu": {"model": cpu_model(), "cores": os.cpu_count()},
        "auto": resolve_accelerator("auto"),
    }
