"""A sweep on a busy machine ends with its verdicts (issue 35): published agents of chaotic
environments play their episodes on two simulated cards while busy loops keep every core
occupied, more loops than cores. The CPU reference does more per unit than a card (its own
episodes and their replay under the honest-card model), so on such a machine it falls behind the
cards; it must never be taken for hung, restarted, or lost for that. A hung card still is: the
crash and hang faults of tests/test_sweep.py and tests/test_job_submit.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Head
from tests.helpers import read_table, sweep_on

pytestmark = pytest.mark.slow

# Two chaotic published agents: a discrete lander and a continuous walker with its VecNormalize.
AGENTS = ("rlzoo/ppo/LunarLander-v2_1/LunarLander-v2.zip", "rlzoo/a2c/BipedalWalker-v3_1/BipedalWalker-v3.zip")
# One busy loop per core and two more: every core is wanted by more processes than it can run.
EXTRA_LOOPS = 2
# The reference held stopped this long, then let run this long, again and again: ten times slower
# than the cards, and alive throughout.
STOPPED_S, RUNNING_S = 0.45, 0.05


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[list[subprocess.Popen]]:
    """`n` processes that spin on a core each until the block ends, killed whatever happens."""
    loops: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            loops.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True))
        yield loops
    finally:
        for loop in loops:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(loop.pid, signal.SIGKILL)
            loop.wait(timeout=30)


def test_a_sweep_of_chaotic_agents_on_a_machine_whose_every_core_is_busy_ends_with_its_verdicts(
    cases: Path, ray_head: Head, tmp_path: Path
) -> None:
    policies = [arg for agent in AGENTS for arg in ("--policy", str(cases / agent))]
    with busy_loops(len(os.sched_getaffinity(0)) + EXTRA_LOOPS) as loops:
        proc = sweep_on(
            ray_head.address,
            tmp_path,
            *policies,
            "--dtypes",
            "float32",
            "--batch-sizes",
            "1",
            "--episodes",
            "2",
            "--cards",
            "2",
            "--run-id",
            "busy",
        )
        assert all(loop.poll() is None for loop in loops), "the loops kept the cores busy to the end"
    _ended_with_its_verdicts(proc, tmp_path)
    episodes = read_table(tmp_path, "episodes").to_pylist()
    assert {Path(e["policy"]).name for e in episodes} == {Path(agent).name for agent in AGENTS}


@contextlib.contextmanager
def throttled_reference(head: Head) -> Iterator[threading.Event]:
    """Once the sweep's CPU reference is up, hold it stopped (SIGSTOP) and let it run (SIGCONT) in
    turn, so it works at a tenth of its pace, alive: as a host's scheduler can starve one process
    of many. Yields the event set once it was throttled; it is let run whatever happens."""
    from ray.util.state import list_actors

    done, throttled = threading.Event(), threading.Event()

    def throttle() -> None:
        while not done.is_set():
            alive = list_actors(
                address=head.dashboard, filters=[("class_name", "=", "ReferenceActor"), ("state", "=", "ALIVE")], detail=True
            )
            if alive:
                break
            time.sleep(0.2)
        else:
            return
        pid = int(alive[0].pid)
        try:
            while not done.is_set():
                os.kill(pid, signal.SIGSTOP)
                throttled.set()
                done.wait(STOPPED_S)
                os.kill(pid, signal.SIGCONT)
                done.wait(RUNNING_S)
        except ProcessLookupError:  # it ended: the sweep did, or it was killed and restarted
            return
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    worker = threading.Thread(target=throttle, daemon=True)
    worker.start()
    try:
        yield throttled
    finally:
        done.set()
        worker.join(timeout=30)


@pytest.mark.ray_recovery
def test_a_reference_ten_times_slower_than_the_cards_is_waited_for_not_taken_for_hung(
    cases: Path, ray_head: Head, tmp_path: Path
) -> None:
    """The rule this replaced gave an actor ten times the fastest other actor's time over a unit,
    and killed this reference on its first episodes (`the CPU reference hung on ... float32
    episodes-deterministic-2x-s0-lockstep (no result within 8.51 s): restarted`, at 82ad768).
    Its progress says it is not hung."""
    with throttled_reference(ray_head) as throttled:
        proc = sweep_on(
            ray_head.address,
            tmp_path,
            "--policy",
            str(cases / AGENTS[0]),
            "--dtypes",
            "float32",
            "--batch-sizes",
            "1",
            "--episodes",
            "2",
            "--cards",
            "2",
            "--hang-timeout",
            "3",
            "--run-id",
            "slow-reference",
        )
        assert throttled.is_set(), "the reference was slowed down"
    _ended_with_its_verdicts(proc, tmp_path)


def _ended_with_its_verdicts(proc: subprocess.CompletedProcess[str], results: Path) -> None:
    """Exit 0 or 1, never 3 (incomplete), and no actor taken for hung, restarted or lost."""
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "INCOMPLETE" not in proc.stdout
    [run] = read_table(results, "runs").to_pylist()
    summary = json.loads(run["summary"])
    assert run["status"] in ("passed", "failed") and not summary.get("lost"), summary
    assert not [event for event in summary["events"] if " hung on " in event], summary["events"]
