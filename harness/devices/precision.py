"""Precision modes: a card computes float32 in full float32 before anything runs (`strict`), or as
it comes (`device-default`); either way every card's description records how it computed.

Measured on an H200: with TF32 on for float32 matmuls a card's float32 error is 884-2302x the
CPU's. Ascend's HF32 is the same idea, and torch_npu turns it on for convolutions by default. A
card whose float32 matmuls ran reduced is labelled so (`reduced_float32_matmul`), never judged as
float32.

Each accelerator (harness/devices/cpu.py, cuda.py, npu.py) lists its `Switch`es: the settings that
`strict` sets, under the names they have in torch or torch_npu, for the torch it runs on. torch >=
2.9 sets float32 precision per backend and operator (`fp32_precision`: "ieee" is full float32,
"tf32" and "bf16" are reduced, "none" takes the level above's) and raises when these and the
legacy flags are mixed, so there only the new names are set and read. Before 2.9 the legacy ones
are the only ones: `allow_tf32` and `torch.set_float32_matmul_precision("highest")`.

`strict` sets every switch, then reads each back: a switch that reads otherwise (or cannot be
read) fails the card, because a card that only might compute in full float32 would be judged as
if it did. What was set and what was read are both recorded. Light on purpose: the names of the
modes are read by option validation, without torch.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, get_args

from harness.devices.reading import is_unreadable, plain, read_setting
from harness.errors import UsageError, first_line

Precision = Literal["strict", "device-default"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)

# `torch.get_float32_matmul_precision()` as torch documents its levels: "high" lets float32
# matmuls use TF32 (or bf16x3), "medium" bfloat16. Only read before torch 2.9.
MATMUL_PRECISION = "torch.get_float32_matmul_precision()"
MATMUL_PRECISION_REDUCED = {"high": "tf32", "medium": "bf16"}


def check_mode(mode: str) -> None:
    if mode not in PRECISIONS:
        raise UsageError(f"--precision {mode!r} is not one of {', '.join(PRECISIONS)}")


def fp32_precision_api() -> bool:
    """torch >= 2.9: float32 precision is set per backend and operator (`fp32_precision`)."""
    import torch

    return hasattr(torch.backends, "fp32_precision")


def always() -> bool:
    return True


@dataclass(frozen=True)
class Switch:
    """One setting of how a card computes, under its own name in torch or torch_npu."""

    name: str  # as recorded: "torch.backends.cuda.matmul.allow_tf32", MATMUL_PRECISION, ...
    strict: object  # the plain value `strict` sets and must read back: "ieee", False, "highest", "KEEP_DTYPE"
    get: Callable[[], object]
    make_strict: Callable[[], None] = field(repr=False)
    # False where this torch has no such setting: then it is neither set nor needed (a switch
    # that is not there cannot reduce anything) and recorded as absent.
    present: Callable[[], bool] = field(default=always, repr=False)
    # Sets it back to a value `get` read (a warm card going back to how its process started);
    # None where the setting cannot be set to any value but the strict one.
    restore: Callable[[object], None] | None = field(default=None, repr=False)


def torch_attribute(path: str, strict: object, optional: bool = False) -> Switch:
    """A switch that is an attribute under torch: `torch.backends.cudnn.conv.fp32_precision`.
    `optional` ones are absent from some supported torch versions."""

    def owner() -> tuple[object, str]:
        import torch

        _torch, *parents, name = path.split(".")
        found: object = torch
        for part in parents:
            found = getattr(found, part)
        return found, name

    def get() -> object:
        found, name = owner()
        return getattr(found, name)

    def make_strict() -> None:
        restore(strict)

    def restore(value: object) -> None:
        found, name = owner()
        setattr(found, name, value)

    def present() -> bool:
        try:
            get()
        except AttributeError:  # torch's backend flags raise AttributeError("Unknown attribute ...")
            return False
        return True

    return Switch(path, strict, get, make_strict, present if optional else always, restore)


def matmul_precision_switch() -> Switch:
    """torch < 2.9: the level every float32 matmul runs at (CUDA's TF32 and the CPU's bf16 matmuls)."""
    import torch

    return Switch(
        MATMUL_PRECISION,
        "highest",
        torch.get_float32_matmul_precision,
        lambda: torch.set_float32_matmul_precision("highest"),
        restore=lambda value: torch.set_float32_matmul_precision(str(value)),
    )


def absent(switch_name: str) -> str:
    return f"absent: torch {installed('torch')} has no {switch_name}"


def installed(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def make_strict(switches: Iterable[Switch]) -> dict[str, object]:
    """Set every present switch to its strict value, then read each back; returns what was set.
    A switch that cannot be set, or reads back otherwise, is a UsageError naming it."""
    done: dict[str, Switch] = {}
    for switch in switches:
        if not _present(switch):
            continue
        try:
            switch.make_strict()
        except Exception as exc:
            raise UsageError(
                f"--precision strict: cannot set {switch.name} to {switch.strict!r} ({type(exc).__name__}: {first_line(exc)})"
            ) from None
        done[switch.name] = switch
    for name, switch in done.items():
        got = read_setting(switch.get)
        if got != switch.strict:
            raise UsageError(f"--precision strict: {name} reads {got!r} after it was set to {switch.strict!r}")
    return {name: switch.strict for name, switch in done.items()}


def switch_values(switches: Iterable[Switch]) -> dict[str, object]:
    """Each present switch's value as `get` reads it, for `restore_switches` to set back."""
    return {s.name: s.get() for s in switches if _present(s)}


def restore_switches(switches: Iterable[Switch], values: dict[str, object]) -> None:
    """Set every switch of `values` back to its value there (where a switch has no `restore`, only
    its strict value can be). One that cannot be set back and reads otherwise now is a UsageError:
    the process would compute as it was left, not as it started."""
    for switch in switches:
        if switch.name not in values or read_setting(switch.get) == values[switch.name]:
            continue
        if switch.restore is not None:
            switch.restore(values[switch.name])
        elif values[switch.name] == switch.strict:
            switch.make_strict()
        else:
            raise UsageError(
                f"{switch.name} cannot be set back to {values[switch.name]!r} in a running process: "
                "stop the warm cards (harness down) and start them again (harness up)"
            )


def read_switches(switches: Iterable[Switch]) -> dict[str, object]:
    """Each switch as it reads now; `unreadable: <why>` or `absent: ...`, never blank."""
    return {s.name: read_setting(s.get) if _present(s) else absent(s.name) for s in switches}


def _present(switch: Switch) -> bool:
    try:
        return switch.present()
    except Exception:
        return True  # let the read say why


def torch_reduced_matmul(settings: dict[str, object]) -> str | None:
    """The reduced format torch's own switches let float32 matmuls run in ("tf32", "bf16"), or
    None for full float32. An unreadable matmul switch is a UsageError: such a card's float32
    cannot be told from a reduced one."""
    for name, value in settings.items():
        if name.endswith(".matmul.fp32_precision") or name in (MATMUL_PRECISION, "torch.backends.cuda.matmul.allow_tf32"):
            refuse_unreadable(name, value)
    for name, value in settings.items():
        if name.endswith(".matmul.fp32_precision") and value not in (None, "none", "ieee"):
            return str(value)
    if settings.get("torch.backends.cuda.matmul.allow_tf32") is True:
        return "tf32"
    return MATMUL_PRECISION_REDUCED.get(str(settings.get(MATMUL_PRECISION)))


def refuse_unreadable(name: str, value: object) -> None:
    if is_unreadable(value):
        raise UsageError(
            f"a card's float32 matmul mode is unknown ({name} = {plain(value)}); --precision strict sets and checks it"
        )
