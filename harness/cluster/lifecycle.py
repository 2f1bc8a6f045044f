"""What every run does around its own work, the same for a sweep and a bench: claim a run id
(refused before Ray starts; held until the run ends), join or start Ray and shut it down, saying so as it happens, time its
phases, write the `runs` row that says which code, versions, devices and bytes produced it."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import ray

from harness.devices import Kind, accelerator
from harness.judge.outcome import RunStatus
from harness.cluster.phases import Phases
from harness.cluster.place import card_count, cluster_address, connect, describe_cluster
from harness.cluster.signals import sigterm_interrupts
from harness.cluster.provenance import now
from harness.store.claim import Claim
from harness.store.schema import RunRow, RunSummary
from harness.store.writer import new_run_id


def claim_run_id(results: Path, run_id: str | None, resume: bool = False, command: str = "") -> Claim:
    """`run_id` (or a new one) held by this process until the claim's `with` ends; refused (exit
    2) where the name is taken: a run of that name exists, or another process holds it
    (harness/store/claim.py). `resume` claims a run that ended early, to finish it."""
    return Claim.take(results, run_id or new_run_id(), resume, now(), command)


@dataclass(frozen=True)
class Joined:
    """The cluster a run joined (or started): how many cards the run gets, and its dashboard."""

    n_cards: int
    dashboard: str  # host:port, where a job's resume is submitted; "" where the cluster runs none


@contextmanager
def ray_cluster(address: str | None, kind: Kind, cards: int | None, phases: Phases) -> Iterator[Joined]:
    """Join `address` (or start a private local Ray) for the length of the run, saying so, the
    joining timed as "ray" and the shutdown as "shutdown"; yields how many cards the run gets
    (`cards`, or all the cluster has) and the dashboard. Ray that does not start is an
    InfrastructureError."""
    # What the run is doing, said as it happens, on stdout (the bar and errors are stderr's).
    joined = cluster_address(address)
    if joined:
        print(f"joining the Ray cluster at {joined}", flush=True)
    else:
        local = accelerator(kind).local_ray_resources(cards)
        print(f"starting Ray: a private local cluster{f' with {local}' if local else ''}", flush=True)
    try:
        with phases("ray"):
            dashboard = connect(address, kind, cards)
            n_cards = card_count(kind, cards)
        print(f"Ray up in {phases['ray']:.1f} s: {describe_cluster()}", flush=True)
        with sigterm_interrupts():  # again: ray.init set its own handler, which exits at once
            yield Joined(n_cards, dashboard)
    finally:
        with phases("shutdown"):
            ray.shutdown()


def finish_run_row(row: RunRow, status: RunStatus, summary: RunSummary, phases: Phases) -> RunRow:
    """The run's `runs` row at its end: status, finish time, and a summary with the phase timings."""
    row.finished_at, row.status = now(), status
    row.summary = replace(summary, timings_s=phases.as_json())
    return row


def said_at_the_end(run_id: str, results: Path, phases: Phases) -> None:
    """Where the run's time went, and the command that reports it."""
    print(phases.line())
    print(f"report: {shlex.join(['harness', 'report', run_id, '--results', str(results)])}")
