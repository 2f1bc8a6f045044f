"""Shared test fixtures: the third-party cases beside the checkout, one Ray cluster for the whole
session, and the sweeps that several test modules read, each run once.

`harness` is imported first: it sets the device-backend guard before any test module can
import torch, so every test file also passes run alone where torch_npu is installed.
"""

from __future__ import annotations

import harness  # noqa: F401  (the device-backend guard, before torch)

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import REPO, start_ray_node
from tests.helpers import harness as run_harness

CASES = REPO.parent / "shared" / "cases"
SESSION_CARDS = 4


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    """The test process computes beside the Ray actors it starts, on 2 cores: one thread each."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def cases() -> Path:
    if not CASES.is_dir():
        pytest.fail(f"{CASES} is missing: the tests read the shared cases from beside the checkout")
    return CASES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Head:
    """A `ray start --head` on 127.0.0.1: its GCS address, its dashboard (the job API) and the
    environment its client commands need."""

    address: str
    dashboard: str
    env: dict[str, str]


@pytest.fixture(scope="session")
def ray_head() -> Iterator[Head]:
    """One Ray cluster for every test that does not test starting one: 4 simulated cards, 2 CPUs,
    and the dashboard, so that `ray job submit` reaches it too. Stopped at the end of the session,
    and only it: `ray stop` would end every Ray on the machine, a user's own or a parallel run's.

    Its temporary folder is its own: a job's driver joins the cluster named in the temporary
    folder's `ray_current_cluster` file, which in the shared /tmp/ray names whichever cluster on
    the machine started last, another test run's as likely as this one's."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    port, dashboard = free_port(), free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    node = start_ray_node(
        [
            "--head",
            f"--temp-dir={temp_dir}",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--resources",
            json.dumps({"NPU": SESSION_CARDS}),
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--dashboard-agent-listen-port={free_port()}",
        ],
        env,
    )
    try:
        yield Head(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}", env)
    finally:
        node.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


@dataclass
class SharedSweeps:
    """Real `harness sweep` runs into one results folder on the session's cluster, each run id
    run once whichever test asks first."""

    results: Path
    head: Head
    procs: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def run(self, run_id: str, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        if run_id not in self.procs:
            proc = run_harness(
                "sweep",
                *args,
                "--results",
                str(self.results),
                "--run-id",
                run_id,
                "--address",
                self.head.address,
                "--accelerator",
                "cpu",
                "--no-progress",
                env=self.head.env,
            )
            assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
            # Exit 1 is also what an uncaught exception gives: a failed check must not be a crash.
            assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
            self.procs[run_id] = proc
        return self.procs[run_id]


@pytest.fixture(scope="session")
def shared_sweeps(ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> SharedSweeps:
    return SharedSweeps(tmp_path_factory.mktemp("shared") / "results", ray_head)
