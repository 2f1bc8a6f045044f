"""Faults survived and nothing lost: a card actor killed mid-sweep, a killed driver resumed, a
sweep interrupted (Ctrl-C) and one whose results disk filled up, each ending in one line with its
status recorded and resumable; sweeps into one folder at once (one run id held by one process at a
time, other ids kept beside it; readers see a run whole or not at all). Real processes on the session's Ray cluster."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.store.claim import Claim
from tests.conftest import Head
from tests.helpers import REPO, assert_usage_error, cli, read_table

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
UNLABELLED = tuple(c for c in VERDICT if c not in ("device_a", "device_b"))


# The smallest sweep with every table: for the tests that run several sweeps at once.
TINY = (
    "--policy",
    "cartpole",
    "--dtypes",
    "float32",
    "--episodes",
    "2",
    "--batch-sizes",
    "8",
    "--accelerator",
    "cpu",
    "--cards",
    "2",
    "--no-progress",
)
HOST = socket.gethostname()


def _verdicts(results: Path) -> set[tuple]:
    return {tuple(r[c] for c in VERDICT) for r in read_table(results, "checks").to_pylist()}


def _tally(results: Path, run_id: str | None = None) -> Counter[tuple]:
    """The verdicts apart from the cards' labels: sweeps at once on one cluster get other cards."""
    rows = read_table(results, "checks").to_pylist()
    return Counter(tuple(r[c] for c in UNLABELLED) for r in rows if run_id is None or r["run_id"] == run_id)


def _visible_parquet(results: Path) -> list[Path]:
    return [p for p in results.rglob("*.parquet") if ".staging" not in p.parts]


@pytest.fixture(scope="module")
def clean_verdicts(ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> set[tuple]:
    """The verdicts of the same sweep, uninterrupted."""
    clean = tmp_path_factory.mktemp("clean")
    proc = cli("sweep", *ARGS, "--results", str(clean), "--address", ray_head.address)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _verdicts(clean)


@dataclass(frozen=True)
class Alone:
    """What a tiny sweep writes when it runs alone."""

    tally: Counter[tuple]
    checks: int
    episodes: int


@pytest.fixture(scope="module")
def tiny_alone(ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> Alone:
    alone = tmp_path_factory.mktemp("alone")
    proc = cli("sweep", *TINY, "--results", str(alone), "--address", ray_head.address)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Alone(_tally(alone), read_table(alone, "checks").num_rows, read_table(alone, "episodes").num_rows)


def _start_sweep(head: Head, results: Path, run_id: str) -> subprocess.Popen:
    return _harness(head, "sweep", *ARGS, "--results", str(results), "--run-id", run_id)


def _harness(head: Head, *args: str) -> subprocess.Popen:
    """`harness ARGS` on the session's cluster, started and left running."""
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *args, "--address", head.address],
        cwd=REPO,
        env=head.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_begun(driver: subprocess.Popen, results: Path, run_id: str) -> None:
    """Until the run has written its first `runs` row: its actors are up and its units about to run.
    A sweep that never begins is bounded by the test's timeout (pytest-timeout), not a clock here."""
    row = results / "runs" / f"run_id={run_id}" / "part-0.parquet"
    while not row.exists():
        assert driver.poll() is None, "the sweep ended before it began"
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
    """Until `n` units are staged. The sweep writes nothing a watcher could block on, so this polls;
    bounded by the test's timeout (pytest-timeout), not a clock here."""
    while len(list(staging.glob("*.done"))) < n:
        assert driver.poll() is None, "the sweep ended before the fault could be injected"
        time.sleep(0.05)


def _wait_for_claim(owner: Path, claimers: list[subprocess.Popen]) -> None:
    """Until a process holds a run id: its owner file `owner` is written (before Ray starts).
    Bounded by the test's timeout (pytest-timeout), not a clock here."""
    while not owner.exists():
        assert any(c.poll() is None for c in claimers), f"every claimer of {owner.parent.name} ended without a claim"
        time.sleep(0.05)


def _refusal(proc: subprocess.Popen) -> str:
    """The one line a refused run prints: exit 2, before Ray started (nothing on stdout)."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == "" and len(err.splitlines()) == 1, out[-2000:] + err[-2000:]
    return err


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

    # Its claim outlives it: a new run of that name is refused, saying its owner is gone.
    fresh = cli("sweep", *ARGS, "--results", str(killed), "--run-id", "victim", "--address", ray_head.address)
    assert_usage_error(fresh, f"left by pid {driver.pid} on host {HOST}", "which is gone; finish it with --resume victim")
    # One resumer takes the run over; a second, started while the first runs, is refused.
    resumers = [_harness(ray_head, "sweep", "--resume", "victim", "--results", str(killed), "--no-progress")]
    try:
        _wait_for_claim(staging / "owner-2.json", resumers)
        resumers.append(_harness(ray_head, "sweep", "--resume", "victim", "--results", str(killed), "--no-progress"))
        refused = _refusal(resumers[1])
        out, err = resumers[0].communicate(timeout=300)
    finally:
        for resumer in resumers:
            _kill_group(resumer.pid)
    assert refused.startswith(f"harness: error: --resume victim: run victim is being run in {killed} by pid {resumers[0].pid}")
    assert refused.endswith("; wait for it to end\n"), refused
    assert resumers[0].returncode == 0, out[-2000:] + err[-3000:]
    assert (
        f"harness: run victim: pid {driver.pid} on host {HOST} " in err and "is gone; this process takes the run over" in err
    )
    [run] = read_table(killed, "runs").to_pylist()
    assert run["status"] == "passed"
    summary = json.loads(run["summary"])
    assert summary["resumed_units"] >= len(done_before) and summary["resumed_units"] < summary["units"]

    assert _verdicts(killed) == clean_verdicts, "resumed verdicts equal an uninterrupted run's"


def test_resume_of_a_finished_or_unknown_run_is_exit_2(tmp_path: Path) -> None:
    proc = cli("sweep", "--resume", "nope", "--results", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip() == f"harness: error: --resume nope: no such run in {tmp_path}"


# A reader in a loop: `harness query`'s own code, run again and again in one process until the
# stop file exists; each answer, one JSON line: every run with its status and its rows in view
# (and any rows of a run with no runs row: none may show).
READER = """
import contextlib, io, sys, time
from pathlib import Path
from harness.cli import main
results, stop = sys.argv[1], Path(sys.argv[2])
SQL = '''SELECT r.run_id, r.status,
    (SELECT count(*) FROM checks c WHERE c.run_id = r.run_id) AS checks,
    (SELECT count(*) FROM episodes e WHERE e.run_id = r.run_id) AS episodes FROM runs r
UNION ALL SELECT run_id, NULL, count(*), NULL FROM checks WHERE run_id NOT IN (SELECT run_id FROM runs) GROUP BY run_id'''
while not stop.exists():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["query", SQL, "--results", results, "--format", "json"])
    print(out.getvalue().strip() if code == 0 else "[]", flush=True)
    time.sleep(0.05)  # a core left to the sweeps on a small machine
"""


def test_three_sweeps_of_one_run_id_at_once_run_it_once_and_a_reader_sees_each_run_whole_or_not_at_all(
    ray_head: Head, tmp_path: Path, tiny_alone: Alone
) -> None:
    """Three sweeps of run id a and one of b started together, and once a runs, the same sweep
    again (issue 23's careless repeat), while a reader queries in a loop: one a runs, every other
    a is refused naming it; a and b are both whole, each what the sweep writes alone; and no
    answer the reader got showed a run in part."""
    results, stop = tmp_path / "results", tmp_path / "stop"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(results), str(stop)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    sweeps = [_harness(ray_head, "sweep", *TINY, "--results", str(results), "--run-id", i) for i in ("a", "a", "a", "b")]
    try:
        _wait_for_claim(results / ".staging" / "a" / "owner-1.json", sweeps)
        sweeps.append(_harness(ray_head, "sweep", *TINY, "--results", str(results), "--run-id", "a"))
        ended = [sweep.communicate(timeout=300) for sweep in sweeps]
    finally:
        stop.touch()
        for sweep in sweeps:
            _kill_group(sweep.pid)
    seen = [json.loads(line) for line in reader.communicate(timeout=120)[0].splitlines()]

    codes = [sweep.returncode for sweep in sweeps]
    assert sorted(codes[:3]) == [0, 2, 2] and codes[3:] == [0, 2], [err[-2000:] for _, err in ended]
    winner = sweeps[codes.index(0)]
    assert f"run a: PASSED ({tiny_alone.checks} checks" in ended[codes.index(0)][0]
    for sweep, (out, err) in zip(sweeps, ended, strict=True):
        if sweep.returncode == 2:  # refused before Ray started: one line, nothing on stdout
            assert out == "" and re.fullmatch(
                rf"harness: error: --run-id a: run a is being run in {re.escape(str(results))} by pid {winner.pid} on host "
                rf"{re.escape(HOST)} \(claimed [0-9T:.+-]+\); pick another id\n",
                err,
            ), err
    assert {r["run_id"]: r["status"] for r in read_table(results, "runs").to_pylist()} == {"a": "passed", "b": "passed"}
    assert _tally(results, "a") == tiny_alone.tally == _tally(results, "b")
    assert read_table(results, "episodes").num_rows == 2 * tiny_alone.episodes
    assert not (results / ".staging" / "a").exists()

    whole = {"checks": tiny_alone.checks, "episodes": tiny_alone.episodes}
    nothing = {"checks": 0, "episodes": 0}
    for answer in seen:
        for run in answer:
            shown = {"checks": run["checks"], "episodes": run["episodes"]}
            assert shown == (whole if run["status"] == "passed" else nothing), (run, answer)
    statuses = {run["status"] for answer in seen for run in answer}
    assert {"running", "passed"} <= statuses, f"the reader saw runs at work and ended: {len(seen)} answers, {statuses}"


def test_a_run_taken_over_while_it_runs_stops_with_exit_3_and_never_says_failed(ray_head: Head, tmp_path: Path) -> None:
    """Its claim released by hand while it runs (what the refusal from another host says to do
    once the owner is gone, done too early) and taken by another process (this one, as a
    `--resume` would): the sweep stops at its next write, says why, and writes nothing more: no
    verdict, no runs row over the holder's."""
    staging = tmp_path / ".staging" / "held"
    driver = _harness(ray_head, "sweep", *TINY, "--results", str(tmp_path), "--run-id", "held")
    try:
        _wait_for_units(driver, staging, 1)
        (staging / "owner-1.json").unlink()
        with Claim.take(tmp_path, "held", True, "2026-12-01T00:00:00+00:00") as holder:
            out, err = driver.communicate(timeout=300)
            holder.check()  # still this process's
            assert not (tmp_path / "checks").exists() and not (tmp_path / "episodes").exists()
            [run] = read_table(tmp_path, "runs").to_pylist()
            assert run["status"] == "running" and run["finished_at"] is None
    finally:
        _kill_group(driver.pid)
    assert driver.returncode == 3, out[-2000:] + err[-3000:]
    # Its next check found the claim gone, or already the test process's: either way it stops.
    taken = rf"pid {os.getpid()} on host {re.escape(HOST)} \(claimed [^)]*\) holds it now"
    removed = rf"its claim {re.escape(str(staging))}/owner-1\.json was removed"
    stopped = "harness: stopped: run held: this process no longer holds the run"
    assert re.search(rf"{stopped} \(({taken}|{removed})\); nothing of this process was published", err), err[-3000:]
    assert "FAILED" not in out and "PASSED" not in out


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
