"""Warm actors: a card's actor and the CPU ReferenceActor started by `harness up` before any sweep,
and set up for each sweep that uses them (`begin`) as if started for it: a card's as its
PolicyActor, or for a bench (`begin_bench`) as its BenchActor.

What a process keeps from one sweep to the next and could change a result is put back to how the
process started, then the sweep's own is set: the policies are loaded again from their files (with
the sweep's faults and precision plan), the card opened again in the sweep's precision mode after
its switches are set back to the values they started with (a `device-default` sweep after a
`strict` one computes as a fresh process does), torch's thread count set, the global random
generators (Python's, numpy's, torch's) put back to their starting state, and the `-once` fault
markers are the sweep's own files. Faults that act on the process itself (an environment variable
read at start, crashes and hangs, which need a process Ray can restart from the sweep's arguments)
are refused before they reach a warm actor (harness/cluster/warm.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from actors.bench_actor import BenchActor
from actors.policy_actor import PolicyActor
from actors.reference_actor import ReferenceActor
from harness.devices import SIMULATED, Kind, accelerator, open_card, ray_card_id

from harness.devices.precision import restore_switches, switch_values
from harness.inference.fault_specs import Fault
from harness.inference.runner import Described
from harness.policies import PolicySpec


@dataclass(frozen=True)
class Started:
    """How the process stood when it started, before any sweep: what `begin` puts back."""

    kind: Kind
    threads: int
    switches: dict[str, object]
    python_rng: tuple[Any, ...]
    numpy_rng: dict[str, Any]
    torch_rng: torch.Tensor

    @classmethod
    def now(cls, kind: Kind) -> Started:
        return cls(
            kind,
            torch.get_num_threads(),
            switch_values(accelerator(kind).switches()),
            random.getstate(),
            np.random.get_state(legacy=False),
            torch.random.get_rng_state(),
        )

    def restore(self) -> None:
        torch.set_num_threads(self.threads)
        restore_switches(accelerator(self.kind).switches(), self.switches)
        random.setstate(self.python_rng)
        np.random.set_state(self.numpy_rng)
        torch.random.set_rng_state(self.torch_rng)


class WarmCardActor(PolicyActor, BenchActor):
    """A card's actor that outlives a sweep: `__init__` opens the card (the start a sweep saves:
    the process, torch, the card's runtime); PolicyActor's own constructor runs in `begin`, once
    per sweep, with the sweep's arguments, or BenchActor's in `begin_bench`, once per bench. The
    two share no method but the description; each constructor sets every attribute its methods
    read, so neither run sees what the other left."""

    def __init__(self, kind: Kind, position: int) -> None:
        self.label = open_card(kind, ray_card_id(kind, position), "device-default").label
        self.kind, self.position = kind, position
        self.started = Started.now(kind)
        self.served: str | None = None

    def ready(self) -> str:
        """Answered once the actor is up: its card's label."""
        return self.label

    def begin(
        self,
        run_id: str,
        policies: list[PolicySpec],
        threads: int,
        precision: str,
        faults: list[Fault],
        fault_marker: str,
    ) -> Described:
        """Set up for run `run_id` as a PolicyActor started for it would be; says itself, warm,
        with the run it served before."""
        self.started.restore()
        PolicyActor.__init__(self, self.kind, self.position, policies, threads, precision, faults, fault_marker)
        before, self.served = self.served, run_id
        self.described = replace(PolicyActor.describe(self), warm=True, served_before=before)
        return self.described

    def begin_bench(
        self, run_id: str, policies: list[PolicySpec], threads: int, precision: str, faults: list[Fault]
    ) -> Described:
        """Set up for bench `run_id` as a BenchActor started for it would be. The card's runtime
        stays warm: on an NPU an operator compiled for an earlier run is not compiled again, so a
        first call's latency there is a warm process's (`runs.devices` says `warm`)."""
        self.started.restore()
        BenchActor.__init__(self, self.kind, self.position, policies, threads, precision, faults)
        before, self.served = self.served, run_id
        self.described = replace(BenchActor.describe(self), warm=True, served_before=before)
        return self.described

    def describe(self) -> Described:
        return self.described


class WarmReferenceActor(ReferenceActor):
    """The CPU reference that outlives a sweep; ReferenceActor's constructor runs in `begin` (WarmCardActor)."""

    def __init__(self) -> None:
        self.started = Started.now(SIMULATED)
        self.served: str | None = None

    def ready(self) -> str:
        return "cpu"

    def begin(self, run_id: str, policies: list[PolicySpec], threads: int) -> Described:
        self.started.restore()
        ReferenceActor.__init__(self, policies, threads)
        before, self.served = self.served, run_id
        self.described = replace(ReferenceActor.describe(self), warm=True, served_before=before)
        return self.described

    def describe(self) -> Described:
        return self.described
