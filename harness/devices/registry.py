"""The one registry of accelerators: a name (`--accelerator npu`) to the class that holds all the
harness needs of that family (harness/devices/base.py `Accelerator`).

Light on purpose: `harness --help` and option validation read the names from here without
importing torch. Each class is imported by its path only when a run asks for it, as
lm-evaluation-harness registers its backends. Adding an accelerator is one module with one
`Accelerator` subclass and one line in ACCELERATORS (or `register` from outside the package;
a name taken already is refused).
Nothing else in the harness names a kind: the run, the actors and `harness info` ask the class.
The one script that does runs without the harness: harness/repro/script.py, which a repro folder
carries to a machine that has torch alone, takes the torch device (cpu, cuda:N, npu:N) by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from harness.devices.kind import Kind
from harness.errors import UsageError
from harness.registry import Registry, imported

if TYPE_CHECKING:
    from harness.devices.base import Accelerator

AUTO = "auto"

# name -> "module:Class", imported on first use. The order is `auto`'s: the first whose card is
# there, the simulated CPU cards when none is.
ACCELERATORS: Registry[str | type[Accelerator]] = Registry(
    "--accelerator",
    {"npu": "harness.devices.npu:Npu", "cuda": "harness.devices.cuda:Cuda", "cpu": "harness.devices.cpu:SimulatedCpu"},
)
SIMULATED = Kind("cpu")
"""Simulated cards on the CPU: what `auto` gets where no accelerator is, and the CPU reference's kind."""

_instances: dict[str, Accelerator] = {}


def names() -> tuple[Kind, ...]:
    return tuple(Kind(name) for name in ACCELERATORS)


def choices() -> tuple[str, ...]:
    """What `--accelerator` takes."""
    return (AUTO, *names())


def auto_help() -> str:
    """What `--accelerator auto` does, in the registry's order: "auto picks npu, then cuda, then simulated cpu cards"."""
    real = [name for name in names() if name != SIMULATED]
    return f"auto picks {', then '.join([*real, f'simulated {SIMULATED} cards'])}"


def as_kind(name: str) -> Kind:
    """`name` as a Kind; a name that is not registered is a UsageError that lists those that are."""
    if name in ACCELERATORS:
        return Kind(name)
    raise ACCELERATORS.unknown(name, choices())


def accelerator(kind: str) -> Accelerator:
    """The class registered as `kind`, imported on first use and instantiated once."""
    from harness.devices.base import Accelerator

    kind = as_kind(kind)
    if kind not in _instances:
        target: object = ACCELERATORS.get(kind)
        if isinstance(target, str):
            target = imported(target)
        if not (isinstance(target, type) and issubclass(target, Accelerator)):
            raise TypeError(f"accelerator {kind!r} is registered as {target!r}, not an Accelerator subclass")
        _instances[kind] = target(kind)
    return _instances[kind]


def accelerators() -> list[Accelerator]:
    return [accelerator(name) for name in names()]


def register(name: str, target: str | type[Accelerator]) -> Kind:
    """Add an accelerator: `target` is its class or its "module:Class" path. It takes its place
    before the simulated CPU cards, so `auto` tries it before falling back to them. A name taken
    already is refused (ValueError)."""
    if not name or name == AUTO or not name.isidentifier():
        raise ValueError(f"an accelerator's name must be an identifier other than {AUTO!r}, got {name!r}")
    ACCELERATORS.register(name, target, before=SIMULATED)
    _instances.pop(name, None)
    return Kind(name)


@contextmanager
def registered(name: str, target: str | type[Accelerator]) -> Iterator[Kind]:
    """`register` for the length of a `with` block (tests); the registry is put back after it."""
    kind = register(name, target)
    try:
        yield kind
    finally:
        ACCELERATORS.unregister(name)
        _instances.pop(name, None)


def resolve_accelerator(requested: str) -> Kind:
    """`auto` picks the first registered accelerator whose card is here, else simulated CPU cards;
    an explicit choice must be here. Never a silent fallback: a sweep that asked for NPUs and got
    the CPU would compare the CPU with itself and call that a pass."""
    if requested == AUTO:
        for kind in names():
            if kind != SIMULATED and accelerator(kind).detect().available:
                return kind
        return SIMULATED
    kind = as_kind(requested)
    available, why = accelerator(kind).detect()
    if not available:
        raise UsageError(f"--accelerator {kind} asked for, but {why}; use --accelerator {SIMULATED} for simulated cards")
    return kind
