"""The bench's statistics and rules, on hand-made samples, without Ray: percentiles as DuckDB reads
them, intervals from order statistics, every validity rule (each with a case it must fail),
Poisson arrivals, the rate search, and how windows are repeated, kept and turned into rows."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
import json
import math

import duckdb
import numpy as np
import pytest

from harness.inference.timing import LatencyWindow, Throughput
from harness.judge.bench_stats import (
    Interval,
    efficiency_above_one,
    fewest_samples,
    latency_percentiles,
    median_interval,
    order_statistic_ranks,
    quantile_interval,
    quantiles,
    round_efficiencies,
    round_trip_dominates,
    starved,
    too_few_for_interval,
    too_few_for_percentile,
    too_few_iterations,
    too_few_windows,
    window_p50s,
    windows_disagree,
)
from harness.policies import load_policy
from harness.benches.latency import latency_measurement
from harness.benches.server import Trial, find_max_rate
from harness.benches.throughput import Round, round_schedule, scaling_measurements
from harness.benches.windows import Windows, kept_windows, repeat_windows
from harness.benches.work import Work
from harness.cluster.place import BenchCard, Placed
from harness.workloads import make_batch, poisson_arrivals
from tests.builders import described

WINDOWS = Windows(count=6, seconds=0.1, min_iterations=5, max_spread=0.25)


def test_percentiles_are_duckdbs_quantile_cont() -> None:
    rng = np.random.default_rng(0)
    for samples in (rng.exponential(1.0, 37), rng.lognormal(0, 1, 1000), np.array([3.0, 1.0, 2.0, 10.0])):
        qs = [0.5, 0.95, 0.99]
        con = duckdb.connect()
        con.register("s", {"x": samples})
        sql = con.execute("SELECT " + ", ".join(f"quantile_cont(x, {q})" for q in qs) + ", median(x) FROM s").fetchone()
        assert sql is not None
        assert quantiles(samples, qs) == pytest.approx(list(sql[:3]), rel=1e-12)
        assert quantiles(samples, [0.5])[0] == pytest.approx(sql[3], rel=1e-12)


def _coverage(n: int, q: float, lower: int, upper: int) -> float:
    """P(x_(lower) <= quantile <= x_(upper)) = P(lower <= B < upper), B ~ Binomial(n, q), summed exactly."""
    return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(lower, upper))


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_order_statistic_ranks_are_the_narrowest_equal_tailed_95_percent_interval(q: float) -> None:
    for n in (*range(1, 40), 100, 368, 500):
        ranks = order_statistic_ranks(n, q)
        if ranks is None:
            # No interval: even [x_(1), x_(n)] leaves a tail above 2.5% (all n below, or all above).
            assert (1 - q) ** n > 0.025 or q**n > 0.025, n
            continue
        lower, upper, coverage = ranks
        assert coverage == pytest.approx(_coverage(n, q, lower, upper), abs=1e-9)
        assert coverage >= 0.95
        # One rank further in, on either side, and a tail would pass 2.5%.
        assert _coverage(n, q, lower + 1, n + 1) < 0.975 or lower + 1 > n
        assert _coverage(n, q, 0, upper - 1) < 0.975 or upper - 1 < 1


def _exact_ranks(n: int, q: Fraction, tail: Fraction) -> tuple[int, int] | None:
    """The equal-tailed ranks in exact rational arithmetic: the largest l with P(B <= l - 1) <= tail
    and the smallest u with P(B <= u - 1) >= 1 - tail, B ~ Binomial(n, q); None outside 1..n."""
    cdf, total = [], Fraction(0)
    for i in range(n + 1):
        total += math.comb(n, i) * q**i * (1 - q) ** (n - i)
        cdf.append(total)
    lower = sum(1 for c in cdf if c <= tail)
    upper = next(k for k, c in enumerate(cdf) if c >= 1 - tail) + 1
    return (lower, upper) if lower >= 1 and upper <= n else None


@pytest.mark.parametrize("q", ["1/2", "19/20", "99/100"])
def test_the_interval_bounds_the_exact_ranks(q: str) -> None:
    """scipy's interval (quantile_test) holds the values at the ranks found in exact arithmetic,
    and there is none where one of those ranks falls outside the samples. Before scipy, the
    hand-made interval equalled scipy's for every n from 1 to 1200 at 90, 95 and 99%."""
    rng = np.random.default_rng(3)
    for n in (*range(1, 60), 100, 367, 368, 500):
        values = rng.permutation(np.arange(1.0, n + 1))  # each value its own rank
        interval = quantile_interval(values, float(Fraction(q)))
        ranks = _exact_ranks(n, Fraction(q), Fraction(1, 40))
        if ranks is None:
            assert interval is None, n
        else:
            assert interval is not None and (interval.low, interval.high) == ranks == (interval.lower, interval.upper), n


def test_the_fewest_samples_for_an_interval() -> None:
    assert fewest_samples(0.5) == 6
    assert order_statistic_ranks(5, 0.5) is None and order_statistic_ranks(6, 0.5) == (1, 6, 0.96875)
    assert order_statistic_ranks(9, 0.5)[:2] == (2, 8)  # type: ignore[index]
    assert fewest_samples(0.99) == 368 and order_statistic_ranks(367, 0.99) is None


def test_median_interval_of_hand_made_windows() -> None:
    assert median_interval(np.array([5.0, 1.0, 4.0, 2.0, 3.0])) is None
    six = median_interval(np.array([5.0, 1.0, 4.0, 2.0, 3.0, 6.0]))
    assert six is not None and (six.low, six.high, six.lower, six.upper) == (1.0, 6.0, 1, 6)
    nine = median_interval(np.arange(9.0)[::-1])
    assert nine is not None and (nine.low, nine.high) == (1.0, 7.0)


def test_the_interval_holds_the_median_as_often_as_it_says() -> None:
    """Nine windows from a skewed distribution, 4000 times: the interval holds the true median
    about 96% of the time; the narrower [x_(3), x_(7)] would not make 95%."""
    rng = np.random.default_rng(1)
    draws = np.sort(rng.lognormal(0, 1, (4000, 9)), axis=1)
    interval = median_interval(draws[0])
    assert interval is not None
    held = np.mean((draws[:, interval.lower - 1] <= 1.0) & (draws[:, interval.upper - 1] >= 1.0))
    narrower = np.mean((draws[:, 2] <= 1.0) & (draws[:, 6] >= 1.0))
    assert 0.95 <= held <= 0.975 and narrower < 0.95


def test_p99_interval_from_many_calls() -> None:
    calls = np.random.default_rng(2).exponential(1.0, 2000)
    interval = quantile_interval(calls, 0.99)
    assert interval is not None and interval.low < quantiles(calls, [0.99])[0] < interval.high
    assert quantile_interval(calls[:300], 0.99) is None


# ---- the validity rules: each passes where the row meets it and fails where it does not ---------


def test_rules_pass_and_fail() -> None:
    assert too_few_windows(6) is None
    assert "5 windows: a 95% interval of their median needs at least 6" in str(too_few_windows(5))
    assert starved(7, 9, 7) is None
    assert "cards starved: 10 of 14 windows" in str(starved(4, 14, 7))
    assert too_few_iterations([20, 25], 20) is None
    assert "1 of 2 windows held fewer than 20 iterations (fewest 19)" in str(too_few_iterations([20, 19], 20))
    assert too_few_for_percentile(100, 0.99) is None
    assert "p99 from 99 samples (it needs at least 100)" in str(too_few_for_percentile(99, 0.99))
    assert too_few_for_interval(368, 0.99) is None
    assert "needs at least 368" in str(too_few_for_interval(367, 0.99))
    close = Interval(0.9, 1.0, 1, 6, 0.97)
    assert windows_disagree(0.95, close, 0.25, "scaling") is None
    far = Interval(0.5, 1.0, 1, 6, 0.97)
    assert "windows disagree: the scaling interval 0.5 to 1 spans 67% of the median" in str(
        windows_disagree(0.75, far, 0.25, "scaling")
    )
    assert efficiency_above_one(Interval(0.97, 1.04, 1, 6, 0.97)) is None
    assert "lies above 1" in str(efficiency_above_one(Interval(1.01, 1.1, 1, 6, 0.97)))
    assert round_trip_dominates(0.4, 1.0) and not round_trip_dominates(0.6, 1.0)
    assert round_efficiencies(np.array([100.0, 50.0]), np.array([180.0, 100.0]), 2).tolist() == [0.9, 1.0]


# ---- Poisson arrivals ----------------------------------------------------------------------------


def _dispersion(arrivals: np.ndarray, bin_s: float) -> float:
    """Variance over mean of the counts in bins of `bin_s`: 1 for a Poisson process, 0 for a metronome."""
    counts = np.bincount((arrivals // bin_s).astype(int))[:-1]
    return float(counts.var() / counts.mean())


def test_poisson_arrivals() -> None:
    arrivals = poisson_arrivals(200.0, 20_000, seed=3)
    gaps = np.diff(arrivals, prepend=0.0)
    assert np.all(gaps > 0) and gaps.mean() == pytest.approx(1 / 200, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)  # exponential gaps
    assert _dispersion(arrivals, 0.05) == pytest.approx(1.0, abs=0.1)
    # The same seed gives the same schedule, scaled by the rate; another seed another one.
    assert np.allclose(poisson_arrivals(400.0, 20_000, seed=3), arrivals / 2)
    assert not np.allclose(poisson_arrivals(200.0, 20_000, seed=4), arrivals)
    evenly = np.arange(1, 20_001) / 200.0  # what a Poisson test must refuse
    assert _dispersion(evenly, 0.05) < 0.1 and np.diff(evenly).std() < 1e-9


# ---- the rate search -------------------------------------------------------------------------------


def _queue(service_ms: float, capacity_qps: float, bound_ms: float) -> tuple[list[float], Callable[[float], Trial]]:
    """A card whose p99 grows as 4.6 service times / (1 - load): an M/M/1 queue's p99."""
    tried: list[float] = []

    def trial(rate: float) -> Trial:
        tried.append(rate)
        p99 = math.inf if rate >= capacity_qps else 4.6 * service_ms / (1 - rate / capacity_qps)
        empty = np.array([])
        return Trial(rate, empty, empty.astype(np.int64), empty, p99, p99 <= bound_ms)

    return tried, trial


def test_the_search_finds_the_highest_rate_under_the_bound() -> None:
    # p99 = 4.6 / (1 - r / 1000) ms meets 20 ms up to r = 770 qps.
    for start in (100.0, 700.0, 3000.0):
        tried, trial = _queue(1.0, 1000.0, 20.0)
        search = find_max_rate(trial, start)
        assert search.best is not None and search.missed is not None
        assert search.best.rate_qps <= 770.0 < search.missed.rate_qps <= 1.1 * search.best.rate_qps, tried
        assert search.best.met and search.best.p99_ms <= 20.0 and len(tried) <= 10
        assert all(t.rate_qps <= search.best.rate_qps for t in search.trials if t.met), "the highest rate that met"


def test_the_search_says_when_it_cannot_answer() -> None:
    # Out of reach: 4.6 service times already exceed the bound at any rate.
    tried, trial = _queue(10.0, 100.0, 20.0)
    search = find_max_rate(trial, 50.0)
    assert search.best is None and search.missed is not None and tried == [50.0, 25.0, 12.5]
    # Never missed within its trials: the highest rate tried is only a lower bound.
    tried, trial = _queue(0.001, 1e12, 20.0)
    search = find_max_rate(trial, 10.0)
    assert search.missed is None and search.best is not None and search.best.rate_qps == 10.0 * 2**9


# ---- windows repeated, kept, and made into rows ---------------------------------------------------


def test_starved_windows_are_measured_again_up_to_as_many_more() -> None:
    def scripted(flags: list[bool]) -> tuple[list[int], object]:
        asked: list[int] = []
        it = iter(flags)

        def measure(n: int) -> list[bool]:
            asked.append(n)
            return [next(it) for _ in range(n)]

        return asked, measure

    asked, measure = scripted([False, True, False, True, False, False, False, False])
    got = repeat_windows(measure, lambda bad: bad, 6)  # type: ignore[arg-type]
    assert asked == [6, 2] and got.count(False) == 6 and kept_windows(got, 6) == [not b for b in got]
    # A machine that stays busy: 6 more and no further, and then every window is kept (the row is invalid).
    asked, measure = scripted([True] * 12)
    got = repeat_windows(measure, lambda bad: bad, 6)  # type: ignore[arg-type]
    assert asked == [6, 6] and kept_windows(got, 6) == [True] * 12


def test_rounds_alternate_their_order() -> None:
    entries = round_schedule([1, 2, 4], 2, 0, seconds=0.5, gap_s=0.1)
    assert [(r, k) for r, k, _ in entries] == [(0, 1), (0, 2), (0, 4), (1, 4), (1, 2), (1, 1)]
    assert [round(at, 6) for _, _, at in entries] == [0.0, 0.6, 1.2, 1.8, 2.4, 3.0]
    assert [r for r, _, _ in round_schedule([1, 2], 1, 3, 0.5, 0.1)] == [3, 3]


def _work(size: int = 8) -> Work:
    policy = load_policy("cartpole")
    return Work("cartpole", "float32", make_batch(policy.info, "normal", size, 0))


def _window(times_ms: list[float], cpu_share: float = 1.0) -> LatencyWindow:
    elapsed = sum(times_ms) / 1e3
    return LatencyWindow(np.asarray(times_ms), elapsed, cpu_share * elapsed)


def test_latency_row_takes_the_median_of_kept_windows_p50s_and_pools_their_calls() -> None:
    rng = np.random.default_rng(5)
    timed = [_window(list(rng.uniform(1.0, 1.2, 30))) for _ in range(6)] + [_window([9.0] * 30, cpu_share=0.3)]
    bad = [False] * 6 + [True]
    m = latency_measurement(_work(), "sim-cpu0", "device", 2.0, timed, bad, WINDOWS)
    pooled = np.concatenate([t.times_ms for t in timed[:6]])
    window_p50s = sorted(float(np.median(t.times_ms)) for t in timed[:6])
    assert m.row.p50_ms == float(np.median(window_p50s))
    assert (m.row.p95_ms, m.row.p99_ms) == tuple(quantiles(pooled, [0.95, 0.99]))
    assert (m.row.ci_low, m.row.ci_high, m.row.ci_of) == (window_p50s[0], window_p50s[-1], "p50_ms")
    assert m.row.valid and m.row.windows == 6 and m.row.first_call_ms == 2.0
    assert m.samples["kept"].tolist() == [True] * 180 + [False] * 30 and len(m.samples["latency_ms"]) == 210

    # Windows that disagree make the row invalid, and so do too few calls for a p99.
    drifting = [_window([1.0 + i] * 30) for i in range(6)]
    row = latency_measurement(_work(), "sim-cpu0", "device", 2.0, drifting, [False] * 6, WINDOWS).row
    assert not row.valid and "windows disagree: the p50 interval 1 to 6" in row.invalid_reason
    row = latency_measurement(_work(), "sim-cpu0", "end_to_end", 2.0, timed[:6], [False] * 6, WINDOWS).row
    assert row.valid and row.cpu_share is None
    few = [_window([1.0] * 10) for _ in range(6)]
    row = latency_measurement(_work(), "sim-cpu0", "device", 2.0, few, [False] * 6, WINDOWS).row
    assert row.invalid_reason == "p99 from 60 samples (it needs at least 100)"


def test_a_latency_row_bounds_its_own_p50_whatever_its_windows_hold() -> None:
    """Windows hold what their calls' pace allows: on a loaded machine two fast windows held 100
    times the calls of each slow one. Pooled, the fast calls are the p50 (1 ms), below the third
    window p50 (5 ms) that bounds the median of twelve: the row's p50 is that median, so its
    interval holds it; p95 and p99 still pool the calls."""
    fast, slow = [_window([1.0] * 1000) for _ in range(2)], [_window([4.0 + i] * 10) for i in range(1, 11)]
    windows = Windows(count=12, seconds=0.1, min_iterations=5, max_spread=0.25)
    row = latency_measurement(_work(), "sim-cpu0", "device", 2.0, fast + slow, [False] * 12, windows).row
    assert (row.ci_low, row.ci_high) == (5.0, 12.0) and json.loads(row.detail)["ci_ranks"] == [3, 10]
    assert row.ci_low <= row.p50_ms <= row.ci_high and row.p50_ms == 8.5  # the median of 1, 1, 5, 6, ..., 14
    assert (row.p95_ms, row.p99_ms) == tuple(quantiles(np.concatenate([t.times_ms for t in fast + slow]), [0.95, 0.99]))
    ws = [t.times_ms for t in fast + slow]
    assert latency_percentiles(window_p50s(ws), np.concatenate(ws)) == (row.p50_ms, row.p95_ms, row.p99_ms)
    assert not row.valid and "windows disagree" in row.invalid_reason


def _card(label: str) -> BenchCard:
    return Placed(None, described(label))


def _rounds(one: list[float], two: list[float], shares: float = 1.0) -> list[Round]:
    """Rounds of a 1-card and a 2-card window of 1 s, each card of the pair at half the total."""

    def share(rate: float) -> Throughput:
        return Throughput(calls=int(rate), decisions=int(rate), elapsed_s=1.0, cpu_s=shares)

    return [
        Round(i, {1: [share(a)], 2: [share(b / 2), share(b / 2)]}, False)
        for i, (a, b) in enumerate(zip(one, two, strict=True))
    ]


def test_scaling_rows_pair_each_round_and_refuse_an_efficiency_above_one() -> None:
    cards = [_card("sim-cpu0"), _card("sim-cpu1")]
    one = [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1000.0]
    two = [1900.0, 1910.0, 1880.0, 1890.0, 1900.0, 1880.0]
    k1, k2 = (m.row for m in scaling_measurements(_work(), cards, [1, 2], _rounds(one, two), WINDOWS, 1.0))
    assert k1.valid and k2.valid and k1.scaling_efficiency == 1.0 and k1.scaling_ci_low is None
    per_round = sorted(b / (2 * a) for a, b in zip(one, two, strict=True))
    assert k2.scaling_efficiency == pytest.approx(float(np.median(per_round)))
    assert (k2.scaling_ci_low, k2.scaling_ci_high) == (pytest.approx(per_round[0]), pytest.approx(per_round[-1]))
    assert k2.decisions_per_s == 1895.0 and k2.device == "sim-cpu0,sim-cpu1" and k2.cpu_share == 1.0

    # Every 2-card round above twice its 1-card round: impossible, so never a result.
    above = scaling_measurements(
        _work(), cards, [1, 2], _rounds(one, [2100.0, 2120.0, 2090.0, 2110.0, 2100.0, 2090.0]), WINDOWS, 1.0
    )
    row = above[1].row
    assert not row.valid and "lies above 1, which k cards cannot reach" in row.invalid_reason
    assert row.scaling_ci_low is not None and row.scaling_ci_low > 1

    # Rounds in which the cards were starved, with no clean ones to replace them.
    starved_rounds = [Round(r.index, r.windows, True) for r in _rounds(one, one)]
    row = scaling_measurements(_work(), cards, [1, 2], starved_rounds, WINDOWS, 1.0)[1].row
    assert not row.valid and "cards starved: 6 of 6 windows" in row.invalid_reason
