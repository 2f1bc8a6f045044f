"""Ray's private modules are used in one module only (harness/cluster/ray_internals.py, which names
the Ray versions it was checked on): a job submitted to a cluster runs on the Ray its owners
installed, and a private name may be gone there. Shown to bite on a planted import."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
import ray
from packaging.requirements import Requirement

from harness.cluster import ray_internals
from tests.helpers import REPO

INTERNALS = REPO / "harness" / "cluster" / "ray_internals.py"
SCANNED = ("harness", "actors", "jobs", "benchmarks", "scripts", "tests")
# What an actor handle keeps private: its id.
PRIVATE_HANDLE_ATTRIBUTES = {"_actor_id", "_ray_actor_id"}


def private_module(name: str) -> bool:
    """Ray's, and private by name (a part with one leading underscore) or generated gRPC stubs."""
    first, *rest = name.split(".")
    private = any(p.startswith("_") and not p.startswith("__") for p in rest)
    return first == "ray" and (private or name.startswith("ray.core.generated"))


def dotted(node: ast.expr) -> str:
    """`ray._private.state` for that attribute chain; "" where it does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def private_ray_uses(source: str) -> list[str]:
    """Each use of a private Ray module or actor-handle attribute in `source`, with its line."""
    uses = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            uses += [f"{node.lineno}: import {a.name}" for a in node.names if private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
            if private_module(node.module) or any(private_module(n) for n in names):
                uses.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Attribute):
            name = dotted(node)
            if private_module(name) or node.attr in PRIVATE_HANDLE_ATTRIBUTES:
                uses.append(f"{node.lineno}: {name or node.attr}")
    return uses


def scanned_files() -> list[Path]:
    return [p for top in SCANNED for p in sorted((REPO / top).rglob("*.py")) if p != INTERNALS]


def test_no_private_ray_outside_the_internals_module() -> None:
    found = {str(p.relative_to(REPO)): uses for p in scanned_files() if (uses := private_ray_uses(p.read_text()))}
    assert not found, found


@pytest.mark.parametrize(
    "planted",
    [
        "import ray._private.state",
        "from ray._private.grpc_utils import init_grpc_channel",
        "from ray.core.generated import gcs_service_pb2",
        "from ray._common import utils",
        "from ray import _private",
        "import ray\nray._private.worker.get_dashboard_url()",
        "def f(actor):\n    return actor._actor_id.hex()",
    ],
)
def test_a_planted_private_use_is_found(planted: str) -> None:
    assert private_ray_uses(planted), planted


def test_public_ray_is_not_flagged() -> None:
    source = "import ray\nfrom ray.util.state import list_actors\nray.get_runtime_context().get_actor_id()\nray.__version__"
    assert private_ray_uses(source) == []


def test_the_declared_ray_range_is_the_tested_one_and_the_internals_name_its_ends() -> None:
    """The oldest Ray CI tests (Makefile CI_RAY) and the newest (this venv's) bound the range
    pyproject.toml declares, and the internals module says it was checked on both."""
    [spec] = [
        r
        for r in map(Requirement, tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
        if r.name == "ray"
    ]
    oldest = re.search(r"^CI_RAY := (\S+)$", (REPO / "Makefile").read_text(), flags=re.M)[1]  # type: ignore[index]
    assert f">={oldest.rsplit('.', 1)[0]}" in str(spec.specifier) and spec.specifier.contains(oldest)
    doc = ast.get_docstring(ast.parse(INTERNALS.read_text())) or ""
    assert f"Ray {oldest} and " in doc and private_ray_uses(INTERNALS.read_text())
    if ray.__version__ != oldest:  # the main venv: its Ray is the newest of the range
        assert spec.specifier.contains(ray.__version__) and f" and {ray.__version__}," in doc
        major, minor, _ = ray.__version__.split(".")
        assert not spec.specifier.contains(f"{major}.{int(minor) + 1}.0"), "no wider than tested"


@pytest.mark.slow
@pytest.mark.ray_versions
def test_a_driver_joins_the_heads_raylet_where_the_clusters_nodes_share_the_machine() -> None:
    """Four nodes of one cluster on this machine, as the lost-node tests make them: a driver
    started inside `drivers_join_the_head` joins the head's raylet, on each Ray of the range. On
    Ray 2.40, without it, the driver joins whichever node comes first by hash."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(3):
            cluster.add_node(num_cpus=0)
        cluster.wait_for_nodes()
        with ray_internals.drivers_join_the_head(cluster):
            ray.init(address=cluster.address, logging_level="ERROR")
            try:
                assert ray.get_runtime_context().get_node_id() == cluster.head_node.node_id
            finally:
                ray.shutdown()
    finally:
        cluster.shutdown()
