"""What the driver decides when cards fail, without a cluster: how long an actor may go without
progress, how long a restart may take, what a hang fault does, what an incomplete run prints,
and the one-line reasons a cluster refuses to be joined."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.inference.fault_specs import Fault, parse_faults
from harness.inference.faults import strike
from harness.judge.outcome import Verdict
from harness.report.summary import print_summary
from harness.sweeps.gather import Watch, shares_of
from harness.sweeps.pace import HANG_MULTIPLE, RESTART_MARGIN, Pace, restart_bound_s
from harness.cluster.place import Placed, Placement, join_refusal, token_refusal
from harness.store.schema import SCHEMAS
from tests.builders import described


def _watch(cards: int, hang_timeout_s: float, started_s: float = 0.0) -> Watch:
    placed = [Placed(object(), described(f"sim-cpu{i}", f"node{i}")) for i in range(cards)]
    placement = Placement(group=None, cards=placed, references=[Placed(object(), described("cpu", "n"))], resource="NPU")
    return Watch(placement, hang_timeout_s, started_s)


def test_an_actor_that_keeps_showing_progress_is_never_hung_however_slow_its_unit() -> None:
    pace = Pace(moved=0.0)
    for now in range(10, 10_000, 10):  # a step every 10 s: a unit that takes hours on a busy machine
        assert not pace.hung(float(now), hang_timeout_s=60.0)
        pace.progressed(float(now))
    assert pace.bound_s(60.0) == 100.0, "the longest silence it broke was 10 s: 10 x that"


def test_an_actor_is_hung_once_silent_past_the_floor_or_ten_times_its_own_longest_silence() -> None:
    pace = Pace(moved=100.0)
    assert pace.bound_s(3.0) == 3.0, "nothing learnt yet: --hang-timeout"
    assert not pace.hung(103.0, 3.0) and pace.hung(103.5, 3.0), "silent past the floor: hung"
    pace.progressed(100.4)  # its first result, 0.4 s after it began
    pace.progressed(101.0)
    assert pace.longest_quiet_s == pytest.approx(0.6) and pace.bound_s(3.0) == pytest.approx(6.0)
    pace.progressed(106.0)  # a silence of 5 s it broke: its own pace says it can be that slow
    assert pace.bound_s(3.0) == pytest.approx(HANG_MULTIPLE * 5.0)
    assert not pace.hung(150.0, 3.0) and pace.hung(156.5, 3.0)
    assert pace.quiet_s(156.5) == pytest.approx(50.5)


def test_no_other_actors_pace_and_no_idle_time_counts() -> None:
    card, reference = Pace(moved=0.0), Pace(moved=0.0)
    card.progressed(0.1)  # a card's unit: 0.1 s
    for now in (5.0, 10.0, 15.0):  # the reference's: its steps every 5 s, 150 times the card's
        reference.progressed(now)
    assert not reference.hung(40.0, hang_timeout_s=2.0), "ten times its own 5 s silences"
    reference.start(1000.0)  # work again after it sat idle: the idle time is no silence
    assert reference.longest_quiet_s == 5.0 and not reference.hung(1040.0, 2.0)


def test_a_restart_is_given_a_placement_twice_the_longest_start_or_the_hang_timeout_whichever_is_longest() -> None:
    assert restart_bound_s(30.0, started_s=3.0, hang_timeout_s=5.0) == 30.0
    # Actors that took 44 s to start (a CUDA torch on a busy machine) are not lost at 30 s when one restarts.
    assert restart_bound_s(30.0, started_s=44.0, hang_timeout_s=5.0) == pytest.approx(RESTART_MARGIN * 44.0)
    assert restart_bound_s(30.0, started_s=3.0, hang_timeout_s=900.0) == 900.0, "a restarting actor shows nothing"
    watch = _watch(cards=1, hang_timeout_s=60.0, started_s=3.0)
    assert watch.restart_s() == 60.0


def test_the_reference_comes_after_the_cards_and_each_card_is_asked_its_run_and_its_whole_batch() -> None:
    from harness.sweeps.dispatch import Role, Submitted

    job = Submitted(
        unit=None,
        cards={0: "a0", 1: "a1"},
        references={Role.GOLDEN: "g", Role.SAME: "s"},
        inside=["w0", "w1"],
        members={Role.GOLDEN: 0, Role.SAME: 0},
    )
    assert shares_of(job, reference=2) == {0: ["a0", "w0"], 1: ["a1", "w1"], 2: ["g", "s"]}
    assert _watch(2, 1.0).reference == 2
    # With a pool, each member's lane (after the cards') is asked the roles it computes.
    job.members = {Role.GOLDEN: 1, Role.SAME: 0}
    assert shares_of(job, reference=2) == {0: ["a0", "w0"], 1: ["a1", "w1"], 2: ["s"], 3: ["g"]}


def test_hang_faults_are_named_and_hang_once_strikes_once_across_restarts(tmp_path: Path) -> None:
    assert parse_faults(["card1:hang", "card0:hang-once"]) == [Fault(1, "hang"), Fault(0, "hang-once")]
    marker = tmp_path / "faults" / "card0"

    def hangs(faults: list[Fault]) -> bool:
        worker = threading.Thread(target=strike, args=(faults, marker), daemon=True)
        worker.start()
        worker.join(timeout=0.5)
        return worker.is_alive()

    assert hangs([Fault(0, "hang-once")]), "the first unit hangs"
    assert (tmp_path / "faults" / "card0.hang-once").exists()
    assert not hangs([Fault(0, "hang-once")]), "the restarted process finds the marker and runs"
    assert hangs([Fault(0, "hang")]), "hang strikes every time"
    assert not hangs([Fault(0, "perturb-weight")]), "a model fault never stops the process"


def test_an_incomplete_run_says_what_it_kept_and_what_it_lost() -> None:
    out = io.StringIO()
    lost = "LOST card1 (sim-cpu1): hung again after its restart (no progress for 3.1 s, allowed 3 s); it was running cartpole"
    print_summary(SCHEMAS["checks"].empty_table(), "r1", Verdict.INCOMPLETE, out, notes=[lost], units_done=(4, 9))
    *_, note, verdict = out.getvalue().splitlines()
    assert note == f"  {lost}"
    assert verdict == "run r1: INCOMPLETE (4 of 9 units done and kept; 0 checks, 0 gating, 0 failed)"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "requires a token and token authentication is off in this client (RAY_AUTH_MODE=unset): export RAY_AUTH_MODE"),
        ({"RAY_AUTH_MODE": "disabled"}, "token authentication is off in this client (RAY_AUTH_MODE=disabled)"),
        ({"RAY_AUTH_MODE": "token"}, "requires a token and this client has none: give it the cluster's token"),
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "x" * 32}, "refused this client's token (from RAY_AUTH_TOKEN)"),
    ],
)
def test_a_token_refusal_names_the_cause_and_the_fix(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    message = token_refusal("10.0.0.1:6379")
    assert message.startswith("the Ray cluster at 10.0.0.1:6379 ") and expected in message, message
    assert "`ray get-auth-token` on its head prints it" in message


def test_a_version_mismatch_names_both_versions_and_the_fix() -> None:
    exc: Any = RuntimeError(
        "Version mismatch: The cluster was started with:\n    Ray: 2.59.0\n    Python: 3.11.9\n"
        "This process on node 10.0.0.2 was started with:\n    Ray: 2.60.0\n    Python: 3.11.14\n"
    )
    assert join_refusal("10.0.0.1:6379", exc) == (
        "the Ray cluster at 10.0.0.1:6379 runs Ray 2.59.0 on Python 3.11.9, this client Ray 2.60.0 on Python 3.11.14: "
        "join it from an environment with the cluster's versions (pip install 'ray[default]==2.59.0' under Python "
        "3.11.9), or submit the sweep with `ray job submit` so it runs on the cluster's own"
    )
    assert (
        join_refusal("h:1", ConnectionError("Failed to connect\nmore"))
        == "cannot join the Ray cluster at h:1: Failed to connect"
    )


def test_a_layer_search_the_cpu_reference_fails_is_noted_where_other_work_ends_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    from harness.judge.golden import RatioLimits
    from harness.judge.verdicts import Rules, tolerance_of
    from harness.policies import load_policy
    from harness.sweeps import gather
    from harness.sweeps.dispatch import Located, Role, Submitted, judge
    from harness.sweeps.gather import RunIncomplete
    from harness.sweeps.plan import BatchWork, LocateWork, Search, Unit
    from harness.workloads import make_batch

    def fails(refs: Any) -> Any:
        raise ray.exceptions.RayError("boom")

    monkeypatch.setattr(gather.ray, "get", fails)
    monkeypatch.setattr(gather, "node_alive", lambda node_id: True)
    watch = _watch(cards=1, hang_timeout_s=60.0)
    batch = make_batch(load_policy("cartpole").info, "normal", 8, 0)
    search = Unit("s", "cartpole", "float16", LocateWork(Search.OVERFLOW, batch, None))
    job = Submitted(search, {}, {Role.SAME: "same", Role.GOLDEN: "golden"}, members={Role.SAME: 0, Role.GOLDEN: 0})
    got, _ = gather._gathered(job, watch, shares_of(job, watch.reference))
    assert got.failed == {"cpu": "boom"} and got.references == {}
    rules = Rules("float16", RatioLimits(), *tolerance_of("float16", {}), frozenset())
    assert judge(search, rules, False, got).located == Located("overflow search failed: boom")
    batch_job = Submitted(
        Unit("b", "cartpole", "float16", BatchWork(batch)), {}, {Role.GOLDEN: "golden"}, members={Role.GOLDEN: 0}
    )
    with pytest.raises(RunIncomplete, match="failed for good"):
        gather._gathered(batch_job, watch, shares_of(batch_job, watch.reference))
