"""Nodes of a real multi-node Ray cluster killed under a running sweep: a card's node with no spare
card (the run ends incomplete within its bound, and resumes to an uninterrupted run's verdicts),
with a spare card (the run goes on, the replacement card labelled as such), and, while the first
run resumes, the CPU reference's node (incomplete again, resumed).

One `ray.cluster_utils.Cluster` on this machine for the module: a head with nothing to place on,
and nodes of one card or one CPU added and killed as the scenarios need. Its GCS checks each node
every 0.5 s, so a lost node is seen in about 1.5 s (Ray's default takes 15 s). A node is killed as
a machine dies: its raylet by pid, with the workers it started. The sweeps run in this process
(the `harness` command line, in-process), so the placement timeout can be shortened for the
scenarios that wait it out.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

import harness.cluster.place
from harness.cluster import ray_internals
from tests.helpers import cli, read_table

pytestmark = pytest.mark.slow

# Long enough that a card still has work when its node dies after the first units: its episodes
# run one at a time (single batching), the costliest units, and come last.
SWEEP = (
    "sweep",
    "--policy",
    "cartpole",
    "--dtypes",
    "float32",
    "--batch-sizes",
    "1,8,64",
    "--episodes",
    "12",
    "--episode-batching",
    "single",
    "--accelerator",
    "cpu",
    "--cards",
    "2",
    "--no-progress",
)
CARD_NODE: dict[str, Any] = {"num_cpus": 0, "resources": {"NPU": 1}}
CPU_NODE: dict[str, Any] = {"num_cpus": 1}
# A lost node is seen after health_check_failure_threshold failed checks, health_check_period_ms apart.
HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
SHORT_PLACEMENT_S = 5.0
# What identifies a verdict apart from the run, its times and the cards' labels.
VERDICT = ("unit_id", "output", "kind", "gating", "passed", "bitwise_equal", "max_abs", "n_mismatch", "error_ratio")


@dataclass
class Nodes:
    """The module's cluster and its named nodes, each killable by its raylet's pid."""

    cluster: Any  # ray.cluster_utils.Cluster
    nodes: dict[str, Any] = field(default_factory=dict)  # name -> ray._private.node.Node
    added: int = 0

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def ensure(self, cards: int, cpus: int) -> None:
        """At least `cards` nodes of one card and `cpus` of one CPU: a scenario sets up what it
        needs, whatever the one before it left."""
        for kind, args, wanted in (("card", CARD_NODE, cards), ("cpu", CPU_NODE, cpus)):
            while sum(name.startswith(kind) for name in self.nodes) < wanted:
                self.added += 1
                self.nodes[f"{kind}-{self.added}"] = self.cluster.add_node(**args)

    def holding(self, actor_class: str) -> list[str]:
        """The nodes where an actor of that class runs now (its process is titled ray::CLASS)."""
        return [name for name, node in self.nodes.items() if any(actor_class in _cmdline(pid) for pid in _workers(node))]

    def kill(self, name: str) -> None:
        """Kill a node as a machine dies: its raylet by pid, and the workers it started."""
        node = self.nodes.pop(name)
        workers = _workers(node)
        os.kill(_raylet_pid(node), signal.SIGKILL)
        for pid in workers:
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.cluster.remove_node(node, allow_graceful=False)


def _raylet_pid(node: Any) -> int:
    return int(node.all_processes["raylet"][0].process.pid)


def _workers(node: Any) -> list[int]:
    """The processes a node's raylet started (its workers)."""
    raylet, found = _raylet_pid(node), []
    for entry in Path("/proc").iterdir():
        with suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == raylet:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    with suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


@pytest.fixture(scope="module")
def nodes() -> Iterator[Nodes]:
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 0, "include_dashboard": False, "_system_config": HEALTH_CHECKS}
    cluster = Nodes(Cluster(initialize_head=True, head_node_args=head))
    try:
        # Every node is on this machine: the test process's drivers join the head's raylet, as on
        # a real cluster, where the machine a scenario kills is never the driver's.
        with ray_internals.drivers_join_the_head(cluster.cluster):
            cluster.ensure(cards=2, cpus=1)
            yield cluster
    finally:
        cluster.cluster.shutdown()


def verdicts(results: Path) -> Counter[tuple[object, ...]]:
    """The run's checks as verdicts: which card gave a row, and when, does not count."""
    return Counter(tuple(row[c] for c in VERDICT) for row in read_table(results, "checks").to_pylist())


@pytest.fixture(scope="module")
def clean(nodes: Nodes, tmp_path_factory: pytest.TempPathFactory) -> Counter[tuple[object, ...]]:
    results = tmp_path_factory.mktemp("clean")
    proc = cli(*SWEEP, "--results", str(results), "--address", nodes.address)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return verdicts(results)


@dataclass
class Killed:
    """A sweep during which a node was killed: how it ended, and what was staged at the kill."""

    proc: CompletedProcess[str]
    staged_at_kill: set[str]

    def lines(self, prefix: str) -> list[str]:
        return [line.strip() for line in self.proc.stdout.splitlines() if line.strip().startswith(prefix)]


def sweep_killing(nodes: Nodes, results: Path, run_id: str, holding: str, *args: str, after_units: int = 2) -> Killed:
    """The sweep `args` (the whole sweep by default), in this process; once `after_units` more
    units are staged than before it, the node of an actor of class `holding` is killed."""
    staging = results / ".staging" / run_id
    before = len(list(staging.glob("*.done")))
    staged_at_kill: list[set[str]] = []

    def kill_when_staged() -> None:
        deadline = time.monotonic() + 240
        while len(list(staging.glob("*.done"))) < before + after_units:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        staged = {p.name.removesuffix(".done") for p in staging.glob("*.done")}
        nodes.kill(nodes.holding(holding)[0])
        staged_at_kill.append(staged)

    killer = threading.Thread(target=kill_when_staged, daemon=True)
    killer.start()
    proc = cli(*(args or (*SWEEP, "--results", str(results), "--run-id", run_id, "--address", nodes.address)))
    killer.join(timeout=30)
    assert staged_at_kill, f"the sweep ended before the kill: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    return Killed(proc, staged_at_kill[0])


def resume_command(killed: Killed) -> list[str]:
    """The resume command the incomplete run printed, as printed (without `harness`)."""
    *_, command = killed.proc.stderr.strip().splitlines()[-1].partition("finish it with: ")
    assert command.startswith("harness sweep --resume "), killed.proc.stderr[-2000:]
    return shlex.split(command)[1:]


def assert_incomplete_and_kept(killed: Killed, results: Path, run_id: str) -> None:
    proc = killed.proc
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run] = read_table(results, "runs").to_pylist()
    assert run["status"] == "incomplete"
    summary = json.loads(run["summary"])
    assert summary["lost"] and summary["done_units"] < summary["units"]
    done = {p.name.removesuffix(".done") for p in (results / ".staging" / run_id).glob("*.done")}
    assert killed.staged_at_kill <= done, "every unit finished before the kill is kept"
    # Ray prints its own warnings on stdout too (a task it retries), in between the summary's lines.
    [verdict] = killed.lines(f"run {run_id}: ")
    assert verdict.startswith(f"run {run_id}: INCOMPLETE ({len(done)} of {summary['units']} units done and kept"), verdict
    assert not (results / "checks").exists(), "an incomplete run publishes no checks"


@pytest.mark.ray_recovery
def test_a_lost_card_node_and_then_a_lost_reference_node_end_the_run_incomplete_and_resume_completes_it(
    nodes: Nodes, clean: Counter[tuple[object, ...]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A card's node lost, then, while that run resumes, the CPU reference's node: each time the
    run ends incomplete with what was done kept, and the last resume completes it to the verdicts
    of a run nothing interrupted."""
    monkeypatch.setattr(harness.cluster.place, "PLACEMENT_TIMEOUT_S", SHORT_PLACEMENT_S)
    nodes.ensure(cards=2, cpus=1)
    killed = sweep_killing(nodes, tmp_path, "nodeloss", "PolicyActor")
    # The loss is seen, then the card's bundle waits SHORT_PLACEMENT_S for a node.
    assert_incomplete_and_kept(killed, tmp_path, "nodeloss")
    [lost] = killed.lines("LOST ")
    assert lost.startswith("LOST card") and "is gone, and no other node took its place within 5 s" in lost, lost
    assert "; it was running cartpole float32 " in lost
    assert killed.proc.stderr.strip().splitlines()[-1] == (
        f"harness: incomplete: finish it with: harness sweep --resume nodeloss --results {tmp_path} --address {nodes.address}"
    )

    nodes.ensure(cards=2, cpus=1)  # a node in place of the lost one
    again = sweep_killing(nodes, tmp_path, "nodeloss", "ReferenceActor", *resume_command(killed), after_units=1)
    assert_incomplete_and_kept(again, tmp_path, "nodeloss")
    assert killed.staged_at_kill < again.staged_at_kill, "the resume ran units the first run had not"
    [lost] = again.lines("LOST ")
    assert lost.startswith("LOST the CPU reference: its node ") and "no other node took its place" in lost, lost

    nodes.ensure(cards=2, cpus=1)
    resumed = cli(*resume_command(again))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    [run] = read_table(tmp_path, "runs").to_pylist()
    assert run["status"] == "passed" and json.loads(run["summary"])["resumed_units"] >= len(again.staged_at_kill)
    assert verdicts(tmp_path) == clean


def test_a_spare_card_takes_over_and_the_run_goes_on(nodes: Nodes, clean: Counter[tuple[object, ...]], tmp_path: Path) -> None:
    nodes.ensure(cards=3, cpus=1)  # a spare
    killed = sweep_killing(nodes, tmp_path, "spare", "PolicyActor")
    proc = killed.proc
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [moved] = killed.lines("card")
    assert " restarted on node " in moved and " replaces sim-cpu0@" in moved, moved
    [run] = read_table(tmp_path, "runs").to_pylist()
    assert run["status"] == "passed"
    [(replacement, before)] = json.loads(run["summary"])["replaced"].items()
    [described] = [d for d in json.loads(run["devices"]) if d.get("replaces")]
    assert described["label"] == replacement and described["replaces"] == before
    labels = {r["device_a"] for r in read_table(tmp_path, "checks").to_pylist()}
    assert replacement in labels and set(before) <= labels, "results from before and after the move, each under its card"
    assert verdicts(tmp_path) == clean
