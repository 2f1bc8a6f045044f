"""`Accelerator`: all the functions the harness needs of one accelerator family, in the shape of
Ray's `AcceleratorManager` (python/ray/_private/accelerators/accelerator.py): detection that
says why not and never raises, the Ray resource and actor options of one card, opening the card
a process drives in a precision mode, describing it for every result, and what `harness info`
shows. One subclass per family (npu.py, cuda.py, cpu.py), registered once (registry.py).

A subclass fills the abstract hooks (`_detect`, `select`, `synchronize`, `switches`, `cards`)
and overrides what differs from the defaults (a Ray resource other than its own, the settings it
records besides its switches, its runtime versions).
"""

from __future__ import annotations

import platform
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import ClassVar, NamedTuple

import torch

from harness.devices.precision import Switch, check_mode, make_strict, read_switches, torch_reduced_matmul
from harness.devices.reading import read_setting
from harness.devices.kind import Kind
from harness.errors import UsageError, first_line


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
    # How it computes: the precision mode asked for, what it set ("set"), then every setting as
    # read after that (`Accelerator.read_precision`).
    settings: dict[str, object] = field(default_factory=dict)
    label: str = ""  # short stable name used in result rows: `npu1`, `cuda0`, `sim-cpu0`, `cpu`

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Detection(NamedTuple):
    available: bool
    reason: str  # why not; "" when available


class Accelerator(ABC):
    """One accelerator family. Instances are made by the registry, one per registered name
    (`self.kind`), and hold no state of their own: the card is the process's."""

    display: ClassVar[str]  # how messages name a card: "an NPU card was asked for ..."
    ray_resource: ClassVar[str]  # the Ray resource one card actor takes
    simulated: ClassVar[bool] = False  # CPU cards standing in for accelerators
    # Cards a private local Ray declares for this kind (simulated cards only); None: the node's own.
    local_cards: ClassVar[int | None] = None
    # Ray's loggers that only say what this kind is not (Ray asks AscendCL of a node that declares NPUs).
    quiet_loggers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, kind: Kind) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind!r})"

    # Detection -------------------------------------------------------------------------------

    def detect(self) -> Detection:
        """Whether this process can drive a card of this kind, and why not. Never raises."""
        try:
            return self._detect()
        except Exception as exc:
            return Detection(False, f"detecting it raised {type(exc).__name__}: {first_line(exc)}")

    @abstractmethod
    def _detect(self) -> Detection: ...

    # Ray ------------------------------------------------------------------------------------

    def actor_options(self) -> dict[str, object]:
        """Ray options that give an actor one card of this kind."""
        return {"resources": {self.ray_resource: 1}}

    def local_ray_resources(self, cards: int | None) -> dict[str, float] | None:
        """What a private local Ray declares for `cards` cards: None where the node's own cards count."""
        if self.local_cards is None:
            return None
        return {self.ray_resource: float(cards or self.local_cards)}

    def ray_card_id(self, position: int) -> int:
        """The card's id on its node as Ray assigned it (`position` outside Ray). Ray hides the
        other cards (ASCEND_RT_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES), so in here it is ordinal 0."""
        import ray

        if not ray.is_initialized():
            return position
        ids = ray.get_runtime_context().get_accelerator_ids().get(self.ray_resource, [])
        return int(ids[0]) if ids else position

    # The card a process drives ---------------------------------------------------------------

    def open(self, index: int, precision: str = "strict") -> Device:
        """Select the card this process drives, set it to `precision` and describe it. A card
        that is not really there is a UsageError, never a CPU in its place."""
        check_mode(precision)
        node = platform.node()
        available, why = self.detect()
        if not available:
            raise UsageError(f"{self.display} card was asked for on {node}, but {why}")
        model = self.select()
        done = self.apply_precision(precision)
        return Device(
            self.kind,
            index,
            self.torch_device(),
            model,
            self.simulated,
            node,
            self.runtime(),
            self.described(precision, done),
            self.label(index),
        )

    @abstractmethod
    def select(self) -> str:
        """Make the card Ray gave this process current (always ordinal 0); return its model name."""

    def torch_device(self) -> str:
        return f"{self.kind}:0"

    def label(self, index: int) -> str:
        return f"sim-{self.kind}{index}" if self.simulated else f"{self.kind}{index}"

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for queued work on the card, so a timer measures the work and not its launch."""

    def runtime(self) -> dict[str, str]:
        """What the card runs on: versions, and its id as Ray set it ("" where unreadable)."""
        return {"torch": torch.__version__, "python": platform.python_version()}

    # Precision -------------------------------------------------------------------------------

    @abstractmethod
    def switches(self) -> tuple[Switch, ...]:
        """The settings `strict` sets and reads back on the torch this process runs."""

    def readings(self) -> dict[str, object]:
        """Settings recorded as they are, never set: determinism, environment variables."""
        return {"torch.are_deterministic_algorithms_enabled()": read_setting(torch.are_deterministic_algorithms_enabled)}

    def apply_precision(self, mode: str) -> dict[str, object]:
        """Set this process's card to `mode` before any policy runs; returns what was set.
        `strict` turns off every reduced float32 mode the card has and checks it reads back off;
        `device-default` changes nothing."""
        check_mode(mode)
        return {} if mode == "device-default" else make_strict(self.switches())

    def read_precision(self) -> dict[str, object]:
        """How this process's card computes, keyed by each setting's own name; a setting this
        torch lacks reads `absent: ...`, one that fails to read `unreadable: <why>`. Never raises."""
        try:
            switches = self.switches()
        except Exception as exc:
            return {"switches": f"unreadable: {type(exc).__name__}: {first_line(exc)}"} | self.readings()
        return read_switches(switches) | self.readings()

    def described(self, mode: str, done: dict[str, object]) -> dict[str, object]:
        return {"precision": mode, "set": done} | self.read_precision()

    def reduced_float32_matmul(self, settings: dict[str, object]) -> str | None:
        """The reduced format this kind's float32 matmuls ran in, from its `read_precision`
        ("tf32", "hf32", "bf16", "fp16"); None for full float32."""
        return torch_reduced_matmul(settings)

    # harness info ----------------------------------------------------------------------------

    @abstractmethod
    def cards(self) -> list[str]:
        """The model of every card of this kind this process sees (all of the node's, outside Ray)."""

    def warnings(self) -> list[str]:
        """What `harness info` should point out even where the card is there (mismatched versions)."""
        return []

    def local(self) -> dict[str, object]:
        """What `harness info` shows: available or why not, the cards, what they run on, how a
        card computes before a sweep sets its precision mode."""
        available, why = self.detect()
        entry: dict[str, object] = {"available": available, "reason": why, "simulated": self.simulated, "devices": []}
        if available:
            entry |= {"devices": self.cards(), "runtime": self.runtime(), "settings": self.read_precision()}
        return entry | {"warnings": self.warnings()}
