"""Closed-loop returns judged as distributions, on hand-built returns: no Ray, no environments.

The exact answers (identical returns pass, any difference where the CPU never varies fails, a
return that is not finite fails), the three outcomes of the paired interval against the margin,
gross losses decided at a few episodes while honest cards are not failed there, the episodes an
undecided verdict asks for, the margin's sources, and the published score judged the same way. A
verdict is what its numbers are: the same returns give the same row.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.judge.kinds import CheckKind
from harness.judge.returns import Interval, Margin, Outcome, decide, expanded_level, interval, iqm, t_interval
from harness.judge.returns import ReturnComparison
from harness.judge.verdicts import ClosedLoopRules, Paired, Published, judge_published, judge_returns

RULES = ClosedLoopRules()


def paired(card: np.ndarray, cpu: np.ndarray, card_steps: list[int | None] | None = None) -> Paired:
    n = len(card)
    steps = card_steps if card_steps is not None else [None if c == r else 10 for c, r in zip(card, cpu, strict=True)]
    return Paired(np.arange(n), np.asarray(card, float), np.asarray(cpu, float), steps, [None] * n)


def landings(rng: np.random.Generator, n: int) -> np.ndarray:
    """Returns of a lander: most episodes land near 220, three in ten crash near -100."""
    crash = rng.random(n) < 0.3
    return np.where(crash, rng.normal(-100, 20, n), rng.normal(220, 30, n))


def result(card: np.ndarray, cpu: np.ndarray, rules: ClosedLoopRules = RULES, std: float | None = None) -> ReturnComparison:
    check = judge_returns("sim-cpu1", paired(card, cpu), rules, std)
    assert check.kind == CheckKind.EPISODE_RETURN and (check.device_a, check.device_b) == ("sim-cpu1", "cpu")
    assert isinstance(check.result, ReturnComparison)
    assert check.passed == (check.result.outcome == Outcome.PASS), "only PASS passes"
    return check.result


def test_identical_returns_pass_without_statistics() -> None:
    cartpole = np.full(4, 500.0)  # seals CartPole: 500 in every episode, bit-equal trajectories
    r = result(cartpole, cartpole)
    assert r.outcome == Outcome.PASS and (r.return_diff, r.return_diff_low, r.return_diff_high) == (0.0, 0.0, 0.0)
    assert r.detail.startswith("returns identical to the CPU's in all 4 episodes")
    varied = landings(np.random.default_rng(0), 3)
    assert result(varied, varied).outcome == Outcome.PASS, "identical returns need no minimum of episodes"


def test_any_difference_where_the_cpu_never_varies_fails() -> None:
    cpu = np.full(24, 500.0)
    card = cpu.copy()
    card[7] = 499.0
    r = result(card, cpu)
    assert r.outcome == Outcome.FAIL and r.return_margin == 0.0
    assert "the CPU's return never varies (500 in all 24 episodes), the card's differs in 1 (seed 7 first: 499)" in r.detail
    card[7] = 501.0  # not worse: a card that plays another policy all the same
    assert result(card, np.full(24, 500.0)).outcome == Outcome.FAIL


def test_a_return_that_is_not_finite_fails() -> None:
    cpu = landings(np.random.default_rng(1), 30)
    card = cpu.copy()
    card[3] = np.nan
    r = result(card, cpu)
    assert r.outcome == Outcome.FAIL and "not finite in 1 of 30 episodes" in r.detail


def test_an_honest_card_in_a_chaotic_environment_never_fails() -> None:
    """Two draws of one distribution per seed (the trajectories parted): over many sweeps' worth
    of seeds, PASS or INCONCLUSIVE at 24 episodes, and mostly PASS at 100."""
    outcomes: dict[int, list[Outcome]] = {24: [], 100: []}
    for seed in range(30):
        rng = np.random.default_rng(seed)
        for n in outcomes:
            outcomes[n].append(Outcome(result(landings(rng, n), landings(rng, n)).outcome))
    assert Outcome.FAIL not in outcomes[24] + outcomes[100]
    assert outcomes[100].count(Outcome.PASS) >= 22, outcomes[100]


def test_a_card_that_loses_more_than_the_margin_fails() -> None:
    rng = np.random.default_rng(2)
    cpu = landings(rng, 100)
    card = landings(rng, 100) - 200.0  # about 1.4 standard deviations of return lost
    r = result(card, cpu)
    assert r.outcome == Outcome.FAIL and r.return_diff_high < -r.return_margin
    assert "it loses more than the margin" in r.detail and r.episodes_needed is None


def test_an_undecided_verdict_says_how_many_episodes_would_decide() -> None:
    rng = np.random.default_rng(3)
    cpu = landings(rng, 400)
    card = landings(rng, 400) - 25.0
    r = result(card[:24], cpu[:24])
    assert r.outcome == Outcome.INCONCLUSIVE and r.return_diff_low < -r.return_margin < r.return_diff_high
    assert r.episodes_needed is not None and r.episodes_needed > 24
    assert f"about {r.episodes_needed} episodes would decide" in r.detail
    decided = result(card[: r.episodes_needed * 2], cpu[: r.episodes_needed * 2])
    assert decided.outcome != Outcome.INCONCLUSIVE, "twice the episodes it asked for decide it"


def test_a_gross_loss_fails_at_five_and_at_ten_episodes() -> None:
    """A Hopper card returning about 200 against the CPU's 2439 (issue 34), and a lander card that
    loses far more than its spread: FAIL with no minimum of episodes."""
    rng = np.random.default_rng(10)
    for n in (5, 10):
        hopper = result(rng.normal(198, 120, n), rng.normal(2439, 40, n))
        assert hopper.outcome == Outcome.FAIL and "it loses more than the margin" in hopper.detail, hopper.detail
        assert hopper.return_diff_high < hopper.return_diff_fail_high < 0, "a loss at all beyond doubt, in its column"
        lander = result(landings(rng, n) - 1000.0, landings(rng, n))
        assert lander.outcome == Outcome.FAIL, lander.detail
    cpu = np.array([100.0, 250.0, -80.0, 230.0])
    assert result(cpu - 1000.0, cpu).outcome == Outcome.FAIL, "1000 less in each of 4 episodes: no spread to doubt"


def test_an_honest_card_does_not_fail_at_a_few_episodes() -> None:
    """Two draws of the lander's bimodal returns per seed, at 5 and 10 episodes, over many seeds:
    never FAIL (the 95% interval alone failed about one in 200 of these at 5)."""
    outcomes = [
        Outcome(result(landings(rng, n), landings(rng, n)).outcome)
        for seed in range(150)
        for rng in [np.random.default_rng(100 + seed)]
        for n in (5, 10)
    ]
    assert Outcome.FAIL not in outcomes and Outcome.PASS in outcomes


def test_one_episode_has_no_spread_and_decides_nothing() -> None:
    """Nor does it show that the CPU's return never varies."""
    r = result(np.array([-1000.0]), np.array([200.0]))
    assert r.outcome == Outcome.INCONCLUSIVE and r.episodes_needed is None
    assert (r.return_diff_low, r.return_diff_high, r.return_diff_fail_high) == (-np.inf, np.inf, np.inf)


def test_a_loss_below_the_margin_fails_only_beyond_doubt() -> None:
    """At 5 episodes a 95% interval below the margin, but not far enough from zero: INCONCLUSIVE,
    with the episodes that would decide; at those, the same spread FAILs."""
    undecided = decide(Interval(-10.0, -18.0, -2.0), 1.0, 5)
    assert undecided.outcome == Outcome.INCONCLUSIVE and "a loss at all is not beyond doubt" in undecided.reason
    needed = undecided.episodes_needed
    assert needed is not None and 5 < needed < 20 and f"about {needed} episodes would decide" in undecided.reason
    from scipy.stats import t

    for n, outcome in ((needed - 1, Outcome.INCONCLUSIVE), (needed, Outcome.FAIL)):
        half = 8.0 * np.sqrt(5 / n) * t.ppf(0.975, n - 1) / t.ppf(0.975, 4)  # the same spread, n episodes
        assert decide(Interval(-10.0, -10.0 - half, -10.0 + half), 1.0, n).outcome == outcome, (n, half)


def test_the_t_interval_of_a_mean() -> None:
    from scipy.stats import ttest_1samp

    values = landings(np.random.default_rng(11), 7)
    ci = ttest_1samp(values, 0.0).confidence_interval(0.95)
    assert t_interval(values) == Interval(pytest.approx(values.mean()), pytest.approx(ci.low), pytest.approx(ci.high))
    floored = t_interval(values, sd_floor=10 * values.std(ddof=1))
    assert floored.high - floored.estimate == pytest.approx(10 * (ci.high - values.mean())), "a known spread it cannot narrow"
    assert t_interval(np.full(3, 7.0)) == Interval.exact(7.0) and t_interval(np.array([7.0])).low == -np.inf


def test_inconclusive_gates_only_when_required() -> None:
    rng = np.random.default_rng(4)
    cpu = landings(rng, 24)
    card = landings(rng, 24)
    check = judge_returns("c", paired(card, cpu), RULES)
    assert check.result.outcome == Outcome.INCONCLUSIVE
    assert not check.passed and not check.gating
    required = judge_returns("c", paired(card, cpu), ClosedLoopRules(require_conclusive=True))
    assert not required.passed and required.gating


def test_the_margin_is_a_fraction_of_the_pooled_spread_a_return_or_the_published_std() -> None:
    rng = np.random.default_rng(5)
    cpu, card = landings(rng, 50), landings(rng, 50)
    pooled = np.std(np.concatenate([card, cpu]), ddof=1)
    assert result(card, cpu).return_margin == pytest.approx(0.5 * pooled)
    assert result(card, cpu, ClosedLoopRules(Margin.parse("0.25std"))).return_margin == pytest.approx(0.25 * pooled)
    assert result(card, cpu, ClosedLoopRules(Margin.parse("12"))).return_margin == 12.0
    wide = result(card, cpu, std=10 * pooled)
    assert wide.return_margin == pytest.approx(5 * pooled) and "the published std" in wide.detail
    assert result(card, cpu, std=0.1 * pooled).return_margin == pytest.approx(0.5 * pooled), "the larger spread"
    for bad in ("", "std", "-1", "0.5 sd", "ten"):
        with pytest.raises(ValueError, match="neither a return"):
            Margin.parse(bad)


def test_rows_carry_both_sides_mean_and_iqm_with_intervals_and_are_reproducible() -> None:
    rng = np.random.default_rng(6)
    cpu, card = landings(rng, 60), landings(rng, 60)
    r = result(card, cpu)
    assert r == result(card, cpu), "the bootstrap is seeded"
    assert r.return_a == pytest.approx(card.mean()) and r.return_b == pytest.approx(cpu.mean())
    assert r.iqm_a == pytest.approx(float(iqm(card))) and r.iqm_b == pytest.approx(float(iqm(cpu)))
    for low, value, high in (
        (r.return_a_low, r.return_a, r.return_a_high),
        (r.iqm_a_low, r.iqm_a, r.iqm_a_high),
        (r.return_b_low, r.return_b, r.return_b_high),
        (r.return_diff_low, r.return_diff, r.return_diff_high),
    ):
        assert low < value < high
    assert r.n_elements == 60 and r.return_diff == pytest.approx((card - cpu).mean())


def test_the_interval_is_expanded_for_few_episodes() -> None:
    assert expanded_level(10) > expanded_level(24) > expanded_level(1000) > 0.95
    assert expanded_level(1000) == pytest.approx(0.95, abs=0.002)
    values = landings(np.random.default_rng(7), 12)
    narrow = np.percentile(values, [2.5, 97.5])  # not the interval: only that the expanded one is a real one
    ci = interval(values)
    assert ci.low < values.mean() < ci.high and ci.high - ci.low < narrow[1] - narrow[0]


def test_decide_against_the_margin() -> None:
    assert decide(Interval(0.0, -1.0, 1.0), 2.0, 30).outcome == Outcome.PASS
    assert decide(Interval(-5.0, -6.0, -4.0), 2.0, 30).outcome == Outcome.FAIL
    undecided = decide(Interval(-2.0, -3.0, -1.0), 2.0, 30)
    assert undecided.outcome == Outcome.INCONCLUSIVE and undecided.episodes_needed is None, "it sits on the margin"
    # A part of the interval more episodes cannot shrink (a published mean's own) can leave it undecidable.
    assert decide(Interval(-1.0, -3.5, 1.5), 2.0, 30, fixed_half_width=2.0).episodes_needed is None


def published(cpu: np.ndarray, mean: float, std: float, n: int | None = 100) -> ReturnComparison:
    check = judge_published(cpu, Published(mean, std, n, "model card"), RULES)
    assert check.kind == CheckKind.PUBLISHED_RETURN and (check.device_a, check.device_b) == ("cpu", "published")
    assert isinstance(check.result, ReturnComparison)
    assert check.gating or check.result.outcome == Outcome.INCONCLUSIVE, "gates by default (--published-return gate)"
    return check.result


def test_the_published_score_is_judged_as_an_interval() -> None:
    cpu = landings(np.random.default_rng(8), 100)
    near = published(cpu, float(cpu.mean()) + 5.0, float(cpu.std()))
    assert near.outcome == Outcome.PASS and near.return_b == pytest.approx(cpu.mean() + 5.0)
    assert near.return_b_low < near.return_b < near.return_b_high, "the published mean's own interval, of 100 episodes"
    far = published(cpu, 300.0, 1.0)
    assert far.outcome == Outcome.FAIL and far.published_std == 1.0
    few = published(cpu[:4], float(cpu[:4].mean()), float(cpu[:4].std()), 4)
    assert few.outcome == Outcome.INCONCLUSIVE, "4 episodes against a mean of 4 cannot tell"
    unstated = published(cpu, float(cpu.mean()), float(cpu.std()), None)
    assert unstated.return_b_low == unstated.return_b_high and "taken as exact" in unstated.detail


def test_a_published_score_that_never_varied_is_matched_exactly() -> None:
    assert published(np.full(10, 500.0), 500.0, 0.0).outcome == Outcome.PASS
    assert published(np.full(10, 480.0), 500.0, 0.0).outcome == Outcome.FAIL
    wobbly = published(np.array([500.0, 480.0] * 15), 500.0, 0.0)
    assert wobbly.return_margin == pytest.approx(0.5 * np.std([500.0, 480.0] * 15, ddof=1)), "our spread, then"


def test_a_required_published_score_gates_pass_and_fail_and_inconclusive_only_when_required() -> None:
    cpu = landings(np.random.default_rng(9), 24)
    score = Published(float(cpu.mean()), float(cpu.std()), 4, "results.json")
    undecided = judge_published(cpu, score, ClosedLoopRules(published_gates=True))
    assert undecided.result.outcome == Outcome.INCONCLUSIVE and not undecided.gating
    assert judge_published(cpu, score, ClosedLoopRules(published_gates=True, require_conclusive=True)).gating
    far = judge_published(cpu, Published(1000.0, 1.0, 100, "results.json"), ClosedLoopRules(published_gates=True))
    assert far.result.outcome == Outcome.FAIL and far.gating and not far.passed


def test_a_published_score_far_above_our_returns_fails_at_a_few_episodes() -> None:
    """A TRPO Ant played in another environment than its published score's (issue 34: 71 against
    4982, a published std of 1200 taken as the least spread of ours): FAIL at 10 episodes, not
    INCONCLUSIVE for want of episodes; at 5 the published spread leaves a loss in doubt."""
    ant = np.random.default_rng(12).normal(71, 200, 10)
    far = published(ant, 4982.0, 1200.0, 100)
    assert far.outcome == Outcome.FAIL and "it loses more than the margin" in far.detail, far.detail
    few = published(ant[:5], 4982.0, 1200.0, 100)
    assert few.outcome == Outcome.INCONCLUSIVE and few.episodes_needed is not None and few.episodes_needed <= 10


def test_a_few_episodes_that_happen_to_agree_do_not_fail_a_published_score() -> None:
    """Four crashes of a lander whose landings make its published score: our spread of four is
    tiny, the published one is not, and it bounds how sure our mean can be."""
    crashes = np.array([-100.0, -96.0, -104.0, -101.0])
    r = published(crashes, 124.0, 149.0, 100)
    assert r.outcome == Outcome.INCONCLUSIVE and r.return_diff_high > -r.return_margin, r.detail
