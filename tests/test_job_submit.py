"""The `ray job submit` path: the session's `ray start --head` on 127.0.0.1, the sweep as a job,
Parquet read back."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Head
from tests.helpers import REPO, read_table

pytestmark = pytest.mark.slow


def test_ray_job_submit_runs_the_sweep(ray_head: Head, tmp_path: Path) -> None:
    results = tmp_path / "results"
    cmd = [
        str(Path(sys.executable).parent / "ray"),
        "job",
        "submit",
        "--address",
        ray_head.dashboard,
        "--working-dir",
        str(REPO),
        "--",
        "python",
        "jobs/sweep.py",
        "--policy",
        "cartpole",
        "--dtypes",
        "float32",
        "--episodes",
        "1",
        "--batch-sizes",
        "1,8",
        "--accelerator",
        "cpu",
        "--cards",
        "2",
        "--no-progress",
        "--results",
        str(results),
    ]
    deadline = time.monotonic() + 90
    while True:  # the head's job agent comes up some seconds after `ray start` returns
        proc = subprocess.run(cmd, env=ray_head.env, capture_output=True, text=True, timeout=400)
        if "No available agent" not in proc.stderr or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in proc.stdout
    [run] = read_table(results, "runs").to_pylist()
    assert run["status"] == "passed" and run["n_cards"] == 2
    assert "jobs/sweep.py" in run["command"]
    checks = read_table(results, "checks").to_pylist()
    assert checks and all(r["passed"] for r in checks if r["gating"])
