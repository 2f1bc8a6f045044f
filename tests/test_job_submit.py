"""The `ray job submit` path: a real `ray start --head` on 127.0.0.1, the sweep as a job, Parquet read back.

In its own module so that no other Ray cluster of the test session is alive beside it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, read_table

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head_node(tmp_path: Path):
    """`ray start --head` on 127.0.0.1 with two declared cards, stopped at the end whatever happens."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    port, dashboard = _free_port(), _free_port()
    ray = str(bin_dir / "ray")
    subprocess.run([ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                    "--resources", json.dumps({"NPU": 2}), "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={dashboard}", f"--dashboard-agent-listen-port={_free_port()}", "--disable-usage-stats"], env=env, check=True, capture_output=True, timeout=120)
    try:
        yield env, f"http://127.0.0.1:{dashboard}"
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_ray_job_submit_runs_the_sweep(head_node: tuple[dict[str, str], str], tmp_path: Path) -> None:
    env, dashboard = head_node
    results = tmp_path / "results"
    cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", dashboard, "--working-dir", str(REPO),
           "--", "python", "jobs/sweep.py", "--policy", "cartpole", "--dtypes", "float32", "--episodes", "1",
           "--batch-sizes", "1,8", "--accelerator", "cpu", "--no-progress", "--results", str(results)]
    deadline = time.monotonic() + 90
    while True:  # the head's job agent comes up some seconds after `ray start` returns
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
        if "No available agent" not in proc.stderr or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in proc.stdout
    [run] = read_table(results, "runs").to_pylist()
    assert run["status"] == "passed" and run["n_cards"] == 2
    assert "jobs/sweep.py" in run["command"]
    checks = read_table(results, "checks")
    assert checks.num_rows > 0 and all(checks.column("passed").to_pylist())
