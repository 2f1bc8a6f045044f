"""The CPU reference's work shared over a pool of actors changes no byte of a run's results: the
same sweep with a pool of one and of three, on a `ray.cluster_utils.Cluster` with CPUs for both,
gives equal `checks` and `episodes` rows (the run id apart), and its runs row records the pool."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.config.command_plan import sweep_plan
from harness.config.options import SweepConfig
from harness.sweep.driver import run_sweep
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


def test_a_pool_of_one_and_of_three_give_the_same_checks_and_episodes(cluster: Any, tmp_path: Path) -> None:
    tables = {}
    for pool in (1, 3):
        results = tmp_path / f"pool{pool}"
        outcome = run_sweep(
            sweep_plan(SweepConfig(**SWEEP, address=cluster.address, reference_pool=pool, results=str(results)))
        )
        assert outcome.passed, outcome.status
        [run] = read_table(results, "runs").to_pylist()
        summary, devices = json.loads(run["summary"]), json.loads(run["devices"])
        assert summary["reference_pool"] == pool
        assert [d["label"] for d in devices] == ["sim-cpu0", "sim-cpu1", *["cpu"] * pool]
        assert len(summary["busy_s"]) == 2 + pool and all(s > 0 for s in summary["busy_s"].values()), summary["busy_s"]
        tables[pool] = {table: rows(results, table) for table in ("checks", "episodes")}
    for table in ("checks", "episodes"):
        assert tables[1][table] == tables[3][table], table
