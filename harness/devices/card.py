"""The card a process drives: opened, set to a precision mode, and described for every result."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field

import torch

from harness.devices.cuda import cuda_runtime
from harness.devices.detect import Kind, cpu_model, cuda_available, import_torch_npu, npu_available
from harness.devices.npu import npu_runtime, open_npu
from harness.devices.precision import apply_precision, read_precision
from harness.errors import UsageError


@dataclass(frozen=True)
class Device:
    """One card as seen from inside the process that drives it; recorded with every result."""

    kind: Kind
    index: int  # the card's id on its node (Ray's accelerator id), not the in-process ordinal
    torch_device: str  # "npu:0", "cuda:0", "cpu": Ray's *_VISIBLE_DEVICES make the card ordinal 0
    model: str  # "Ascend910B3", "NVIDIA H200", or the CPU model
    simulated: bool  # True for CPU cards standing in for accelerators
    node: str = ""  # hostname, so cards on different nodes can be told apart
    runtime: dict[str, str] = field(default_factory=dict)  # versions, SoC, the id as Ray set it
    # How it computes: the precision mode asked for, then `read_precision` after it was applied.
    settings: dict[str, object] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Short stable name used in result rows: `npu1`, `cuda0`, `sim-cpu0`, `cpu`."""
        if self.simulated:
            return f"sim-cpu{self.index}"
        return f"{self.kind}{self.index}" if self.kind != "cpu" else "cpu"

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"label": self.label}


def open_card(kind: Kind, index: int, precision: str = "strict") -> Device:
    """Select the card this process drives, set it to `precision` (see harness/devices/precision.py)
    and describe it. Raises UsageError if it is not really there."""
    node = platform.node()
    if kind == "npu":
        ok, why = npu_available()
        if not ok:
            raise UsageError(f"an NPU card was asked for on {node}, but {why}")
        model = open_npu(import_torch_npu()[0])  # type: ignore[arg-type]
    elif kind == "cuda":
        ok, why = cuda_available()
        if not ok:
            raise UsageError(f"a CUDA card was asked for on {node}, but {why}")
        model = torch.cuda.get_device_name(0)
    else:
        model = cpu_model()
    apply_precision(kind, precision)
    torch_device = "cpu" if kind == "cpu" else f"{kind}:0"
    return Device(kind, index, torch_device, model, kind == "cpu", node, runtime_versions(kind), _described(kind, precision))


def cpu_reference() -> Device:
    """The CPU float32 yardstick, always strict: a reference that computed float32 in less would
    move every card's verdict."""
    apply_precision("cpu", "strict")
    return Device("cpu", 0, "cpu", cpu_model(), False, platform.node(), runtime_versions("cpu"), _described("cpu", "strict"))


def _described(kind: Kind, precision: str) -> dict[str, object]:
    return {"precision": precision} | read_precision(kind)


def synchronize(device: Device) -> None:
    """Wait for queued work on the card, so a timer measures the work and not its launch."""
    if device.kind == "npu":
        torch.npu.synchronize()
    elif device.kind == "cuda":
        torch.cuda.synchronize()


def runtime_versions(kind: Kind) -> dict[str, str]:
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    if kind == "npu":
        versions |= npu_runtime(import_torch_npu()[0])
    elif kind == "cuda":
        versions |= cuda_runtime()
    else:
        versions["mkl_cbwr"] = os.environ.get("MKL_CBWR", "")
        versions["threads"] = str(torch.get_num_threads())
    return versions
