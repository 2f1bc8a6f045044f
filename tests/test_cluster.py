"""The sweep on Ray clusters it must start, join or refuse: two nodes on this machine, a cluster
too small or unplaceable, nothing at the address, a cluster that wants a token this client lacks
or runs other versions, and a dead head's leftover address file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import harness.cluster.place
from harness.cluster import ray_internals
from harness.errors import UsageError
from harness.config.command_plan import sweep_plan
from harness.config.options import SweepConfig
from harness.sweeps.driver import run_sweep
from harness.sweeps.resolve import resolve
from tests.conftest import Head, free_port
from tests.helpers import REPO, assert_usage_error, cli, read_table, start_ray_node

pytestmark = pytest.mark.slow

TINY = dict(policies=["cartpole"], dtypes=["float32"], episodes=1, batch_sizes=[1, 8], accelerator="cpu", progress=False)


@pytest.fixture(scope="module")
def two_nodes():
    """A real two-node Ray cluster on this machine, one simulated card per node."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"NPU": 1}})
    cluster.add_node(num_cpus=1, resources={"NPU": 1})
    yield cluster
    cluster.shutdown()


def test_two_nodes_one_card_each(two_nodes, tmp_path: Path) -> None:
    outcome = run_sweep(resolve(sweep_plan(SweepConfig(**TINY, address=two_nodes.address, cards=2, results=str(tmp_path)))))
    assert outcome.passed
    [run] = read_table(tmp_path, "runs").to_pylist()
    cards = json.loads(run["devices"])[:2]
    assert cards[0]["node_id"] and cards[0]["node_id"] != cards[1]["node_id"], "one card per node"
    checks = read_table(tmp_path, "checks").to_pylist()
    assert checks and all(r["passed"] for r in checks if r["gating"])
    # The two cards share the id 0 on their nodes: their labels are qualified, and they are compared.
    cross = [r for r in checks if r["kind"] == "cross_card"]
    assert cross and len({r["device_a"] for r in cross} | {r["device_b"] for r in cross}) == 2
    assert {c["label"] for c in cards} == {f"sim-cpu0@{c['node_id'][:6]}" for c in cards}


def test_info_lists_the_cluster_resources(two_nodes) -> None:
    proc = cli("info", "--json", "--address", two_nodes.address)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ray_info = json.loads(proc.stdout)["ray"]
    assert ray_info["nodes"] == 2 and ray_info["resources"]["NPU"] == 2.0


def test_too_few_cards_fails_at_once_listing_what_the_cluster_has(two_nodes, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"needs 5 NPU card\(s\) but the cluster has 2; cluster resources: .*on 2 node"):
        run_sweep(resolve(sweep_plan(SweepConfig(**TINY, address=two_nodes.address, cards=5, results=str(tmp_path)))))


def test_unplaceable_cards_fail_within_the_placement_timeout(
    two_nodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Enough cards in total, but STRICT_PACK wants them on one node: no such node exists. The
    30 s of a real run are shortened here; the wait is the same code."""
    assert harness.cluster.place.PLACEMENT_TIMEOUT_S == 30.0
    monkeypatch.setattr(harness.cluster.place, "PLACEMENT_TIMEOUT_S", 2.0)
    with pytest.raises(UsageError, match=r"could not place 2 NPU card\(s\) and 1 CPU \(STRICT_PACK\) within 2 s"):
        config = SweepConfig(**TINY, address=two_nodes.address, cards=2, placement="STRICT_PACK", results=str(tmp_path))
        run_sweep(resolve(sweep_plan(config)))


def test_no_cluster_at_address_is_exit_2(tmp_path: Path) -> None:
    proc = cli("sweep", "--policy", "cartpole", "--accelerator", "cpu", "--address", "127.0.0.1:1", "--results", str(tmp_path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("harness: error: cannot join the Ray cluster at 127.0.0.1:1: nothing answers there")
    assert lines[-1].endswith("start it (ray start --head) or give the address it printed (--address or RAY_ADDRESS)")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["sweep", "bench"])
def test_ray_that_does_not_start_is_one_line_exit_3_and_the_run_says_incomplete(command: str, tmp_path: Path) -> None:
    """Ray's socket paths must fit in 107 bytes: under a temporary folder this deep, `ray.init`
    fails for real, as a node that cannot start does. The machine's failure, not the user's: exit 3
    with the cause, and a sweep keeps its run, `incomplete`, with the command that finishes it."""
    ray_tmp = tmp_path / ("x" * 60) / ("y" * 30)
    results = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(ray_tmp)}
    quick = ("--duration", "0.02", "--batch-sizes", "8") if command == "bench" else ("--episodes", "0")
    args = ("--policy", "cartpole", "--accelerator", "cpu", "--no-progress", *quick, "--results", str(results))
    proc = subprocess.run(
        [sys.executable, "-m", "harness", command, *args, "--run-id", "nostart"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("harness: incomplete: Ray did not start: "), line
    assert not [pid for pid in _pids() if str(ray_tmp) in _cmdline(pid)], "no Ray process left behind"
    if command == "sweep":
        assert line.endswith(f"; finish it with: harness sweep --resume nostart --results {results}"), line
        [run] = read_table(results, "runs").to_pylist()
        assert run["status"] == "incomplete" and json.loads(run["summary"])["stopped"].startswith("Ray did not start")
        assert (results / ".staging" / "nostart").is_dir()


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_fault_on_a_card_the_cluster_does_not_have_is_refused_once_it_says_how_many(two_nodes, tmp_path: Path) -> None:
    """Without --cards the cluster says how many cards a run gets: a fault beyond them is refused
    as soon as that is known, before any actor starts, with nothing written."""
    proc = cli(
        *("sweep", "--policy", "cartpole", "--accelerator", "cpu", "--no-progress", "--address", two_nodes.address),
        *("--inject-fault", "card2:corrupt-weight", "--results", str(tmp_path)),
    )
    assert_usage_error(
        proc, "--inject-fault card2:corrupt-weight: the run has 2 card(s) (all the cluster has): card0 to card1"
    )
    assert "actors 1/" not in proc.stdout and not (tmp_path / "runs").exists()


TOKEN = "5f2c1a" * 8


@pytest.fixture(scope="module")
def token_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `ray start --head` with token authentication, its token in the environment only (the
    home of the user who runs the tests keeps its own ~/.ray/auth_token)."""
    home = tmp_path_factory.mktemp("head-home")
    env = {**_without_auth(os.environ), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN, "HOME": str(home)}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    port = free_port()
    node = start_ray_node(
        ["--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=1", "--include-dashboard=false"], env
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        node.stop()


def _without_auth(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")}


@pytest.mark.parametrize(
    ("auth", "cause"),
    [
        ({}, "requires a token and token authentication is off in this client (RAY_AUTH_MODE=unset)"),
        (
            {"RAY_AUTH_MODE": "disabled"},
            "requires a token and token authentication is off in this client (RAY_AUTH_MODE=disabled)",
        ),
        ({"RAY_AUTH_MODE": "token"}, "requires a token and this client has none"),
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 48}, "refused this client's token (from RAY_AUTH_TOKEN)"),
    ],
)
def test_joining_a_token_cluster_without_its_token_says_why(
    token_head: str, auth: dict[str, str], cause: str, tmp_path: Path
) -> None:
    env = {**_without_auth(os.environ), **auth, "HOME": str(tmp_path)}  # no ~/.ray/auth_token here
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "sweep", "--policy", "cartpole", "--accelerator", "cpu", "--address", token_head],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_usage_error(proc, f"the Ray cluster at {token_head} {cause}", "`ray get-auth-token` on its head prints it")


def test_joining_a_token_cluster_with_its_token_works(token_head: str, tmp_path: Path) -> None:
    env = {**_without_auth(os.environ), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN, "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "info", "--json", "--address", token_head],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["ray"]["nodes"] == 1


@pytest.mark.ray_versions
def test_joining_a_cluster_of_other_versions_names_both_and_the_fix(ray_head: Head, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray compares this process's versions with the ones the cluster stored; this process
    pretends to be another Ray."""
    import ray

    python = ".".join(map(str, sys.version_info[:3]))
    monkeypatch.setattr(ray, "__version__", "2.9.3")
    try:
        with pytest.raises(UsageError) as refused:
            harness.cluster.place.connect(ray_head.address, "cpu", None)
    finally:
        ray.shutdown()
    monkeypatch.undo()
    assert str(refused.value).startswith(f"the Ray cluster at {ray_head.address} runs Ray {ray.__version__} on Python ")
    assert f", this client Ray 2.9.3 on Python {python}: join it from an environment with the cluster's versions" in str(
        refused.value
    )


def test_a_refused_sweep_leaves_nothing_behind(two_nodes, tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        run_sweep(resolve(sweep_plan(SweepConfig(**TINY, address=two_nodes.address, cards=5, results=str(tmp_path)))))
    assert not any(tmp_path.iterdir()), list(tmp_path.rglob("*"))


def test_a_dead_heads_address_file_does_not_make_the_sweep_join_it(tmp_path: Path) -> None:
    """A killed `ray start --head` leaves Ray's ray_current_cluster file behind; a plain
    `ray.init()` would try to join that dead cluster. The sweep starts its own."""
    address_file = Path(ray_internals.ray_address_file())
    saved = address_file.read_text() if address_file.exists() else None
    address_file.parent.mkdir(parents=True, exist_ok=True)
    address_file.write_text("127.0.0.1:1")  # nothing listens there
    try:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness",
                "sweep",
                "--policy",
                "cartpole",
                "--dtypes",
                "float32",
                "--episodes",
                "0",
                "--batch-sizes",
                "1",
                "--accelerator",
                "cpu",
                "--no-progress",
                "--results",
                str(tmp_path),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        if saved is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(saved)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = read_table(tmp_path, "runs").to_pylist()
    assert run["status"] == "passed"
