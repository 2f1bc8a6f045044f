"""Running the command line from tests, as a user runs it or in-process, and reading the Parquet
it wrote."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from harness.store.schema import RunRow

REPO = Path(__file__).resolve().parents[1]


def harness(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`harness ARGS` as a user runs it, in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`harness ARGS` in this process: the same parser, commands and exit codes, without the
    second or two a fresh interpreter costs. argparse's own exits are caught as exit codes."""
    from harness.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["harness", *args], code, out.getvalue(), err.getvalue())


def sweep_on(address: str, results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`harness sweep ARGS` in this process, on simulated cards of the cluster at `address`, into
    `results`."""
    return cli("sweep", *args, "--accelerator", "cpu", "--no-progress", "--address", address, "--results", str(results))


def assert_usage_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2 with one line on stderr, no traceback, naming what was wrong."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness: error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def run_row(status: str, config: dict[str, object] | None = None) -> RunRow:
    """A `runs` row as a run of `config` writes it, with `status`."""
    return RunRow(
        started_at="2026-12-01T00:00:00+00:00",
        finished_at=None,
        status=status,
        accelerator="cpu",
        n_cards=2,
        devices="[]",
        harness_version="0.1.0",
        torch_version="",
        ray_version="",
        config_json=json.dumps(config or {}),
        faults="",
        git_revision="",
        hostname="",
        policies="[]",
        command="",
    )


def read_table(results: Path, table: str) -> pa.Table:
    return ds.dataset(results / table, format="parquet", partitioning="hive").to_table()


def duckdb_rows(results: Path, sql_on_table: str, table: str) -> list[tuple]:
    path = (results / table / "*" / "*.parquet").as_posix()
    con = duckdb.connect()
    con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{path}', hive_partitioning=true)")
    return con.execute(sql_on_table).fetchall()


@dataclass
class RayNode:
    """A `ray start --block` in a process session of its own: every Ray process it starts (GCS,
    raylet, agents, workers) shares that session, so stopping it ends them all and nothing else."""

    process: subprocess.Popen[bytes]

    @property
    def session(self) -> int:
        return self.process.pid

    def pids(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.getsid(int(entry.name)) == self.session:
                        found.append(int(entry.name))
        return found

    def raylet_pid(self) -> int:
        """The node's raylet: killing it is how a node drops out of a cluster."""
        for pid in self.pids():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/raylet"):
                    return pid
        raise LookupError("no raylet in this node's session")

    def stop(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=30)


def start_ray_node(args: list[str], env: dict[str, str], timeout_s: float = 120) -> RayNode:
    """`ray start ARGS --block`, returned once the node is up (it prints that it will block). Ray
    gives its raylet a fixed 30 s to register with the GCS, which a busy machine can miss ("timed
    out during startup"): that start is tried once more, as an operator would."""
    seen = _start_ray_node(args, env, timeout_s)
    if isinstance(seen, RayNode):
        return seen
    if any("timed out during startup" in line for line in seen):
        again = _start_ray_node(args, env, timeout_s)
        if isinstance(again, RayNode):
            return again
        seen = again
    raise RuntimeError("ray start did not come up:\n" + "".join(seen[-30:]))


def _start_ray_node(args: list[str], env: dict[str, str], timeout_s: float) -> RayNode | list[str]:
    """The node once up, else what it printed before it ended or `timeout_s` passed."""
    ray = str(Path(sys.executable).parent / "ray")
    process = subprocess.Popen(
        [ray, "start", *args, "--block", "--disable-usage-stats"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    node = RayNode(process)
    deadline, seen = time.monotonic() + timeout_s, []
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line.decode(errors="replace"))
        if b"block forever" in line:
            # Keep draining its output, or a full pipe would stall the node's monitor loop.
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return node
        if time.monotonic() > deadline:
            break
    node.stop()
    return seen


def staged_checks(results: Path, run_id: str) -> list[dict[str, object]]:
    """The checks of the units a run that has not finished has done so far (its staging,
    harness/store/writer.py), read back with pyarrow."""
    staging = results / ".staging" / run_id
    done = sorted(p.name.removesuffix(".done") for p in staging.glob("*.done"))
    return [row for unit in done for row in pq.read_table(staging / f"{unit}.checks.parquet").to_pylist()]
