"""Closed-loop verdicts on cards that are honest but not bit-equal to the CPU, and on one that loses
return: real sweeps on the session's cluster of a policy whose every decision is a near-tie
(tests/builders.py `near_tie_cartpole`), so that a card rounding otherwise plays other episodes
from the first steps, as in a chaotic environment. Also `--episodes auto` and its resume, the
honest-port replay, the report, and a float16 overflow that is the dtype's, not the port's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.judge.returns import Outcome
from harness.judge.verdicts import HONEST
from harness.policies import load_policy
from harness.sweeps.closed_loop import ClosedLoop
from harness.config.command_plan import sweep_plan
from harness.config.options import SweepConfig
from harness.sweeps.plan import EpisodeWork, Unit, plan_inputs, plan_units
from harness.store.claim import Claim
from harness.store.schema import EpisodeRow
from harness.store.writer import RunWriter
from tests import builders
from tests.conftest import Head
from tests.helpers import cli, read_table, sweep_on

QUICK = ("--dtypes", "float32", "--batch-sizes", "8")


@pytest.fixture(scope="module")
def near_tie(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builders.near_tie_cartpole(tmp_path_factory.mktemp("near-tie"))


@pytest.fixture(scope="module")
def overflow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builders.float16_overflow(tmp_path_factory.mktemp("overflow"))


@pytest.fixture(scope="module")
def faults(near_tie: Path, overflow: Path, ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Card 0 as the CPU computes; card 1 an honest card of its own (ulp-noise); card 2 one weight one
    ULP off; card 3 a bias on the first logit that loses return. 24 episodes per mode, float32 (and
    float16 for the policy that overflows it)."""
    results = tmp_path_factory.mktemp("closed-loop")
    proc = sweep_on(
        ray_head.address,
        results,
        "--policy",
        str(near_tie),
        "--policy",
        str(overflow),
        "--dtypes",
        "float32,float16",
        "--batch-sizes",
        "64",
        "--episodes",
        "24",
        "--cards",
        "4",
        "--run-id",
        "faults",
        "--inject-fault",
        "card1:ulp-noise",
        "--inject-fault",
        "card2:perturb-weight",
        "--inject-fault",
        "card3:action-bias=0.5",
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return results, proc.stdout


def returns_rows(results: Path, run_id: str, policy: Path) -> list[dict]:
    """The near-tie policy's closed-loop rows in float32 (in float16 its one-ULP ties are exact ties)."""
    checks = read_table(results, "checks").to_pylist()
    return [
        r
        for r in checks
        if r["kind"] == "episode_return" and r["run_id"] == run_id and r["policy"] == str(policy) and r["dtype"] == "float32"
    ]


@pytest.mark.slow
def test_honest_cards_never_fail_the_closed_loop_and_one_that_loses_return_does(
    faults: tuple[Path, str], near_tie: Path
) -> None:
    results, out = faults
    rows = {(r["device_a"], r["workload"].split("-")[1]): r for r in returns_rows(results, "faults", near_tie)}
    assert len(rows) == 8, "4 cards x 2 modes"
    clean = rows["sim-cpu0", "deterministic"]
    assert clean["outcome"] == Outcome.PASS and clean["detail"].startswith("returns identical to the CPU's in all 24")
    for card in ("sim-cpu1", "sim-cpu2"):
        for mode in ("deterministic", "stochastic"):
            assert rows[card, mode]["outcome"] != Outcome.FAIL, rows[card, mode]["detail"]
    honest = rows["sim-cpu1", "deterministic"]
    assert honest["return_diff_low"] < honest["return_diff_high"], "it played other episodes: the statistics judged them"
    lost = rows["sim-cpu3", "deterministic"]
    assert lost["outcome"] == Outcome.FAIL and lost["gating"] and not lost["passed"]
    assert lost["return_diff_high"] < -lost["return_margin"] < 0
    assert "FAIL" in out and "episode_return" in out


@pytest.mark.slow
def test_every_closed_loop_row_carries_its_interval_margin_count_and_outcome(faults: tuple[Path, str], near_tie: Path) -> None:
    results, _ = faults
    for row in returns_rows(results, "faults", near_tie):
        assert row["n_elements"] == 24 and row["outcome"] in {o.value for o in Outcome}
        for column in ("return_diff_low", "return_diff_high", "return_margin", "return_a_low", "iqm_a", "iqm_b_high"):
            assert row[column] is not None and np.isfinite(row[column]), (column, row)
        assert row["return_diff_low"] <= row["return_diff"] <= row["return_diff_high"]
        undecided = row["outcome"] == Outcome.INCONCLUSIVE
        assert (row["episodes_needed"] is not None) == undecided or row["episodes_needed"] is None
        assert not (undecided and row["gating"]), "INCONCLUSIVE gates only with --require-conclusive"


@pytest.mark.slow
def test_the_cpu_replays_the_seeds_as_an_honest_port_and_says_where_it_parts(faults: tuple[Path, str], near_tie: Path) -> None:
    results, _ = faults
    episodes = [
        e
        for e in read_table(results, "episodes").to_pylist()
        if e["run_id"] == "faults" and e["policy"] == str(near_tie) and e["dtype"] == "float32"
    ]
    honest = [e for e in episodes if e["device"] == HONEST and e["mode"] == "deterministic"]
    assert len(honest) == 24 and sum(e["first_divergent_step"] is not None for e in honest) >= 12
    cards = [e for e in episodes if e["device"] == "sim-cpu1" and e["mode"] == "deterministic"]
    assert sum(e["first_divergent_step"] is not None for e in cards) >= 12
    row = next(r for r in returns_rows(results, "faults", near_tie) if r["device_a"] == "sim-cpu1")
    assert "trajectories part from the CPU's: this card" in row["detail"] and "an honest port" in row["detail"]


@pytest.mark.slow
def test_the_report_shows_return_distributions_with_intervals_and_parting_steps(
    faults: tuple[Path, str], tmp_path: Path
) -> None:
    results, _ = faults
    proc = cli("report", "faults", "--results", str(results), "--out", str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    section = proc.stdout.split("Closed loop:")[1].split("\n\n")[0]
    assert "mean (95%)" in section and "IQM (95%)" in section and "an honest port parts" in section
    assert "sim-cpu3 vs cpu" in section and "FAIL" in section
    # The sign-off page: every closed-loop row with its intervals, and each device's returns drawn,
    # the honest-port replay among them.
    page = (tmp_path / "report-faults.html").read_text()
    assert 'id="episodes"' in page and "episode returns per device and seed" in page
    assert "return_diff_low" in page and "return_margin" in page and HONEST in page


@pytest.mark.slow
def test_episodes_auto_plays_rounds_until_conclusive_or_a_cap(ray_head: Head, tmp_path: Path) -> None:
    """A required published score of one episode (mean 15, std 10) cannot be decided by any number
    of our episodes: its own uncertainty is wider than the margin. So rounds are played, each twice
    the last, until the cap; the verdicts are judged on every round."""
    policy = builders.near_tie_cartpole(tmp_path / "policy")
    published = {"mean_reward": 15.0, "std_reward": 10.0, "is_deterministic": True, "n_eval_episodes": 1}
    (policy.parent / "results.json").write_text(json.dumps(published))
    proc = sweep_on(
        ray_head.address,
        tmp_path / "results",
        "--policy",
        str(policy),
        *QUICK,
        "--cards",
        "2",
        "--episodes",
        "auto",
        "--auto-max-episodes",
        "150",
        "--require-published-return",
        "--inject-fault",
        "all:ulp-noise",
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [note] = [line for line in proc.stdout.splitlines() if "--episodes auto:" in line]
    assert note.endswith("(caps: 150 episodes, 600 s); stopped: the episode cap (--auto-max-episodes 150) was reached")
    checks = read_table(tmp_path / "results", "checks").to_pylist()
    [score] = [r for r in checks if r["kind"] == "published_return"]
    assert score["outcome"] == Outcome.INCONCLUSIVE and score["n_elements"] == 150 and score["episodes_needed"] is None
    assert score["workload"] == "published-deterministic-150x-s0-lockstep" and not score["gating"]
    assert "INCONCLUSIVE: " in proc.stdout and "--require-conclusive" in proc.stdout
    rounds = sorted(
        {
            (e["unit_id"], e["episode_seed"])
            for e in read_table(tmp_path / "results", "episodes").to_pylist()
            if e["mode"] == "deterministic" and e["device"] == "cpu"
        }
    )
    seeds = {}
    for unit, seed in rounds:
        seeds.setdefault(unit, []).append(seed)
    assert sorted((min(s), len(s)) for s in seeds.values()) == [(0, 24), (24, 24), (48, 48), (96, 54)]
    closed_loop = [r for r in checks if r["kind"] == "episode_return"]
    assert closed_loop and all(r["outcome"] != Outcome.FAIL for r in closed_loop), "an honest card"
    # An honest card with every decision a near-tie can move one beyond the decisions rule's
    # per-row limit on the uniform batch (docs/verdicts.md, "Closed-loop returns"): the only gating failure allowed.
    assert {r["kind"] for r in checks if r["gating"] and not r["passed"]} <= {"decisions"}


def test_a_resumed_auto_run_plays_the_rounds_an_uninterrupted_one_would(near_tie: Path, tmp_path: Path) -> None:
    """Rounds 0 and 1 staged, then the driver killed: the resumed run judges round 0 alone from
    its staged rows, plans round 1 again (the same unit, staged: not run), and then the same
    round 2 as a run that never stopped."""
    config = sweep_plan(SweepConfig(policies=[str(near_tie)], dtypes=["float32"], episodes="auto", return_margin="0.1std"))
    policy = load_policy(str(near_tie))
    policies = {str(near_tie): policy}
    units = plan_units(config, policies, {str(near_tie): plan_inputs(config, policy)}, {"float32": "float32"})
    [first] = [u for u in units if isinstance(u.work, EpisodeWork) and not u.work.stochastic]

    def played(unit: Unit) -> list[EpisodeRow]:
        """The CPU and a card drawing returns of one distribution, each seed's the same whenever it is played."""
        assert isinstance(unit.work, EpisodeWork)
        return [
            EpisodeRow(
                unit.unit_id,
                unit.policy,
                unit.dtype,
                device,
                "CartPole-v1",
                "deterministic",
                "lockstep",
                24,
                seed,
                float(np.random.default_rng([seed, i]).normal(20, 8)),
                20,
                "",
                None if device == "cpu" else 3,
            )
            for seed in unit.work.seeds
            for i, device in enumerate(("cpu", "sim-cpu0"))
        ]

    uninterrupted = ClosedLoop(config, policies)
    uninterrupted.add(first, played(first))
    [round1] = uninterrupted.next_round()
    uninterrupted.add(round1, played(round1))
    [round2] = uninterrupted.next_round()
    assert round1.work.seeds[0] == 24 and round2.work.seeds[0] == round1.work.seeds[-1] + 1

    with Claim.take(tmp_path, "auto", False, "2026-12-01T00:00:00+00:00") as claim:
        writer = RunWriter(claim)
        for unit in (first, round1):
            writer.stage_unit(unit.unit_id, [], played(unit))
        resumed = ClosedLoop(config, policies)
        resumed.add(first, writer.staged_episodes(first.unit_id))
        assert resumed.next_round() == [round1]
        resumed.add(round1, writer.staged_episodes(round1.unit_id))
        assert resumed.next_round() == [round2]
    assert [v.unit_id for v in resumed.verdicts()] == [v.unit_id for v in uninterrupted.verdicts()]


@pytest.mark.slow
def test_a_float16_overflow_the_cpu_shares_fails_the_dtype_with_its_layer_not_the_port(
    faults: tuple[Path, str], overflow: Path
) -> None:
    results, _ = faults
    checks = [
        r
        for r in read_table(results, "checks").to_pylist()
        if r["policy"] == str(overflow) and r["dtype"] == "float16" and r["device_a"] == "sim-cpu0"
    ]
    port = [r for r in checks if r["kind"] == "cpu_reference" and r["n_overflow"]]
    assert port and all(r["passed"] for r in port), "the port is right: the overflow is float16's"
    assert all("the overflow begins at body.0 Linear(4, 16)" in r["detail"] for r in port)
    failed = [r for r in checks if r["gating"] and not r["passed"] and r["workload"].startswith(("normal", "uniform", "edge"))]
    assert failed and {r["kind"] for r in failed} <= {"tolerance", "decisions"}, "only the dtype's checks fail"
    assert all("the overflow begins at body.0 Linear(4, 16)" in r["detail"] for r in failed)
