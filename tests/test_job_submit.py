"""The `ray job submit` path: the session's `ray start --head` on 127.0.0.1, the sweep as a job,
Parquet read back; a job whose card hangs fails, its log saying what hung and how to finish it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Head
from tests.helpers import REPO, read_table

pytestmark = pytest.mark.slow

SWEEP = (
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
)


def submit(head: Head, *args: str, env_vars: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ray job submit -- python jobs/sweep.py ARGS`, waiting for the job's end; `env_vars` go to
    the job through its runtime environment, as the submit command of docs/clusters.md passes the revision."""
    ray = str(Path(sys.executable).parent / "ray")
    cmd = [ray, "job", "submit", "--address", head.dashboard, "--working-dir", str(REPO)]
    if env_vars:
        cmd += ["--runtime-env-json", json.dumps({"env_vars": env_vars})]
    cmd += ["--", "python", "jobs/sweep.py", *args]
    deadline = time.monotonic() + 90
    while True:  # the head's job agent comes up some seconds after `ray start` returns
        proc = subprocess.run(cmd, env=head.env, capture_output=True, text=True, timeout=400)
        if "No available agent" not in proc.stderr or time.monotonic() > deadline:
            return proc
        time.sleep(1)


def test_ray_job_submit_runs_the_sweep(ray_head: Head, tmp_path: Path) -> None:
    """Ray uploads the working dir without .git: the job records the revision the submitting side
    names (a made-up one here, so that it cannot come from a checkout)."""
    results = tmp_path / "results"
    proc = submit(ray_head, *SWEEP, "--results", str(results), env_vars={"HARNESS_GIT_REVISION": "submitted-0123abc"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in proc.stdout
    [run] = read_table(results, "runs").to_pylist()
    assert run["status"] == "passed" and run["n_cards"] == 2
    assert "jobs/sweep.py" in run["command"]
    assert run["git_revision"] == "submitted-0123abc"
    checks = read_table(results, "checks").to_pylist()
    assert checks and all(r["passed"] for r in checks if r["gating"])


def test_a_job_whose_card_hangs_fails_saying_what_hung_and_how_to_finish_it(ray_head: Head, tmp_path: Path) -> None:
    results = tmp_path / "results"
    hangs = ("--inject-fault", "card1:hang", "--hang-timeout", "2")
    proc = submit(ray_head, *SWEEP, *hangs, "--run-id", "hung", "--results", str(results))
    logs = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "failed" in logs, logs[-3000:]
    assert "Traceback" not in logs, logs[logs.find("Traceback") :][:3000]
    # `ray job submit` shows the job's log as it runs, and its end again in the failure's status.
    [lost] = {line.strip() for line in logs.splitlines() if line.strip().startswith("LOST ")}
    assert lost.startswith("LOST card1 (sim-cpu1): hung again after its restart (no progress for "), lost
    assert "run hung: INCOMPLETE (0 of 7 units done and kept;" in logs
    assert (
        f"jobs/sweep.py: incomplete: finish it with: ray job submit --address {ray_head.dashboard} --working-dir . -- "
        f"python jobs/sweep.py --resume hung --results {results}"
    ) in logs
    [run] = read_table(results, "runs").to_pylist()
    assert run["status"] == "incomplete" and json.loads(run["summary"])["lost"] == [lost.removeprefix("LOST ")]
