"""Simulated cards on the CPU, and the CPU reference every card is judged against.

A simulated card is a process computing on its own threads, standing in for an accelerator on a
machine without one: on one host, simulated cards with the same weights, thread count and batch
shape agree bit for bit. They borrow Ray's NPU resource: declaring `resources={"NPU": n}` on a
CPU machine is how Ray is told there are n cards to place.

The CPU has reduced float32 modes too (oneDNN's bf16 matmuls), which `strict` turns off like any
card's: through `fp32_precision` on torch >= 2.9, `torch.set_float32_matmul_precision` before.
"""

from __future__ import annotations

import os
import platform

import torch

from harness.devices.base import Accelerator, Detection, Device
from harness.devices.precision import Switch, fp32_precision_api, matmul_precision_switch, torch_attribute
from harness.devices.registry import SIMULATED

FP32_PRECISION = (
    "torch.backends.mkldnn.fp32_precision",
    "torch.backends.mkldnn.matmul.fp32_precision",
    "torch.backends.mkldnn.conv.fp32_precision",
    "torch.backends.mkldnn.rnn.fp32_precision",
)


class SimulatedCpu(Accelerator):
    display = "a simulated CPU"
    ray_resource = "NPU"
    simulated = True
    local_cards = 2
    # Ray asks AscendCL for the card model of a node that declares NPUs; simulated cards have
    # none, and the traceback it logs for that says nothing about the sweep.
    quiet_loggers = ("ray._private.accelerators.npu",)

    def _detect(self) -> Detection:
        return Detection(True, "")

    def select(self) -> str:
        return cpu_model()

    def torch_device(self) -> str:
        return "cpu"

    def synchronize(self) -> None:
        """The CPU computes as it is called: nothing is queued."""

    def runtime(self) -> dict[str, str]:
        return super().runtime() | {"mkl_cbwr": os.environ.get("MKL_CBWR", ""), "threads": str(torch.get_num_threads())}

    def switches(self) -> tuple[Switch, ...]:
        if fp32_precision_api():
            return tuple(torch_attribute(path, "ieee") for path in FP32_PRECISION)
        return (matmul_precision_switch(),)

    def cards(self) -> list[str]:
        return [cpu_model()]

    def local(self) -> dict[str, object]:
        return super().local() | {"model": cpu_model(), "cores": os.cpu_count()}

    def reference(self) -> Device:
        """The CPU float32 yardstick, always strict: a reference that computed float32 in less
        would move every card's verdict. Not a card: labelled `cpu`, not simulated."""
        done = self.apply_precision("strict")
        model, node = cpu_model(), platform.node()
        return Device(self.kind, 0, "cpu", model, False, node, self.runtime(), self.described("strict", done), self.kind)


def cpu_reference() -> Device:
    from harness.devices.registry import accelerator

    cpu = accelerator(SIMULATED)
    assert isinstance(cpu, SimulatedCpu)
    return cpu.reference()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
