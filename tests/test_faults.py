"""What the driver decides when cards fail, without a cluster: how long an actor may take over a
unit, what a hang fault does, what an incomplete run prints, and the one-line reasons a cluster
refuses to be joined."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.inference.fault_specs import Fault, parse_faults
from harness.inference.faults import strike
from harness.report.summary import print_summary
from harness.run.gather import HANG_MULTIPLE, RESTART_MARGIN, Share, Watch, shares_of
from harness.run.place import Placed, Placement, join_refusal, token_refusal
from harness.store.schema import SCHEMAS
from tests.builders import described


def _watch(cards: int, hang_timeout_s: float, started_s: float = 0.0) -> Watch:
    placed = [Placed(object(), described(f"sim-cpu{i}", f"node{i}")) for i in range(cards)]
    placement = Placement(group=None, cards=placed, reference=Placed(object(), described("cpu", "n")), resource="NPU")
    return Watch(placement, hang_timeout_s, started_s)


def test_a_units_deadline_is_a_multiple_of_what_the_others_took_over_it_never_less_than_the_floor() -> None:
    watch = _watch(cards=2, hang_timeout_s=3.0)
    share = Share("cartpole float32 normal-b64-s0", "u1", [])
    assert watch.deadline_s(1, share) == 3.0, "nothing measured yet: the floor"
    watch.took["u1"] = {0: 0.4, 2: 0.9}
    assert watch.deadline_s(1, share) == pytest.approx(HANG_MULTIPLE * 0.4), "the fastest other actor sets it"
    assert watch.deadline_s(0, share) == pytest.approx(HANG_MULTIPLE * 0.9), "an actor's own time never counts"
    watch.took["u1"][3] = 30.0  # a card that died and restarted over the unit
    assert watch.deadline_s(1, share) == pytest.approx(HANG_MULTIPLE * 0.4), "nor does another's restart"
    assert watch.deadline_s(2, share) == pytest.approx(max(3.0, HANG_MULTIPLE * 0.4))
    watch.longest = 1.5
    later = Share("cartpole float32 episodes-deterministic-4x-s0-lockstep", "u2", [])
    assert watch.deadline_s(0, later) == pytest.approx(HANG_MULTIPLE * 1.5), "none finished it: the longest share so far"


def test_a_restarted_actor_is_given_twice_its_first_start_and_never_less_than_a_placement() -> None:
    from harness.run.place import PLACEMENT_TIMEOUT_S

    assert _watch(cards=1, hang_timeout_s=5.0, started_s=3.0).restart_s() == PLACEMENT_TIMEOUT_S
    # Actors that took 44 s to start (a CUDA torch on a busy machine) are not lost at 30 s when one restarts.
    assert _watch(cards=1, hang_timeout_s=5.0, started_s=44.0).restart_s() == pytest.approx(RESTART_MARGIN * 44.0)


def test_the_reference_comes_after_the_cards_and_each_card_is_asked_its_run_and_its_whole_batch() -> None:
    from harness.run.dispatch import Role, Submitted

    job = Submitted(unit=None, cards=["a0", "a1"], references={Role.GOLDEN: "g", Role.SAME: "s"}, inside=["w0", "w1"])
    assert shares_of(job, reference=2) == {0: ["a0", "w0"], 1: ["a1", "w1"], 2: ["g", "s"]}
    assert _watch(2, 1.0).reference == 2


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
    lost = "LOST card1 (sim-cpu1): hung again after its restart (no result within 3 s); it was running cartpole"
    print_summary(SCHEMAS["checks"].empty_table(), "r1", "incomplete", out, notes=[lost], units_done=(4, 9))
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
