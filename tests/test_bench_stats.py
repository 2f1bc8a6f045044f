"""The bench's statistics and rules, on hand-made samples, without Ray: percentiles as DuckDB reads
them, intervals from order statistics, every validity rule (each with a case it must fail),
Poisson arrivals."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest

from harness.judge.bench_stats import (
    MIN_WINDOWS,
    Interval,
    efficiency_above_one,
    fewest_samples,
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
    windows_disagree,
)
from harness.workloads import poisson_arrivals


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


def test_the_fewest_samples_for_an_interval() -> None:
    assert MIN_WINDOWS == fewest_samples(0.5) == 6
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
