"""Faults survived and nothing lost: a card actor killed mid-sweep, a killed driver resumed, a
sweep interrupted (Ctrl-C) and one whose results disk filled up, each ending in one line with its
status recorded and resumable, two sweeps into one folder at once. Real processes on the
session's Ray cluster."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import Head
from tests.helpers import REPO, cli, read_table

pytestmark = pytest.mark.slow

# Enough units that the driver is still busy when the fault comes; small enough to stay quick.
ARGS = (
    "--policy",
    "cartpole",
    "--dtypes",
    "float32,float16",
    "--episodes",
    "2",
    "--batch-sizes",
    "1,8,64",
    "--accelerator",
    "cpu",
    "--cards",
    "2",
    "--no-progress",
)
VERDICT = ("unit_id", "output", "kind", "device_a", "device_b", "passed", "bitwise_equal", "max_abs", "n_mismatch")


def _verdicts(results: Path) -> set[tuple]:
    return {tuple(r[c] for c in VERDICT) for r in read_table(results, "checks").to_pylist()}


def _visible_parquet(results: Path) -> list[Path]:
    return [p for p in results.rglob("*.parquet") if ".staging" not in p.parts]


@pytest.fixture(scope="module")
def clean_verdicts(ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> set[tuple]:
    """The verdicts of the same sweep, uninterrupted."""
    clean = tmp_path_factory.mktemp("clean")
    proc = cli("sweep", *ARGS, "--results", str(clean), "--address", ray_head.address)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _verdicts(clean)


def _start_sweep(head: Head, results: Path, run_id: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "sweep",
            *ARGS,
            "--results",
            str(results),
            "--run-id",
            run_id,
            "--address",
            head.address,
        ],
        cwd=REPO,
        env=head.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_begun(driver: subprocess.Popen, results: Path, run_id: str) -> None:
    """Until the run has written its first `runs` row: its actors are up and its units about to run."""
    row = results / "runs" / f"run_id={run_id}" / "part-0.parquet"
    deadline = time.monotonic() + 300
    while not row.exists():
        assert driver.poll() is None, "the sweep ended before it began"
        assert time.monotonic() < deadline, "the sweep did not begin"
        time.sleep(0.01)


def _fill(path: Path) -> None:
    """Write `path` until its disk is full."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(bytes(1 << 20))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def _wait_for_units(driver: subprocess.Popen, staging: Path, n: int) -> None:
    """Until `n` units are staged. The sweep writes nothing a watcher could block on, so this polls."""
    deadline = time.monotonic() + 180
    while len(list(staging.glob("*.done"))) < n:
        assert driver.poll() is None, "the sweep ended before the fault could be injected"
        assert time.monotonic() < deadline, "no unit finished in time"
        time.sleep(0.05)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def test_card_actor_killed_by_pid_is_restarted_and_the_verdicts_hold(
    ray_head: Head, tmp_path: Path, clean_verdicts: set[tuple]
) -> None:
    from ray.util.state import list_actors

    driver = _start_sweep(ray_head, tmp_path, "card-killed")
    try:
        _wait_for_units(driver, tmp_path / ".staging" / "card-killed", 1)
        cards = list_actors(
            address=ray_head.dashboard, filters=[("class_name", "=", "PolicyActor"), ("state", "=", "ALIVE")], detail=True
        )
        assert cards, "a card actor to kill"
        os.kill(int(cards[-1].pid), signal.SIGKILL)
        out, err = driver.communicate(timeout=300)
    finally:
        _kill_group(driver.pid)
    assert driver.returncode == 0, out[-2000:] + err[-3000:]
    assert _verdicts(tmp_path) == clean_verdicts


def test_killed_driver_leaves_readable_results_and_resume_completes_the_run(
    ray_head: Head, tmp_path: Path, clean_verdicts: set[tuple]
) -> None:
    killed = tmp_path / "killed"
    driver = _start_sweep(ray_head, killed, "victim")
    staging = killed / ".staging" / "victim"
    try:
        _wait_for_units(driver, staging, 3)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        _kill_group(driver.pid)

    # Every visible file is whole; the run says it did not finish; no checks are published yet.
    for path in _visible_parquet(killed):
        pq.read_table(path)
    [run] = read_table(killed, "runs").to_pylist()
    assert run["status"] == "running" and run["finished_at"] is None
    assert not (killed / "checks").exists()
    done_before = {p.name.removesuffix(".done") for p in staging.glob("*.done")}

    resumed = cli("sweep", "--resume", "victim", "--results", str(killed), "--no-progress", "--address", ray_head.address)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    [run] = read_table(killed, "runs").to_pylist()
    assert run["status"] == "passed"
    summary = json.loads(run["summary"])
    assert summary["resumed_units"] >= len(done_before) and summary["resumed_units"] < summary["units"]

    assert _verdicts(killed) == clean_verdicts, "resumed verdicts equal an uninterrupted run's"


def test_resume_of_a_finished_or_unknown_run_is_exit_2(tmp_path: Path) -> None:
    proc = cli("sweep", "--resume", "nope", "--results", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip() == f"harness: error: --resume nope: no such run in {tmp_path}"


def test_two_concurrent_sweeps_into_one_folder(ray_head: Head, tmp_path: Path) -> None:
    small = [
        "--policy",
        "cartpole",
        "--dtypes",
        "float32",
        "--episodes",
        "1",
        "--batch-sizes",
        "1",
        "--accelerator",
        "cpu",
        "--cards",
        "2",
        "--no-progress",
        "--results",
        str(tmp_path),
        "--address",
        ray_head.address,
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "harness", "sweep", *small],
            cwd=REPO,
            env=ray_head.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    runs = read_table(tmp_path, "runs").to_pylist()
    assert len({r["run_id"] for r in runs}) == 2 and {r["status"] for r in runs} == {"passed"}
    checks = read_table(tmp_path, "checks")
    per_run = {rid: checks.column("run_id").to_pylist().count(rid) for rid in {r["run_id"] for r in runs}}
    assert len(set(per_run.values())) == 1 and min(per_run.values()) > 0, per_run


def _ended_in_one_line(driver: subprocess.Popen) -> str:
    out, err = driver.communicate(timeout=300)
    assert "Traceback" not in out + err, err[-3000:]
    *_, last = err.strip().splitlines()
    return last


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_ends_the_run_interrupted_with_its_resume_command(
    ray_head: Head, tmp_path: Path, signum: signal.Signals
) -> None:
    """Ctrl-C, or SIGTERM as `kill` and `ray job stop` send it: one line, exit 130, the run
    recorded as interrupted, never left running."""
    driver = _start_sweep(ray_head, tmp_path, "ctrl-c")
    try:
        _wait_for_units(driver, tmp_path / ".staging" / "ctrl-c", 1)
        driver.send_signal(signum)
        last = _ended_in_one_line(driver)
    finally:
        _kill_group(driver.pid)
    assert driver.returncode == 130
    resume = f"harness sweep --resume ctrl-c --results {tmp_path} --address {ray_head.address}"
    assert last == f"harness: interrupted: finish it with: {resume}"
    [run] = read_table(tmp_path, "runs").to_pylist()
    assert run["status"] == "interrupted" and run["finished_at"] is not None
    assert json.loads(run["summary"])["done_units"] >= 1


def test_a_full_results_disk_ends_the_run_incomplete_and_resume_completes_it(
    ray_head: Head, tmp_path: Path, clean_verdicts: set[tuple]
) -> None:
    """The results on a small tmpfs, filled up by another file once the run has begun: the next
    write fails with ENOSPC. The run says so in one line (exit 3) and still records its status in
    the room its reserve kept; with space freed, its resume command finishes it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip() or mounted.returncode})")
    results, filler = disk / "results", disk / "filler"
    try:
        driver = _start_sweep(ray_head, results, "full")
        try:
            _wait_for_begun(driver, results, "full")
            _fill(filler)
            last = _ended_in_one_line(driver)
        finally:
            _kill_group(driver.pid)
        assert driver.returncode == 3, last
        cause, _, command = last.partition("; finish it with: ")
        assert cause.startswith(f"harness: incomplete: cannot write the results: {results}/"), last
        assert cause.endswith(f"{os.strerror(errno.ENOSPC)} (errno {errno.ENOSPC})"), last
        [run] = read_table(results, "runs").to_pylist()
        assert run["status"] == "incomplete" and "No space left on device" in json.loads(run["summary"])["stopped"]

        filler.unlink()
        assert command == f"harness sweep --resume full --results {results} --address {ray_head.address}"
        resumed = cli(*shlex.split(command)[1:], "--no-progress")
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        [run] = read_table(results, "runs").to_pylist()
        assert run["status"] == "passed"
        assert _verdicts(results) == clean_verdicts
        assert not (results / ".staging" / "full").exists()
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], capture_output=True, timeout=30)
