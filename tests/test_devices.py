"""Device detection and description: the real NPU code path driven by a fake torch_npu module, the
precision modes on the real torch, and no silent fallback."""

from __future__ import annotations

import enum
import json
import os
import platform
import subprocess
import sys
import types
from collections.abc import Iterator

import pytest
import torch

from harness import devices
from harness.devices import precision
from harness.errors import UsageError


class CubeMathType(enum.IntEnum):
    """torch_npu.npu.CubeMathType, as torch_npu 2.13.0 defines it."""

    KEEP_DTYPE = 0
    ALLOW_FP32_DOWN_PRECISION = 1
    USE_FP16 = 2
    USE_HF32 = 3


class FakeNpu:
    """What torch_npu attaches as `torch.npu` (and is `torch_npu.npu`), as a card without CANN
    quirks answers, recording what the harness asks of it. HF32 starts as torch_npu leaves it: on
    for convolutions, off for matmuls, the cube math type never set."""

    CubeMathType = CubeMathType

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.matmul = types.SimpleNamespace(allow_hf32=False, cube_math_type=None)
        self.conv = types.SimpleNamespace(allow_hf32=True)

    def is_available(self) -> bool:
        return True

    def set_device(self, device: str) -> None:
        self.calls.append(f"set_device({device})")

    def device_count(self) -> int:
        return 8

    def get_device_name(self, index: int) -> str:
        return "Ascend910B3"

    def get_soc_version(self) -> int:
        return 223

    def is_jit_compile_false(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.calls.append("synchronize")


def fake_module(npu: FakeNpu) -> types.ModuleType:
    module = types.ModuleType("torch_npu")
    module.__version__ = "2.13.0.fake"
    module.npu = npu
    module.utils = types.SimpleNamespace(get_cann_version=lambda module="CANN": {"CANN": "8.5.0", "DRIVER": "25.2.0"}[module])
    module._C = types.SimpleNamespace(_npu_getOption=lambda name: {"ALLOW_INTERNAL_FORMAT": b"disable"}.get(name))
    return module


@pytest.fixture
def fake_torch_npu(monkeypatch: pytest.MonkeyPatch) -> FakeNpu:
    npu = FakeNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake_module(npu))
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    for name in ("ASCEND_RT_VISIBLE_DEVICES", "HCCL_DETERMINISTIC", "ASCEND_LAUNCH_BLOCKING"):
        monkeypatch.delenv(name, raising=False)
    return npu


@pytest.fixture
def broken_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_npu installed without CANN: importing it raises."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` raise ImportError


@pytest.fixture
def restore_torch_precision() -> Iterator[None]:
    """Tests here set torch's process-wide precision switches; put them back, the top level first
    (setting a level also sets the levels below it)."""
    paths = [
        "torch.backends.fp32_precision",
        *precision.FP32_PRECISION["cpu"],
        *precision.FP32_PRECISION["cuda"],
        *precision.REDUCED_REDUCTIONS["cuda"],
    ]
    saved = {path: precision._get(path) for path in paths}
    yield
    for path, value in saved.items():
        precision._set(path, value)


def test_npu_is_picked_first_and_described(fake_torch_npu: FakeNpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("HCCL_DETERMINISTIC", "true")
    assert devices.resolve_accelerator("auto") == "npu"
    card = devices.open_card("npu", 3)
    assert (card.kind, card.index, card.torch_device, card.model, card.simulated) == ("npu", 3, "npu:0", "Ascend910B3", False)
    assert card.label == "npu3"
    assert card.runtime == {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_npu": "2.13.0.fake",
        "cann": "8.5.0",
        "driver": "25.2.0",
        "soc_version": "223",
        "ASCEND_RT_VISIBLE_DEVICES": "3",
    }
    assert card.settings == {
        "precision": "strict",
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
        "HCCL_DETERMINISTIC": "true",
        "ASCEND_LAUNCH_BLOCKING": None,
        "torch_npu.npu.matmul.allow_hf32": False,
        "torch_npu.npu.matmul.cube_math_type": "KEEP_DTYPE",
        "torch_npu.npu.conv.allow_hf32": False,
        "torch_npu.npu.is_jit_compile_false()": True,
        "torch_npu.npu.config.allow_internal_format": "disable",
    }
    assert devices.reduced_float32_matmul(card.settings) is None
    json.dumps(card.as_dict())  # what every actor reports and `runs.devices` stores
    assert fake_torch_npu.calls == ["set_device(npu:0)"]
    devices.synchronize(card)
    assert fake_torch_npu.calls[-1] == "synchronize"


def test_info_lists_every_npu_card_and_how_a_card_computes(fake_torch_npu: FakeNpu) -> None:
    npu = devices.describe_local()["npu"]
    assert npu["available"] and npu["devices"] == ["Ascend910B3"] * 8  # type: ignore[index]
    assert npu["runtime"]["cann"] == "8.5.0"  # type: ignore[index]
    assert npu["settings"]["torch_npu.npu.is_jit_compile_false()"] is True  # type: ignore[index]
    assert npu["settings"]["torch_npu.npu.conv.allow_hf32"] is True  # type: ignore[index]  # read, never set


def test_npu_device_default_leaves_the_card_as_it_comes(fake_torch_npu: FakeNpu) -> None:
    fake_torch_npu.matmul.allow_hf32 = True
    card = devices.open_card("npu", 0, precision="device-default")
    assert card.settings["precision"] == "device-default"
    assert card.settings["torch_npu.npu.matmul.allow_hf32"] is True and card.settings["torch_npu.npu.conv.allow_hf32"] is True
    assert card.settings["torch_npu.npu.matmul.cube_math_type"] is None
    assert devices.reduced_float32_matmul(card.settings) == "hf32"
    strict = devices.open_card("npu", 0)
    assert devices.reduced_float32_matmul(strict.settings) is None
    assert (fake_torch_npu.matmul.allow_hf32, fake_torch_npu.conv.allow_hf32) == (False, False)


def test_the_fake_torch_npu_has_every_path_the_harness_uses(fake_torch_npu: FakeNpu) -> None:
    for path in devices.TORCH_NPU_API:
        owner: object = sys.modules["torch_npu"]
        for part in path.split(".")[1:]:
            owner = getattr(owner, part)


def test_npu_fields_that_fail_to_read_are_left_empty(fake_torch_npu: FakeNpu, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*args: object) -> object:
        raise RuntimeError("the call needs CANN")

    module = sys.modules["torch_npu"]
    monkeypatch.setattr(module.utils, "get_cann_version", fails)
    monkeypatch.setattr(module._C, "_npu_getOption", fails)
    monkeypatch.setattr(fake_torch_npu, "get_soc_version", fails)
    monkeypatch.delattr(fake_torch_npu.matmul, "cube_math_type")  # an older torch_npu
    card = devices.open_card("npu", 1, precision="device-default")
    assert (card.runtime["cann"], card.runtime["driver"], card.runtime["soc_version"]) == ("", "", "")
    assert card.settings["torch_npu.npu.matmul.cube_math_type"] is None
    assert card.settings["torch_npu.npu.config.allow_internal_format"] is None


def test_npu_asked_for_without_torch_npu_is_an_error_never_a_cpu_fallback(broken_torch_npu: None) -> None:
    ok, why = devices.npu_available()
    assert not ok and "torch_npu is not importable" in why
    with pytest.raises(UsageError, match="--accelerator npu asked for, but torch_npu is not importable"):
        devices.resolve_accelerator("npu")
    with pytest.raises(UsageError, match="an NPU card was asked for"):
        devices.open_card("npu", 0)
    with pytest.raises(UsageError, match="--precision strict on an NPU card, but torch_npu is not importable"):
        devices.apply_precision("npu", "strict")
    assert devices.resolve_accelerator("auto") in ("cuda", "cpu")
    settings = devices.read_precision("npu")
    assert (
        settings["torch_npu.npu.matmul.allow_hf32"] is None and settings["torch_npu.npu.config.allow_internal_format"] is None
    )
    assert devices.runtime_versions("npu")["cann"] == ""


def test_npu_present_but_unavailable(fake_torch_npu: FakeNpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_torch_npu, "is_available", lambda: False)
    with pytest.raises(UsageError, match=r"is_available\(\) is False"):
        devices.resolve_accelerator("npu")


def test_cuda_asked_for_on_a_cpu_machine_is_an_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UsageError, match="--accelerator cuda asked for"):
        devices.resolve_accelerator("cuda")


def test_cuda_strict_turns_tf32_and_reduced_reductions_off(
    monkeypatch: pytest.MonkeyPatch, restore_torch_precision: None
) -> None:
    """The switches are torch's own, on any build; only the card is pretended where there is none."""
    if not torch.cuda.is_available():
        monkeypatch.setattr("harness.devices.card.cuda_available", lambda: (True, ""))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA H200")
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    card = devices.open_card("cuda", 2, precision="device-default")
    assert card.settings["torch.backends.cuda.matmul.fp32_precision"] == "tf32"
    assert devices.reduced_float32_matmul(card.settings) == "tf32"
    card = devices.open_card("cuda", 2)
    assert card.label == "cuda2" and card.torch_device == "cuda:0" and not card.simulated
    assert {k: v for k, v in card.settings.items() if k in precision.FP32_PRECISION["cuda"]} == dict.fromkeys(
        precision.FP32_PRECISION["cuda"], "ieee"
    )
    assert not any(card.settings[k] for k in precision.REDUCED_REDUCTIONS["cuda"])
    assert devices.reduced_float32_matmul(card.settings) is None
    assert {"cuda", "cudnn", "cublas", "driver", "CUDA_VISIBLE_DEVICES"} <= set(card.runtime)


def test_cpu_cards_are_labelled_simulated_and_compute_strict_float32(restore_torch_precision: None) -> None:
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"  # what torch.set_float32_matmul_precision("medium") does
    card = devices.open_card("cpu", 1, precision="device-default")
    assert card.simulated and card.label == "sim-cpu1" and card.torch_device == "cpu"
    assert devices.reduced_float32_matmul(card.settings) == "bf16"
    card = devices.open_card("cpu", 1)
    assert card.settings["precision"] == "strict"
    assert {k: card.settings[k] for k in precision.FP32_PRECISION["cpu"]} == dict.fromkeys(
        precision.FP32_PRECISION["cpu"], "ieee"
    )
    assert devices.reduced_float32_matmul(card.settings) is None
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    ref = devices.cpu_reference()
    assert not ref.simulated and ref.label == "cpu"
    assert ref.settings["precision"] == "strict" and devices.reduced_float32_matmul(ref.settings) is None
    assert devices.RAY_RESOURCE == {"npu": "NPU", "cuda": "GPU", "cpu": "NPU"}


@pytest.mark.parametrize(
    ("settings", "reduced"),
    [
        ({"torch.backends.cuda.matmul.fp32_precision": "ieee", "torch.backends.cudnn.conv.fp32_precision": "tf32"}, None),
        ({"torch.backends.cuda.matmul.fp32_precision": "none"}, None),
        ({"torch.backends.cuda.matmul.fp32_precision": "tf32"}, "tf32"),
        ({"torch.backends.cuda.matmul.allow_tf32": True}, "tf32"),  # torch < 2.9
        ({"torch.backends.cuda.matmul.allow_tf32": None}, None),  # not readable
        ({"torch.backends.mkldnn.matmul.fp32_precision": "bf16"}, "bf16"),
        (
            {
                "torch_npu.npu.matmul.allow_hf32": False,
                "torch_npu.npu.matmul.cube_math_type": None,
                "torch_npu.npu.conv.allow_hf32": True,
            },
            None,
        ),
        ({"torch_npu.npu.matmul.allow_hf32": True, "torch_npu.npu.matmul.cube_math_type": None}, "hf32"),
        (
            {"torch_npu.npu.matmul.allow_hf32": False, "torch_npu.npu.matmul.cube_math_type": "ALLOW_FP32_DOWN_PRECISION"},
            "hf32",
        ),
        ({"torch_npu.npu.matmul.allow_hf32": False, "torch_npu.npu.matmul.cube_math_type": "USE_HF32"}, "hf32"),
        ({"torch_npu.npu.matmul.allow_hf32": False, "torch_npu.npu.matmul.cube_math_type": "USE_FP16"}, "fp16"),
        ({"torch_npu.npu.matmul.allow_hf32": None, "torch_npu.npu.matmul.cube_math_type": None}, None),
    ],
)
def test_reduced_float32_matmul(settings: dict[str, object], reduced: str | None) -> None:
    assert devices.reduced_float32_matmul(settings) == reduced


def test_an_unknown_precision_is_a_usage_error() -> None:
    assert devices.PRECISIONS == ("strict", "device-default")
    with pytest.raises(UsageError, match="--precision 'fast' is not one of strict, device-default"):
        devices.open_card("cpu", 0, precision="fast")


def test_before_torch_2_9_the_legacy_flags_are_read_and_never_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "FP32_PRECISION_API", False)
    settings = devices.read_precision("cuda")
    assert {"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"} <= set(settings)
    assert not any(key.endswith("fp32_precision") for key in settings)
    assert devices.read_precision("cpu") == {
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled()
    }


def test_backend_autoload_is_off_before_torch_is_imported() -> None:
    code = "import sys, os; import harness.devices; print(os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'], 'torch' in sys.modules)"
    env_free = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_free, check=True).stdout.split()
    assert out == ["0", "True"]
