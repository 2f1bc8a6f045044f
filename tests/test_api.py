"""The Python API: `harness.sweep(**options)` and `harness.bench(**options)` run what the command
runs and return a typed `RunResult`; bad options raise `harness.UsageError` with the line the
command prints; `import harness` stays light until a run starts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import harness
from tests.conftest import Head
from tests.helpers import REPO, cli


def test_import_harness_stays_light() -> None:
    """Neither torch nor Ray until a run starts: the API's names come when asked for."""
    script = textwrap.dedent(
        """
        import sys
        import harness
        assert callable(harness.sweep) and callable(harness.bench) and harness.RunResult and harness.UsageError
        heavy = sorted(m for m in ("torch", "ray", "pyarrow", "numpy") if m in sys.modules)
        assert not heavy, heavy
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_no_package_of_the_harness_shadows_the_api() -> None:
    """A subpackage named `harness/sweeps/` would replace the function `harness.sweep` the moment
    anything imported it (Python sets a package's attribute to each submodule it imports)."""
    script = textwrap.dedent(
        """
        import importlib, pkgutil, harness
        for module in pkgutil.walk_packages(harness.__path__, "harness."):
            if not module.name.endswith("__main__"):
                importlib.import_module(module.name)
        import harness.api
        assert harness.sweep is harness.api.sweep and harness.bench is harness.api.bench, (harness.sweep, harness.bench)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"policy": ["cartpole"], "cards": 0}, "--cards 0: must be at least 1"),
        ({"dtypes": ["float64"]}, "--dtypes 'float64' is not one of"),
        ({"batch_size": [8]}, "unknown option batch_size"),
        ({"policy": ["cartpole"], "policies": ["huggy-arch"]}, "policies given twice"),
        ({"episodes": "many"}, "episodes 'many'"),
        ({"seed": "1"}, "seed must be an int"),
    ],
)
def test_bad_options_raise_the_commands_one_line(options: dict[str, object], words: str, tmp_path: Path) -> None:
    with pytest.raises(harness.UsageError) as raised:
        harness.sweep(results=str(tmp_path / "results"), progress=False, **options)
    assert words in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "results").exists()


def test_the_command_and_the_api_refuse_alike(tmp_path: Path) -> None:
    with pytest.raises(harness.UsageError) as raised:
        harness.sweep(cards=0, results=str(tmp_path))
    proc = cli("sweep", "--cards", "0", "--results", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip() == f"harness: error: {raised.value}"


@pytest.mark.slow
def test_a_sweep_returns_its_result_and_tables(ray_head: Head, tmp_path: Path) -> None:
    """In this process, on the session's cluster: a typed result whose tables are the run's rows."""
    result = harness.sweep(
        policy=["cartpole"],
        dtypes=["float32"],
        batch_sizes=[8],
        episodes=2,
        accelerator="cpu",
        cards=2,
        results=tmp_path,
        run_id="api-joined",
        progress=False,
        address=ray_head.address,
    )
    assert (result.run_id, result.status, result.exit_code, result.passed) == ("api-joined", "passed", 0, True)
    checks, episodes = result.checks(), result.episodes()
    assert checks.num_rows > 0 and set(checks.column("run_id").to_pylist()) == {"api-joined"}
    assert all(checks.column("passed").to_pylist()[i] for i, g in enumerate(checks.column("gating").to_pylist()) if g)
    played = [(r["device"], r["mode"]) for r in episodes.to_pylist()]
    assert {"sim-cpu0", "sim-cpu1", "cpu"} <= {device for device, _ in played}
    assert all(played.count(pair) == 2 for pair in set(played))  # 2 episodes of each mode on each
    assert result.summary["units"] > 0 and result.failures() == []
    runs = cli("query", "select command from runs", "--results", str(tmp_path), "--format", "csv").stdout
    assert "harness.sweep(policy=['cartpole']" in runs


@pytest.mark.slow
def test_a_failing_sweep_says_what_failed(ray_head: Head, tmp_path: Path) -> None:
    result = harness.sweep(
        policy="cartpole",
        dtypes="float32",
        batch_sizes=[8],
        episodes=0,
        accelerator="cpu",
        cards=2,
        inject_fault=["card1:corrupt-weight"],
        results=tmp_path,
        progress=False,
        address=ray_head.address,
    )
    assert (result.status, result.exit_code, result.passed) == ("failed", 1, False)
    assert result.failures() and all("sim-cpu1" in line for line in result.failures())


@pytest.mark.slow
def test_the_issues_call_on_a_private_ray(tmp_path: Path) -> None:
    """The call as a notebook makes it, with no cluster to join: a private local Ray, in a fresh
    interpreter (a Ray of its own, as a user's script has)."""
    script = textwrap.dedent(
        f"""
        import harness
        result = harness.sweep(policy=["cartpole"], dtypes=["float32"], batch_sizes=[8], episodes=2,
                               accelerator="cpu", cards=2, results={str(tmp_path)!r}, run_id="api", progress=False)
        assert result.passed and result.exit_code == 0, result
        assert result.checks().num_rows > 0
        print("ROWS", result.checks().num_rows)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ROWS" in proc.stdout
