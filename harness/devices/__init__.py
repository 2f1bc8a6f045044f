"""Find the cards (Ascend NPU through torch_npu, CUDA, or simulated cards on the CPU), open the one
a process drives in a precision mode, and describe it for every result.

  detect.py     which accelerators this machine has, and which one a sweep gets; never a fallback
  card.py       Device, open_card, cpu_reference, synchronize: the card a process drives
  precision.py  strict / device-default, and the settings every card records
  npu.py        everything asked of torch_npu on a card, with the list of its names the harness uses
  cuda.py       what a CUDA card runs on
  local.py      what `harness info` says about this machine
"""

from harness.devices.card import Device, cpu_reference, open_card, runtime_versions, synchronize
from harness.devices.detect import (
    ACCELERATORS,
    RAY_RESOURCE,
    Kind,
    cpu_model,
    cuda_available,
    import_torch_npu,
    npu_available,
    resolve_accelerator,
)
from harness.devices.local import describe_local
from harness.devices.npu import TORCH_NPU_API
from harness.devices.precision import PRECISIONS, apply_precision, read_precision, reduced_float32_matmul

__all__ = [
    "ACCELERATORS",
    "PRECISIONS",
    "RAY_RESOURCE",
    "TORCH_NPU_API",
    "Device",
    "Kind",
    "apply_precision",
    "cpu_model",
    "cpu_reference",
    "cuda_available",
    "describe_local",
    "import_torch_npu",
    "npu_available",
    "open_card",
    "read_precision",
    "reduced_float32_matmul",
    "resolve_accelerator",
    "runtime_versions",
    "synchronize",
]
