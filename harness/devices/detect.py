"""Which accelerators this machine has, and which one a sweep gets.

Detection never crashes and never falls back silently. A sweep that asked for NPUs and got the
CPU would compare the CPU with itself and call that a pass, so asking for an accelerator that is
not there is a UsageError (exit 2).

torch_npu is imported here, in a guard, never by torch's backend autoload (which the `harness`
package turns off before torch can load: see harness/__init__.py). Without the CANN toolkit
`import torch_npu` raises, and the reason is reported instead of a crash.
"""

from __future__ import annotations

import platform
from types import ModuleType
from typing import Literal

import torch

from harness.errors import UsageError

Kind = Literal["npu", "cuda", "cpu"]
ACCELERATORS = ("auto", "npu", "cuda", "cpu")
# Ray resource a card actor asks for. Simulated cards borrow the NPU resource: declaring
# `resources={"NPU": n}` on a CPU machine is how Ray is told there are n cards to place.
RAY_RESOURCE: dict[Kind, str] = {"npu": "NPU", "cuda": "GPU", "cpu": "NPU"}


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
        if torch_npu.npu.is_available():
            return True, ""
    except Exception as exc:
        return False, f"torch_npu.npu.is_available() raised {type(exc).__name__}: {exc}"
    return False, "torch_npu imported but torch_npu.npu.is_available() is False"


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


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
