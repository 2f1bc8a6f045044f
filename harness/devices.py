"""Find the cards: Ascend NPU through torch_npu, CUDA, or simulated cards on the CPU.

Detection never crashes and never falls back silently. A sweep that asked for NPUs and got the
CPU would compare the CPU with itself and call that a pass, so asking for an accelerator that is
not there is a UsageError (exit 2).

torch_npu is imported here, in a guard, never by torch's backend autoload (which the `harness`
package turns off before torch can load: see harness/__init__.py). Without the CANN toolkit
`import torch_npu` raises, and the reason is reported instead of a crash.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Literal

import torch

from harness.errors import UsageError

Kind = Literal["npu", "cuda", "cpu"]
ACCELERATORS = ("auto", "npu", "cuda", "cpu")
# Ray resource a card actor asks for. Simulated cards borrow the NPU resource: declaring
# `resources={"NPU": n}` on a CPU machine is how Ray is told there are n cards to place.
RAY_RESOURCE: dict[Kind, str] = {"npu": "NPU", "cuda": "GPU", "cpu": "NPU"}


@dataclass(frozen=True)
class Device:
    """One card as seen from inside the process that drives it; recorded with every result."""

    kind: Kind
    index: int  # the card's id on its node (Ray's accelerator id), not the in-process ordinal
    torch_device: str  # "npu:0", "cuda:0", "cpu": Ray's *_VISIBLE_DEVICES make the card ordinal 0
    model: str  # "Ascend910B3", "NVIDIA H200", or the CPU model
    simulated: bool  # True for CPU cards standing in for accelerators
    node: str = ""  # hostname, so cards on different nodes can be told apart
    runtime: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Short stable name used in result rows: `npu1`, `cuda0`, `sim-cpu0`, `cpu`."""
        if self.simulated:
            return f"sim-cpu{self.index}"
        return f"{self.kind}{self.index}" if self.kind != "cpu" else "cpu"

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"label": self.label}


def import_torch_npu() -> tuple[ModuleType | None, str]:
    """torch_npu and "" if it imports, else None and why not. Never raises."""
    try:
        import torch_npu  # type: ignore[import-not-found]
    except Exception as exc:  # ImportError without CANN; OSError for broken shared libraries
        return None, f"{type(exc).__name__}: {exc}"
    return torch_npu, ""


def npu_available() -> tuple[bool, str]:
    torch_npu, why = import_torch_npu()
    if torch_npu is None:
        return False, f"torch_npu is not importable ({why})"
    try:
        if torch.npu.is_available():
            return True, ""
    except Exception as exc:
        return False, f"torch.npu.is_available() raised {type(exc).__name__}: {exc}"
    return False, "torch_npu imported but torch.npu.is_available() is False"


def cuda_available() -> tuple[bool, str]:
    if torch.cuda.is_available():
        return True, ""
    return False, "torch.cuda.is_available() is False"


def resolve_accelerator(requested: str) -> Kind:
    """`auto` picks npu, then cuda, then simulated cpu cards; an explicit choice must exist here."""
    if requested not in ACCELERATORS:
        raise UsageError(f"--accelerator {requested!r} is not one of {', '.join(ACCELERATORS)}")
    if requested == "cpu":
        return "cpu"
    checks = {"npu": npu_available, "cuda": cuda_available}
    if requested == "auto":
        for kind in ("npu", "cuda"):
            if checks[kind]()[0]:
                return kind  # type: ignore[return-value]
        return "cpu"
    ok, why = checks[requested]()
    if not ok:
        raise UsageError(f"--accelerator {requested} asked for, but {why}; use --accelerator cpu for simulated cards")
    return requested  # type: ignore[return-value]


def open_card(kind: Kind, index: int) -> Device:
    """Describe the card this process drives. Raises UsageError if it is not really there."""
    node = platform.node()
    if kind == "npu":
        ok, why = npu_available()
        if not ok:
            raise UsageError(f"an NPU card was asked for on {node}, but {why}")
        torch.npu.set_device("npu:0")
        return Device("npu", index, "npu:0", torch.npu.get_device_name(0), False, node, runtime_versions("npu"))
    if kind == "cuda":
        ok, why = cuda_available()
        if not ok:
            raise UsageError(f"a CUDA card was asked for on {node}, but {why}")
        return Device("cuda", index, "cuda:0", torch.cuda.get_device_name(0), False, node, runtime_versions("cuda"))
    return Device("cpu", index, "cpu", cpu_model(), True, node, runtime_versions("cpu"))


def cpu_reference() -> Device:
    return Device("cpu", 0, "cpu", cpu_model(), False, platform.node(), runtime_versions("cpu"))


def synchronize(device: Device) -> None:
    """Wait for queued work on the card, so a timer measures the work and not its launch."""
    if device.kind == "npu":
        torch.npu.synchronize()
    elif device.kind == "cuda":
        torch.cuda.synchronize()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def runtime_versions(kind: Kind) -> dict[str, str]:
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    if kind == "npu":
        torch_npu, _ = import_torch_npu()
        versions["torch_npu"] = getattr(torch_npu, "__version__", "unknown")
        versions["cann"] = os.environ.get("ASCEND_TOOLKIT_HOME", "")
    elif kind == "cuda":
        versions["cuda"] = str(torch.version.cuda)
    else:
        versions["mkl_cbwr"] = os.environ.get("MKL_CBWR", "")
        versions["threads"] = str(torch.get_num_threads())
    return versions


def describe_local() -> dict[str, object]:
    """What `harness info` prints about this machine's accelerators."""
    npu_ok, npu_why = npu_available()
    cuda_ok, cuda_why = cuda_available()
    return {
        "npu": {"available": npu_ok, "reason": npu_why},
        "cuda": {
            "available": cuda_ok,
            "reason": cuda_why,
            "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda_ok else [],
        },
        "cpu": {"model": cpu_model(), "cores": os.cpu_count()},
        "auto": resolve_accelerator("auto"),
    }
