"""What every run does around its own work, the same for a sweep and a bench: claim a run id
(refused before Ray starts; held until the run ends), join or start Ray and shut it down, time
its phases, write the `runs` row that says which code, versions, devices and bytes produced it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import ray

from harness.devices import Kind
from harness.run.place import card_count, connect
from harness.run.provenance import now
from harness.store.claim import Claim
from harness.store.schema import RunRow
from harness.store.writer import new_run_id


@dataclass
class Phases:
    """Where the wall time went, by phase: `with phases("compute"): ...` adds to that phase."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def __getitem__(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    def as_json(self) -> dict[str, float]:
        return {f"{name}_s": round(seconds, 3) for name, seconds in self.seconds.items()}


def claim_run_id(results: Path, run_id: str | None, resume: bool = False, command: str = "") -> Claim:
    """`run_id` (or a new one) held by this process until the claim's `with` ends; refused (exit
    2) where the name is taken: a run of that name exists, or another process holds it
    (harness/store/claim.py). `resume` claims a run that ended early, to finish it."""
    return Claim.take(results, run_id or new_run_id(), resume, now(), command)


@contextmanager
def ray_cluster(address: str | None, kind: Kind, cards: int | None, phases: Phases) -> Iterator[int]:
    """Join `address` (or start a private local Ray) for the length of the run, the joining
    timed as "startup"; yields how many cards the run gets (`cards`, or all the cluster has)."""
    try:
        with phases("startup"):
            connect(address, kind, cards)
            n_cards = card_count(kind, cards)
        yield n_cards
    finally:
        ray.shutdown()


def finish_run_row(row: RunRow, status: str, summary: dict[str, object], phases: Phases) -> RunRow:
    """The run's `runs` row at its end: status, finish time, and a summary with the phase timings."""
    row.finished_at, row.status = now(), status
    row.summary = json.dumps(summary | {"timings_s": phases.as_json()})
    return row
