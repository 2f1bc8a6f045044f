"""Device detection and description: the real NPU code path driven by a fake torch_npu module, the
precision modes on the real torch (whichever supported version this venv has: CI runs these on
torch 2.6, 2.9 and 2.13), and no silent fallback. Each check the harness makes has a test here
where it must fail."""

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
from harness.devices import cpu as cpu_module
from harness.devices import cuda as cuda_module
from harness.devices import npu as npu_module
from harness.devices import precision
from harness.errors import UsageError

NEW_API = precision.fp32_precision_api()  # torch >= 2.9


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
    module.__version__ = "2.13.0.fake"  # type: ignore[attr-defined]
    module.npu = npu  # type: ignore[attr-defined]
    module.utils = types.SimpleNamespace(  # type: ignore[attr-defined]
        get_cann_version=lambda module="CANN": {"CANN": "8.5.0", "DRIVER": "25.2.0"}[module]
    )
    module._C = types.SimpleNamespace(_npu_getOption=lambda name: {"ALLOW_INTERNAL_FORMAT": b"disable"}.get(name))  # type: ignore[attr-defined]
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
def pretend_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA card where there is none: torch's switches are its own on any build; only the card
    and its name are pretended."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")


def _torch_precision_paths() -> list[str]:
    if NEW_API:
        return ["torch.backends.fp32_precision", *cpu_module.FP32_PRECISION, *cuda_module.FP32_PRECISION]
    return list(cuda_module.LEGACY_TF32)


def _set(path: str, value: object) -> None:
    *parents, name = path.split(".")[1:]
    owner: object = torch
    for part in parents:
        owner = getattr(owner, part)
    setattr(owner, name, value)


@pytest.fixture
def restore_torch_precision() -> Iterator[None]:
    """Tests here set torch's process-wide precision switches; put them back, the top level first
    (setting a level also sets the levels below it)."""
    paths = _torch_precision_paths() + list(cuda_module.REDUCED_REDUCTIONS)
    switches = [precision.torch_attribute(path, None, optional=True) for path in paths]
    saved = {s.name: s.get() for s in switches if s.present()}
    matmul = torch.get_float32_matmul_precision()
    yield
    if not NEW_API:
        torch.set_float32_matmul_precision(matmul)
    for path, value in saved.items():
        _set(path, value)


# The NPU, through a fake torch_npu ------------------------------------------------------------


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
        "set": {
            "torch_npu.npu.matmul.allow_hf32": False,
            "torch_npu.npu.matmul.cube_math_type": "KEEP_DTYPE",
            "torch_npu.npu.conv.allow_hf32": False,
        },
        "torch_npu.npu.matmul.allow_hf32": False,
        "torch_npu.npu.matmul.cube_math_type": "KEEP_DTYPE",
        "torch_npu.npu.conv.allow_hf32": False,
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
        "torch_npu.npu.is_jit_compile_false()": True,
        "torch_npu.npu.config.allow_internal_format": "disable",
        "HCCL_DETERMINISTIC": "true",
        "ASCEND_LAUNCH_BLOCKING": None,
    }
    assert devices.reduced_float32_matmul(card.settings) is None
    json.dumps(card.as_dict())  # what every actor reports and `runs.devices` stores
    assert fake_torch_npu.calls == ["set_device(npu:0)"]
    devices.synchronize(card)
    assert fake_torch_npu.calls[-1] == "synchronize"
    assert devices.accelerator("npu").actor_options() == {"resources": {"NPU": 1}}


def test_the_device_record_keeps_its_shape(fake_torch_npu: FakeNpu) -> None:
    """`runs.devices` stores `as_dict()`: the same keys, in the same order, as before the classes."""
    expected = ["kind", "index", "torch_device", "model", "simulated", "node", "runtime", "settings", "label"]
    assert list(devices.open_card("npu", 0).as_dict()) == expected
    assert list(devices.cpu_reference().as_dict()) == expected


def test_info_lists_every_npu_card_and_how_a_card_computes(fake_torch_npu: FakeNpu) -> None:
    npu = devices.describe_local()["npu"]
    assert npu["available"] and npu["devices"] == ["Ascend910B3"] * 8  # type: ignore[index]
    assert npu["runtime"]["cann"] == "8.5.0"  # type: ignore[index]
    assert npu["settings"]["torch_npu.npu.is_jit_compile_false()"] is True  # type: ignore[index]
    assert npu["settings"]["torch_npu.npu.conv.allow_hf32"] is True  # type: ignore[index]  # read, never set
    assert npu["settings"]["torch_npu.npu.matmul.cube_math_type"] == "never set"  # type: ignore[index]


def test_npu_device_default_leaves_the_card_as_it_comes(fake_torch_npu: FakeNpu) -> None:
    fake_torch_npu.matmul.allow_hf32 = True
    card = devices.open_card("npu", 0, precision="device-default")
    assert card.settings["precision"] == "device-default" and card.settings["set"] == {}
    assert card.settings["torch_npu.npu.matmul.allow_hf32"] is True and card.settings["torch_npu.npu.conv.allow_hf32"] is True
    assert card.settings["torch_npu.npu.matmul.cube_math_type"] == "never set"
    assert devices.reduced_float32_matmul(card.settings) == "hf32"
    strict = devices.open_card("npu", 0)
    assert devices.reduced_float32_matmul(strict.settings) is None
    assert (fake_torch_npu.matmul.allow_hf32, fake_torch_npu.conv.allow_hf32) == (False, False)


def test_strict_fails_a_card_whose_switch_reads_back_otherwise(fake_torch_npu: FakeNpu) -> None:
    """A torch_npu that takes `conv.allow_hf32 = False` and keeps HF32 on is refused, never
    judged as float32."""

    class Stuck:
        allow_hf32 = property(lambda self: True, lambda self, value: None)

    fake_torch_npu.conv = Stuck()  # type: ignore[assignment]
    with pytest.raises(UsageError, match=r"torch_npu.npu.conv.allow_hf32 reads True after it was set to False"):
        devices.open_card("npu", 0)


def test_strict_fails_a_card_whose_switch_cannot_be_set(fake_torch_npu: FakeNpu) -> None:
    class Refuses:
        allow_hf32 = property(lambda self: True, lambda self, value: (_ for _ in ()).throw(RuntimeError("needs CANN")))

    fake_torch_npu.conv = Refuses()  # type: ignore[assignment]
    with pytest.raises(UsageError, match=r"cannot set torch_npu.npu.conv.allow_hf32 to False \(RuntimeError: needs CANN\)"):
        devices.open_card("npu", 0)


def test_the_fake_torch_npu_has_every_path_the_harness_uses(fake_torch_npu: FakeNpu) -> None:
    for path in devices.TORCH_NPU_API:
        owner: object = sys.modules["torch_npu"]
        for part in path.split(".")[1:]:
            owner = getattr(owner, part)


def test_npu_fields_that_fail_to_read_say_why_and_are_never_blank(
    fake_torch_npu: FakeNpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(*args: object) -> object:
        raise RuntimeError("the call needs CANN")

    module = sys.modules["torch_npu"]
    monkeypatch.setattr(module.utils, "get_cann_version", fails)
    monkeypatch.setattr(module._C, "_npu_getOption", fails)
    monkeypatch.setattr(fake_torch_npu, "get_soc_version", fails)
    monkeypatch.delattr(fake_torch_npu.matmul, "cube_math_type")
    card = devices.open_card("npu", 1, precision="device-default")
    assert (card.runtime["cann"], card.runtime["driver"], card.runtime["soc_version"]) == ("", "", "")
    assert card.settings["torch_npu.npu.matmul.cube_math_type"] == (
        "unreadable: AttributeError: 'types.SimpleNamespace' object has no attribute 'cube_math_type'"
    )
    assert card.settings["torch_npu.npu.config.allow_internal_format"] == "unreadable: RuntimeError: the call needs CANN"
    # A card whose float32 matmul mode is unknown gets no float32 label: the sweep stops (exit 2).
    with pytest.raises(UsageError, match=r"float32 matmul mode is unknown \(torch_npu.npu.matmul.cube_math_type = unreadable"):
        devices.reduced_float32_matmul(card.settings)


def test_npu_asked_for_without_torch_npu_is_an_error_never_a_cpu_fallback(broken_torch_npu: None) -> None:
    ok, why = devices.accelerator("npu").detect()
    assert not ok and "torch_npu is not importable" in why
    with pytest.raises(UsageError, match="--accelerator npu asked for, but torch_npu is not importable"):
        devices.resolve_accelerator("npu")
    with pytest.raises(UsageError, match="an NPU card was asked for"):
        devices.open_card("npu", 0)
    with pytest.raises(UsageError, match=r"--precision strict: cannot set .* \(RuntimeError: torch_npu is not importable"):
        devices.apply_precision("npu", "strict")
    assert devices.resolve_accelerator("auto") in ("cuda", "cpu")
    settings = {k: v for k, v in devices.read_precision("npu").items() if k.startswith("torch_npu.")}
    assert len(settings) == 5 and all(
        str(v).startswith("unreadable: RuntimeError: torch_npu is not importable") for v in settings.values()
    )
    assert devices.runtime_versions("npu")["cann"] == ""


def test_npu_present_but_unavailable(fake_torch_npu: FakeNpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_torch_npu, "is_available", lambda: False)
    with pytest.raises(UsageError, match=r"is_available\(\) is False"):
        devices.resolve_accelerator("npu")


def test_detection_never_raises(fake_torch_npu: FakeNpu, monkeypatch: pytest.MonkeyPatch) -> None:
    def explodes() -> bool:
        raise OSError("libascendcl.so: cannot open shared object file")

    monkeypatch.setattr(fake_torch_npu, "is_available", explodes)
    ok, why = devices.accelerator("npu").detect()
    assert not ok and "OSError: libascendcl.so" in why


@pytest.mark.parametrize(
    ("torch_version", "npu_version", "warned"),
    [
        ("2.6.0", "2.6.0.post5", False),
        ("2.13.0+cpu", "2.13.0", False),
        ("2.13.0", "2.6.0.post5", True),
        ("2.9.0", None, False),
    ],
)
def test_info_says_when_torch_and_torch_npu_are_not_the_same_x_y(
    monkeypatch: pytest.MonkeyPatch, torch_version: str, npu_version: str | None, warned: bool
) -> None:
    def version(name: str) -> str:
        found = {"torch": torch_version, "torch-npu": npu_version}[name]
        if found is None:
            raise npu_module.metadata.PackageNotFoundError(name)
        return found

    monkeypatch.setattr(npu_module.metadata, "version", version)
    warnings = devices.accelerator("npu").local()["warnings"]
    if warned:
        assert warnings == [
            f"torch {torch_version} and torch-npu {npu_version} are not the same X.Y: torch_npu 2.6 runs only on torch 2.6 "
            "(docs/versions.md: the support matrix)"
        ]
    else:
        assert warnings == []


# CUDA and the CPU, on the real torch of this venv ---------------------------------------------


def test_cuda_asked_for_on_a_cpu_machine_is_an_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UsageError, match="--accelerator cuda asked for"):
        devices.resolve_accelerator("cuda")
    with pytest.raises(UsageError, match="a CUDA card was asked for"):
        devices.open_card("cuda", 0)


def test_cuda_strict_turns_tf32_and_reduced_reductions_off(pretend_cuda: None, restore_torch_precision: None) -> None:
    """With the API this torch has: `fp32_precision` on >= 2.9, `allow_tf32` and the matmul
    precision before it (where cuDNN's TF32 is on by default)."""
    torch.set_float32_matmul_precision("high")  # TF32 matmuls, on every supported torch
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    card = devices.open_card("cuda", 2, precision="device-default")
    assert devices.reduced_float32_matmul(card.settings) == "tf32"
    key = "torch.backends.cuda.matmul.fp32_precision" if NEW_API else "torch.backends.cuda.matmul.allow_tf32"
    assert card.settings[key] == ("tf32" if NEW_API else True)
    card = devices.open_card("cuda", 2)
    assert card.label == "cuda2" and card.torch_device == "cuda:0" and not card.simulated
    switches = devices.accelerator("cuda").switches()
    present = [s for s in switches if s.present()]
    assert card.settings["set"] == {s.name: s.strict for s in present}
    assert {s.name: card.settings[s.name] for s in present} == {s.name: s.strict for s in present}
    if NEW_API:
        assert set(cuda_module.FP32_PRECISION) <= set(card.settings["set"])  # type: ignore[arg-type]
    else:
        assert card.settings["torch.backends.cudnn.allow_tf32"] is False
        assert card.settings["torch.get_float32_matmul_precision()"] == "highest"
    for path in cuda_module.REDUCED_REDUCTIONS:  # False where this torch has it, said to be absent where not
        assert card.settings[path] is False or str(card.settings[path]).startswith(
            f"absent: torch {torch.__version__.split('+')[0]}"
        )
    assert devices.reduced_float32_matmul(card.settings) is None
    assert {"cuda", "cudnn", "cublas", "driver", "CUDA_VISIBLE_DEVICES"} <= set(card.runtime)
    assert devices.accelerator("cuda").actor_options() == {"num_gpus": 1}


def test_cpu_cards_are_labelled_simulated_and_compute_strict_float32(restore_torch_precision: None) -> None:
    """The CPU's reduced float32 (oneDNN bf16 matmuls) is recorded and turned off on every torch."""
    torch.set_float32_matmul_precision("medium")  # bf16 matmuls on the CPU, on every supported torch
    card = devices.open_card("cpu", 1, precision="device-default")
    assert card.simulated and card.label == "sim-cpu1" and card.torch_device == "cpu"
    assert devices.reduced_float32_matmul(card.settings) == "bf16"
    card = devices.open_card("cpu", 1)
    assert card.settings["precision"] == "strict"
    if NEW_API:
        expected = dict.fromkeys(cpu_module.FP32_PRECISION, "ieee")
    else:
        expected = {"torch.get_float32_matmul_precision()": "highest"}
    assert card.settings["set"] == expected and {k: card.settings[k] for k in expected} == expected
    assert devices.reduced_float32_matmul(card.settings) is None
    torch.set_float32_matmul_precision("medium")
    ref = devices.cpu_reference()
    assert not ref.simulated and ref.label == "cpu"
    assert ref.settings["precision"] == "strict" and devices.reduced_float32_matmul(ref.settings) is None
    simulated = devices.accelerator(devices.SIMULATED)
    assert (simulated.ray_resource, simulated.actor_options()) == ("NPU", {"resources": {"NPU": 1}})
    assert simulated.local_ray_resources(None) == {"NPU": 2.0} and simulated.local_ray_resources(3) == {"NPU": 3.0}
    assert devices.accelerator("npu").local_ray_resources(3) is None  # real cards: the node's own


@pytest.mark.parametrize(
    ("settings", "reduced"),
    [
        ({"torch.backends.cuda.matmul.fp32_precision": "ieee", "torch.backends.cudnn.conv.fp32_precision": "tf32"}, None),
        ({"torch.backends.cuda.matmul.fp32_precision": "none"}, None),
        ({"torch.backends.cuda.matmul.fp32_precision": "tf32"}, "tf32"),
        ({"torch.backends.cuda.matmul.allow_tf32": True}, "tf32"),  # torch < 2.9
        ({"torch.backends.cuda.matmul.allow_tf32": False, "torch.get_float32_matmul_precision()": "highest"}, None),
        ({"torch.get_float32_matmul_precision()": "high"}, "tf32"),  # torch < 2.9, CPU or CUDA
        ({"torch.get_float32_matmul_precision()": "medium"}, "bf16"),
        ({"torch.backends.cuda.matmul.allow_tf32": "absent: torch 2.6.0 has no ..."}, None),
        ({"torch.backends.mkldnn.matmul.fp32_precision": "bf16"}, "bf16"),
        (
            {
                "torch_npu.npu.matmul.allow_hf32": False,
                "torch_npu.npu.matmul.cube_math_type": "never set",
                "torch_npu.npu.conv.allow_hf32": True,
            },
            None,
        ),
        ({"torch_npu.npu.matmul.allow_hf32": True, "torch_npu.npu.matmul.cube_math_type": "never set"}, "hf32"),
        (
            {"torch_npu.npu.matmul.allow_hf32": False, "torch_npu.npu.matmul.cube_math_type": "ALLOW_FP32_DOWN_PRECISION"},
            "hf32",
        ),
        ({"torch_npu.npu.matmul.allow_hf32": False, "torch_npu.npu.matmul.cube_math_type": "USE_HF32"}, "hf32"),
        ({"torch_npu.npu.matmul.allow_hf32": False, "torch_npu.npu.matmul.cube_math_type": "USE_FP16"}, "fp16"),
    ],
)
def test_reduced_float32_matmul(settings: dict[str, object], reduced: str | None) -> None:
    assert devices.reduced_float32_matmul(settings) == reduced


@pytest.mark.parametrize(
    "key",
    [
        "torch.backends.cuda.matmul.fp32_precision",
        "torch.backends.mkldnn.matmul.fp32_precision",
        "torch.backends.cuda.matmul.allow_tf32",
        "torch.get_float32_matmul_precision()",
        "torch_npu.npu.matmul.allow_hf32",
    ],
)
def test_an_unreadable_matmul_mode_is_never_taken_for_float32(key: str) -> None:
    with pytest.raises(UsageError, match="float32 matmul mode is unknown"):
        devices.reduced_float32_matmul({key: "unreadable: RuntimeError: mixed legacy and new APIs"})


def test_an_unknown_precision_is_a_usage_error() -> None:
    assert devices.PRECISIONS == ("strict", "device-default")
    with pytest.raises(UsageError, match="--precision 'fast' is not one of strict, device-default"):
        devices.open_card("cpu", 0, precision="fast")


def test_a_switch_this_torch_lacks_is_recorded_absent_and_never_set() -> None:
    missing = precision.torch_attribute("torch.backends.cuda.matmul.allow_fp64_magic", False, optional=True)
    assert precision.read_switches([missing]) == {
        "torch.backends.cuda.matmul.allow_fp64_magic": f"absent: torch {precision.installed('torch')} has no "
        "torch.backends.cuda.matmul.allow_fp64_magic"
    }
    assert precision.make_strict([missing]) == {}
    required = precision.torch_attribute("torch.backends.cuda.matmul.allow_fp64_magic", False)
    with pytest.raises(UsageError, match=r"cannot set torch\.backends\.cuda\.matmul\.allow_fp64_magic"):
        precision.make_strict([required])


def test_backend_autoload_is_off_before_torch_is_imported() -> None:
    code = (
        "import sys, os; import harness.devices; harness.devices.open_card; "
        "print(os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'], 'torch' in sys.modules)"
    )
    env_free = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_free, check=True).stdout.split()
    assert out == ["0", "True"]


def test_the_accelerator_names_come_without_torch() -> None:
    """`harness --help` and option validation read the registry; neither imports torch."""
    code = (
        "import sys; import harness.config.options as o; from harness.devices import choices, SIMULATED; "
        "print(','.join(choices()), SIMULATED, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["auto,npu,cuda,cpu", "cpu", "False"]
