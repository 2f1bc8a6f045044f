"""The claim on a run id (harness/store/claim.py), with real processes holding it: one process at
a time, an owner that died seen as gone and taken over, one on another machine named with the file
to remove, a run that lost its claim stopped before it writes, and readers that see a run whole.
No Ray: the sweeps and benches that use the claim are in tests/test_reliability.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from harness.errors import RunLost, UsageError
from harness.store.claim import Claim, Owner, OwnerState
from harness.judge.compare import compare_bitwise
from harness.store.schema import CheckRow
from harness.store.views import load_table
from harness.store.writer import RunWriter, to_table
from tests.helpers import REPO, assert_usage_error, cli, run_row

# A process that claims RUN_ID in RESULTS, writes its `runs` row ROW (JSON, or "" for none),
# says "held", and keeps the claim until its stdin closes.
HOLDER = """
import json, sys
from pathlib import Path
from harness.store.claim import Claim
from harness.store.schema import RunRow, RunSummary
from harness.store.writer import RunWriter
results, run_id, row = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
with Claim.take(results, run_id, False, "2026-12-01T00:00:00+00:00", "holder") as claim:
    if row:
        RunWriter(claim).begin(RunRow(**json.loads(row) | {"summary": RunSummary()}))
    print("held", flush=True)
    sys.stdin.read()
"""


def check(unit: str) -> CheckRow:
    equal = compare_bitwise(np.zeros(1), np.zeros(1))
    return CheckRow(unit, "cartpole", "float32", "normal-b1-s0", "logits", "cross_card", "card0", "card1", "ab", True, equal)


def python(script: str, *args: str) -> subprocess.Popen[str]:
    """`python -c SCRIPT ARGS`, its stdin, stdout and stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def holder(results: Path, run_id: str, begin: bool = False) -> subprocess.Popen[str]:
    """A real process holding `run_id`, once it says so."""
    process = python(HOLDER, str(results), run_id, json.dumps(asdict(run_row("running"))) if begin else "")
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line == "held\n", line + process.stderr.read() if process.stderr else ""
    return process


def kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    process = holder(tmp_path, "a", begin=True)
    yield process
    kill(process)


def take(results: Path, run_id: str = "a", resume: bool = False) -> Claim:
    return Claim.take(results, run_id, resume, "2026-12-01T00:00:01+00:00", "test")


def test_a_run_id_another_process_holds_is_refused_naming_it(tmp_path: Path, held: subprocess.Popen[str]) -> None:
    host = Owner.me("", "").host
    with pytest.raises(UsageError) as refused:
        take(tmp_path)
    assert str(refused.value) == (
        f"--run-id a: run a is being run in {tmp_path} by pid {held.pid} on host {host} "
        "(claimed 2026-12-01T00:00:00+00:00); pick another id"
    )
    with pytest.raises(UsageError, match=rf"--resume a: run a is being run .* pid {held.pid} .*; wait for it to end"):
        take(tmp_path, resume=True)
    # The command line says the same, exit 2, before Ray: for a sweep and for a bench alike.
    for command in ("sweep", "bench"):
        proc = cli(command, "--policy", "cartpole", "--accelerator", "cpu", "--results", str(tmp_path), "--run-id", "a")
        assert_usage_error(proc, f"run a is being run in {tmp_path} by pid {held.pid}")
    assert [p.name for p in (tmp_path / ".staging" / "a").glob("owner-*")] == ["owner-1.json"]


def test_an_owner_killed_after_it_began_is_seen_gone_and_resume_takes_the_run_over(
    tmp_path: Path, held: subprocess.Popen[str], capsys: pytest.CaptureFixture[str]
) -> None:
    dead = held.pid
    kill(held)
    with pytest.raises(UsageError, match=rf"left by pid {dead} on host .*, which is gone; finish it with --resume a"):
        take(tmp_path)
    with take(tmp_path, resume=True) as claim:
        note = capsys.readouterr().err
        assert note.startswith(f"harness: run a: pid {dead} on host ") and note.endswith(
            "is gone; this process takes the run over\n"
        )
        assert claim.path.name == "owner-2.json" and claim.held()
        assert [p.name for p in claim.staging.glob("owner-*")] == ["owner-2.json"], "the dead owner's claim is gone"
    # Released at the end: the staging stays for --resume, with no owner in it.
    assert (tmp_path / ".staging" / "a").is_dir() and not list((tmp_path / ".staging" / "a").glob("owner-*"))
    take(tmp_path, resume=True).check()


def test_an_owner_killed_before_it_began_leaves_the_id_to_the_next_run(tmp_path: Path) -> None:
    process = holder(tmp_path, "a")
    kill(process)
    with take(tmp_path) as claim:
        assert claim.held()
    assert not (tmp_path / ".staging" / "a").exists(), "a run that never began leaves nothing behind"
    with take(tmp_path / "new") as claim:
        assert claim.held()
    assert not (tmp_path / "new").exists(), "not even the folders its claim made"


def test_a_pid_that_names_another_process_now_is_gone(tmp_path: Path) -> None:
    """A recycled pid: this very process, but started at another time than the claim says."""
    me = Owner.me("2026-12-01T00:00:00+00:00", "")
    assert me.state() is OwnerState.ALIVE
    assert Owner(**{**me.__dict__, "started": me.started - 3600}).state() is OwnerState.GONE


def test_a_claim_from_another_machine_names_the_file_to_remove(tmp_path: Path, held: subprocess.Popen[str]) -> None:
    owner = tmp_path / ".staging" / "a" / "owner-1.json"
    record = json.loads(owner.read_text())
    owner.write_text(json.dumps(record | {"host": "node7", "machine": "node7/another-boot"}))
    with pytest.raises(UsageError) as refused:
        take(tmp_path, resume=True)
    assert f"by pid {held.pid} on host node7" in str(refused.value) and "which cannot be checked from here" in str(
        refused.value
    )
    assert str(refused.value).endswith(f"once that process is gone, release the claim (rm {owner}) and try again")
    owner.unlink()
    with take(tmp_path, resume=True) as claim:
        assert claim.held()


def test_of_many_processes_claiming_one_id_at_once_exactly_one_holds_it(tmp_path: Path) -> None:
    start = tmp_path / "go"
    script = (
        "import sys, time\nfrom pathlib import Path\nfrom harness.errors import UsageError\n"
        "from harness.store.claim import Claim\n"
        f"print('ready', flush=True)\nwhile not Path({str(start)!r}).exists(): time.sleep(0.001)\n"
        "try:\n    Claim.take(Path(sys.argv[1]), 'a', False, 'now')\nexcept UsageError as exc:\n"
        "    print(exc)\n    sys.exit(2)\nprint('held', flush=True)\nsys.stdin.read()\n"
    )
    racers = [python(script, str(tmp_path)) for _ in range(6)]
    try:
        assert [r.stdout.readline() for r in racers if r.stdout] == ["ready\n"] * len(racers)
        start.touch()  # all at once: each has imported the claim and polls for this file
        lines = [r.stdout.readline().strip() for r in racers if r.stdout]
        [winner] = [r for r, line in zip(racers, lines, strict=True) if line == "held"]
        losers = [(r, line) for r, line in zip(racers, lines, strict=True) if r is not winner]
        assert all(f"run a is being run in {tmp_path} by pid {winner.pid} on host" in line for _, line in losers), lines
        assert [r.wait(timeout=30) for r, _ in losers] == [2] * len(losers)
        assert [p.name for p in (tmp_path / ".staging" / "a").iterdir()] == ["owner-1.json"]
    finally:
        for racer in racers:
            kill(racer)


def _writer(results: Path, run_id: str) -> tuple[Claim, RunWriter]:
    claim = take(results, run_id)
    writer = RunWriter(claim)
    writer.begin(run_row("running"))
    writer.stage_unit("u1", [check("u1")], [])
    return claim, writer


def test_a_run_whose_staging_was_removed_stops_and_writes_nothing(tmp_path: Path) -> None:
    claim, writer = _writer(tmp_path, "a")
    os.rename(claim.staging, tmp_path / "elsewhere")
    with pytest.raises(
        RunLost, match=r"run a: its staging folder .* was removed while it ran; nothing of this process was published"
    ):
        writer.stage_unit("u2", [check("u2")], [])
    with pytest.raises(RunLost):
        writer.publish({"checks": to_table("checks", [check("u1")])}, run_row("passed"))
    assert not claim.staging.exists() and not (tmp_path / "checks").exists()
    assert load_table("runs", tmp_path).column("status").to_pylist() == ["running"]


def test_a_staging_removed_during_a_write_is_the_claim_lost_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import harness.store.writer as writer_module

    claim, writer = _writer(tmp_path, "a")
    write_table = writer_module.pq.write_table

    def removed_meanwhile(table: object, where: str) -> None:  # another process removes the staging mid-write
        os.rename(claim.staging, tmp_path / "elsewhere")
        write_table(table, where)

    monkeypatch.setattr(writer_module.pq, "write_table", removed_meanwhile)
    with pytest.raises(RunLost, match="was removed while it ran"):
        writer.stage_unit("u2", [check("u2")], [])
    assert not claim.staging.exists(), "the write made no staging again"


def test_a_run_taken_over_stops_and_never_writes_over_the_holder(tmp_path: Path) -> None:
    claim, writer = _writer(tmp_path, "a")
    claim.path.unlink()  # released by hand while it ran: another process resumes the run
    with take(tmp_path, resume=True) as other:
        with pytest.raises(RunLost, match=r"run a: this process no longer holds the run \(pid \d+ on host .* holds it now\)"):
            writer.publish({"checks": to_table("checks", [check("u1")] * 5)}, run_row("failed"))
        RunWriter(other).publish({"checks": to_table("checks", [check("u1")])}, run_row("passed"))
    runs, checks = load_table("runs", tmp_path), load_table("checks", tmp_path)
    assert runs.column("status").to_pylist() == ["passed"] and checks.num_rows == 1
    assert not (tmp_path / ".staging" / "a").exists()


def test_readers_see_a_run_whole_or_its_runs_row_alone(tmp_path: Path) -> None:
    """What a reader sees of a publish cut short (the tables in place, the runs row not yet saying
    so): the runs row alone, until the row says the run ended. Tables with no runs row (written
    by hand) are shown as they are."""
    _, writer = _writer(tmp_path, "a")
    os.replace(writer.staging / "u1.checks.parquet", tmp_path / "placed.parquet")
    (tmp_path / "checks" / "run_id=a").mkdir(parents=True)
    os.replace(tmp_path / "placed.parquet", tmp_path / "checks" / "run_id=a" / "part-0.parquet")
    assert load_table("checks", tmp_path).num_rows == 0
    assert load_table("runs", tmp_path).column("status").to_pylist() == ["running"]
    proc = cli("query", "SELECT count(*) AS n FROM checks", "--results", str(tmp_path), "--format", "csv")
    assert proc.stdout.splitlines() == ["n", "0"], proc.stdout + proc.stderr
    proc = cli("report", "a", "--results", str(tmp_path))
    assert (
        proc.stdout.startswith("run a: INCOMPLETE (status running; not finished: ")
        and "; 0 checks, 0 gating" in proc.stdout.split("\n")[0]
    ), proc.stdout
    writer.publish({"checks": to_table("checks", [check("u1"), check("u1")])}, run_row("passed"))
    assert load_table("checks", tmp_path).num_rows == 2
    proc = cli("report", "a", "--results", str(tmp_path))
    assert proc.stdout.startswith("run a: PASSED (status passed; 2 checks"), proc.stdout
    RunWriter(take(tmp_path, "b")).begin(run_row("incomplete"))
    (tmp_path / "checks" / "run_id=b").mkdir()
    os.link(tmp_path / "checks" / "run_id=a" / "part-0.parquet", tmp_path / "checks" / "run_id=b" / "part-0.parquet")
    (tmp_path / "checks" / "run_id=bare").mkdir()
    os.link(tmp_path / "checks" / "run_id=a" / "part-0.parquet", tmp_path / "checks" / "run_id=bare" / "part-0.parquet")
    assert sorted(set(load_table("checks", tmp_path).column("run_id").to_pylist())) == ["a", "bare"]


def test_resume_of_a_run_still_starting_says_wait_for_it_to_end(tmp_path: Path) -> None:
    """Claimed, and no `runs` row yet (its actors are not up): the same answer as once it began."""
    process = holder(tmp_path, "a")
    try:
        proc = cli("sweep", "--resume", "a", "--results", str(tmp_path))
        assert_usage_error(proc, f"--resume a: run a is being run in {tmp_path} by pid {process.pid}", "wait for it to end")
    finally:
        kill(process)
    # Its owner gone, the run never began: there is nothing to resume.
    assert_usage_error(cli("sweep", "--resume", "a", "--results", str(tmp_path)), f"--resume a: no such run in {tmp_path}")
