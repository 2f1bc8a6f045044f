"""The CPU reference's work shared over a pool of actors changes no byte of a run's results: the
same sweep with a pool of one and of three, on a `ray.cluster_utils.Cluster` with CPUs for both,
gives equal `checks` and `episodes` rows (the run id apart), and its runs row records the pool. A
pool member killed under the run is restarted by Ray, its work retried, and the rows hold."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from contextlib import suppress
from typing import Any

import pytest

from harness.config.command_plan import sweep_plan
from harness.config.options import SweepConfig
from harness.sweeps.driver import run_sweep
from harness.sweeps.resolve import resolve
from tests.helpers import read_table

pytestmark = pytest.mark.slow

# Batches in two dtypes (golden, float32 and the card's dtype: three results per batch to share
# out) and a set of episodes per mode, played and replayed as an honest card.
SWEEP = dict(
    policies=["cartpole"],
    dtypes=["float32", "float16"],
    batch_sizes=[1, 64],
    episodes=3,
    accelerator="cpu",
    cards=2,
    progress=False,
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two simulated cards and three CPUs: room for a pool of three beside them."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 3, "resources": {"NPU": 2}, "include_dashboard": False}
    )
    yield cluster
    cluster.shutdown()


def rows(results: Path, table: str) -> Counter[tuple[str, ...]]:
    """A table's rows without the run id, each value as repr (so NaN equals NaN), in no order."""
    found = read_table(results, table).drop_columns(["run_id"]).to_pylist()
    assert found, table
    return Counter(tuple(repr(row[column]) for column in sorted(row)) for row in found)


def sweep(cluster: Any, results: Path, pool: int, run_id: str | None = None) -> dict[str, Counter[tuple[str, ...]]]:
    """The sweep with a pool of `pool`; its checks and episodes rows, once its runs row is checked."""
    config = SweepConfig(**SWEEP, address=cluster.address, reference_pool=pool, results=str(results), run_id=run_id)
    outcome = run_sweep(resolve(sweep_plan(config)))
    assert outcome.passed, outcome.status
    [run] = read_table(results, "runs").to_pylist()
    summary, devices = json.loads(run["summary"]), json.loads(run["devices"])
    assert summary["reference_pool"] == pool
    assert [d["label"] for d in devices] == ["sim-cpu0", "sim-cpu1", *["cpu"] * pool]
    for busy in (summary["busy_s"], summary["busy_cpu_s"]):
        assert len(busy) == 2 + pool and all(s > 0 for s in busy.values()), busy
    return {table: rows(results, table) for table in ("checks", "episodes")}


@pytest.fixture(scope="module")
def pool_of_one(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Counter[tuple[str, ...]]]:
    return sweep(cluster, tmp_path_factory.mktemp("pool1"), 1)


def test_a_pool_of_one_and_of_three_give_the_same_checks_and_episodes(
    cluster: Any, pool_of_one: dict[str, Counter[tuple[str, ...]]], tmp_path: Path
) -> None:
    assert sweep(cluster, tmp_path, 3) == pool_of_one


def test_a_pool_member_killed_under_the_run_is_restarted_and_the_rows_hold(
    cluster: Any, pool_of_one: dict[str, Counter[tuple[str, ...]]], tmp_path: Path
) -> None:
    killed: list[int] = []

    def kill_a_member_after_the_first_unit() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            members = reference_processes(cluster)
            if len(members) == 3 and any((tmp_path / ".staging" / "killed").glob("*.done")):
                os.kill(members[-1], signal.SIGKILL)
                killed.append(members[-1])
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_member_after_the_first_unit, daemon=True)
    killer.start()
    got = sweep(cluster, tmp_path, 3, run_id="killed")
    killer.join(timeout=30)
    assert killed, "the sweep ended before a pool member could be killed"
    assert got == pool_of_one


def reference_processes(cluster: Any) -> list[int]:
    """The pids of the cluster's ReferenceActor processes (titled ray::ReferenceActor), children of its raylet."""
    raylet, found = int(cluster.head_node.all_processes["raylet"][0].process.pid), []
    for entry in Path("/proc").iterdir():
        with suppress(OSError, ValueError, IndexError):
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == raylet and b"ReferenceActor" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return sorted(found)
