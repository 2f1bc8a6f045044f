"""Device detection: the real NPU code path driven by a fake torch_npu module, and no silent fallback."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from harness import devices
from harness.errors import UsageError


class FakeNpu:
    """What torch_npu attaches as `torch.npu`, recording what the harness asks of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def is_available(self) -> bool:
        return True

    def set_device(self, device: str) -> None:
        self.calls.append(f"set_device({device})")

    def get_device_name(self, index: int) -> str:
        return "Ascend910B3"

    def synchronize(self) -> None:
        self.calls.append("synchronize")


@pytest.fixture
def fake_torch_npu(monkeypatch: pytest.MonkeyPatch) -> FakeNpu:
    npu = FakeNpu()
    module = types.ModuleType("torch_npu")
    module.__version__ = "2.13.0.fake"
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    return npu


@pytest.fixture
def broken_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_npu installed without CANN: importing it raises."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` raise ImportError


def test_npu_is_picked_first_and_described(fake_torch_npu: FakeNpu) -> None:
    assert devices.resolve_accelerator("auto") == "npu"
    card = devices.open_card("npu", 3)
    assert (card.kind, card.index, card.torch_device, card.model, card.simulated) == ("npu", 3, "npu:0", "Ascend910B3", False)
    assert card.label == "npu3" and card.runtime["torch_npu"] == "2.13.0.fake"
    assert fake_torch_npu.calls == ["set_device(npu:0)"]
    devices.synchronize(card)
    assert fake_torch_npu.calls[-1] == "synchronize"


def test_npu_asked_for_without_torch_npu_is_an_error_never_a_cpu_fallback(broken_torch_npu: None) -> None:
    ok, why = devices.npu_available()
    assert not ok and "torch_npu is not importable" in why
    with pytest.raises(UsageError, match="--accelerator npu asked for, but torch_npu is not importable"):
        devices.resolve_accelerator("npu")
    with pytest.raises(UsageError, match="an NPU card was asked for"):
        devices.open_card("npu", 0)
    assert devices.resolve_accelerator("auto") in ("cuda", "cpu")


def test_npu_present_but_unavailable(fake_torch_npu: FakeNpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_torch_npu, "is_available", lambda: False)
    with pytest.raises(UsageError, match=r"is_available\(\) is False"):
        devices.resolve_accelerator("npu")


def test_cuda_asked_for_on_a_cpu_machine_is_an_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UsageError, match="--accelerator cuda asked for"):
        devices.resolve_accelerator("cuda")


def test_cpu_cards_are_labelled_simulated() -> None:
    card = devices.open_card("cpu", 1)
    assert card.simulated and card.label == "sim-cpu1" and card.torch_device == "cpu"
    ref = devices.cpu_reference()
    assert not ref.simulated and ref.label == "cpu"
    assert devices.RAY_RESOURCE == {"npu": "NPU", "cuda": "GPU", "cpu": "NPU"}


def test_backend_autoload_is_off_before_torch_is_imported() -> None:
    code = "import sys, os; import harness.devices; print(os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'], 'torch' in sys.modules)"
    env_free = {k: v for k, v in __import__("os").environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_free, check=True).stdout.split()
    assert out == ["0", "True"]
