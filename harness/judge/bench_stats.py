"""The statistics of `harness bench`: percentiles as the SQL reads them, distribution-free
intervals from order statistics (scipy's), and the rules that make a bench row valid. Samples
in, figures and reasons out; nothing here knows Ray, a card or a clock.

A row's figure is the median of its kept windows' figures (or the p99 of one server trial), and
its interval holds that figure with at least 95% confidence; a latency row's p95 and p99 pool
every call of its kept windows. Percentiles interpolate linearly between order statistics:
numpy's default and DuckDB's `quantile_cont`, so `bench_samples` gives back each row's figures
in SQL. The interval comes from the binomial law of order statistics: no
assumption on the shape of the distribution, only that windows (or calls) are independent
draws, which the agreement rule checks as far as it can.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

CONFIDENCE = 0.95
QUANTILE_METHOD: Final = "linear"  # numpy's default; DuckDB's quantile_cont and median
# A simulated card on one thread is one process that wants one core: in a window where it got
# less than this share of a core, something else ran there (another card, the driver, other work
# on the machine), and the window measured the machine's load, not the card.
STARVED_SHARE = 0.9
# The Ray round trip dominates a call where the card's own time is under this share of the
# end-to-end time.
DEVICE_SHARE_HOST_BOUND = 0.5


@dataclass(frozen=True)
class Interval:
    """[low, high] = [x_(lower), x_(upper)] of the sorted values: holds the quantile with at
    least `coverage` probability."""

    low: float
    high: float
    lower: int  # 1-based ranks in the sorted values
    upper: int
    coverage: float


def quantiles(samples: np.ndarray, qs: list[float]) -> list[float]:
    """Percentiles by the same definition as DuckDB's quantile_cont."""
    values = np.quantile(np.asarray(samples, dtype=np.float64), np.asarray(qs, dtype=np.float64), method=QUANTILE_METHOD)
    return [float(v) for v in values]


def latency_percentiles(p50s: Sequence[float], pooled_ms: np.ndarray) -> tuple[float, float, float]:
    """A latency row's p50, p95 and p99 from its kept windows' own p50s (`window_p50s`) and their
    calls pooled. The p50 is the row's figure: the median of the windows' p50s, the statistic
    their interval bounds. Pooled, a window counts by its calls, and on a loaded machine a fast
    window holds many times the calls of a slow one: the pooled p50 then follows the fast windows,
    out of the interval. A p99 needs more calls than a window holds: p95 and p99 pool them."""
    p95, p99 = quantiles(pooled_ms, [0.95, 0.99])
    return float(np.median(p50s)), p95, p99


def window_p50s(windows_ms: Sequence[np.ndarray]) -> list[float]:
    return [quantiles(times, [0.5])[0] for times in windows_ms]


def order_statistic_ranks(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int, int, float] | None:
    """The ranks (lower, upper) of the equal-tailed distribution-free interval of the q-quantile
    from n independent samples, and its exact coverage; None when n is too few for one.

    The population's q-quantile lies below x_(l) when fewer than l samples fall under it, which
    has probability P(B <= l - 1) for B ~ Binomial(n, q); l is the largest rank that keeps this
    tail within (1 - confidence) / 2, u the smallest that keeps the other: the ranks whose values
    `scipy.stats.quantile_test(...).confidence_interval()` returns. For the median at 95% that
    takes 6 samples ([x_(1), x_(6)], 96.9%); for p99, 368.
    """
    if n < 1:
        return None
    # scipy.stats is imported where needed: a sweep's summary imports this module, and the sweep
    # takes scipy.stats on a thread of its own (harness/judge/imports.py).
    from scipy.stats import binom

    alpha = (1.0 - confidence) / 2.0
    law = binom(n, q)
    lower, upper = int(law.ppf(alpha)), int(law.isf(alpha)) + 1
    if lower < 1 or upper > n:
        return None
    return lower, upper, float(law.cdf(upper - 1) - law.cdf(lower - 1))


def quantile_interval(values: np.ndarray, q: float, confidence: float = CONFIDENCE) -> Interval | None:
    """scipy's interval of the q-quantile; None where one of its ends falls outside the values
    (scipy leaves that end open), as a row without an interval is no result."""
    ranks = order_statistic_ranks(len(values), q, confidence)
    if ranks is None:
        return None
    from scipy.stats import quantile_test

    ci = quantile_test(np.asarray(values, dtype=np.float64), p=q).confidence_interval(confidence)
    lower, upper, coverage = ranks
    return Interval(float(ci.low), float(ci.high), lower, upper, coverage)


def median_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> Interval | None:
    return quantile_interval(values, 0.5, confidence)


@functools.cache
def fewest_samples(q: float, confidence: float = CONFIDENCE) -> int:
    """The fewest samples whose order statistics bound the q-quantile at `confidence`."""
    n = 1
    while order_statistic_ranks(n, q, confidence) is None:
        n += 1
    return n


def round_efficiencies(one_card: np.ndarray, k_cards: np.ndarray, k: int) -> np.ndarray:
    """Scaling efficiency of each round: tput(k) / (k * tput(1)), the two windows of a round run
    back to back so that load that comes and goes falls on both."""
    return np.asarray(k_cards, dtype=np.float64) / (k * np.asarray(one_card, dtype=np.float64))


def is_starved(cpu_share: float) -> bool:
    return cpu_share < STARVED_SHARE


def round_trip_dominates(device_ms: float, end_to_end_ms: float) -> bool:
    return device_ms < DEVICE_SHARE_HOST_BOUND * end_to_end_ms


# ---- validity: each rule gives its reason, or None where the row meets it -------------------


def too_few_windows(wanted: int) -> str | None:
    fewest = fewest_samples(0.5)  # 6
    if wanted >= fewest:
        return None
    return f"{wanted} windows: a {CONFIDENCE:.0%} interval of their median needs at least {fewest}"


def starved(kept: int, measured: int, wanted: int) -> str | None:
    """Windows in which a simulated card was starved are measured again, up to as many more; the
    row is valid only when enough windows gave every card its core."""
    if kept >= wanted:
        return None
    return (
        f"cards starved: {measured - kept} of {measured} windows gave a card under {STARVED_SHARE:.0%} of a core, "
        f"{kept} kept of {wanted} wanted"
    )


def too_few_iterations(calls: list[int], minimum: int) -> str | None:
    short = [c for c in calls if c < minimum]
    if not short:
        return None
    return f"{len(short)} of {len(calls)} windows held fewer than {minimum} iterations (fewest {min(short)})"


def too_few_for_percentile(n: int, q: float) -> str | None:
    """A percentile from fewer than 1 / (1 - q) samples is the largest sample, not a percentile."""
    needed = math.ceil(round(1.0 / (1.0 - q), 9))
    if n >= needed:
        return None
    return f"p{q * 100:g} from {n} samples (it needs at least {needed})"


def too_few_for_interval(n: int, q: float) -> str | None:
    """A figure is a result only with an interval: its p_q needs `fewest_samples(q)` samples."""
    needed = fewest_samples(q)
    if n >= needed:
        return None
    return f"p{q * 100:g} from {n} samples has no {CONFIDENCE:.0%} interval (it needs at least {needed})"


def windows_disagree(median: float, interval: Interval, max_spread: float, what: str) -> str | None:
    """Windows that disagree by more than `max_spread` of their median measured a machine that
    changed under them, not one figure."""
    spread = (interval.high - interval.low) / median if median > 0 else math.inf
    if spread <= max_spread:
        return None
    return (
        f"windows disagree: the {what} interval {interval.low:.4g} to {interval.high:.4g} spans {spread:.0%} of the "
        f"median, above the {max_spread:.0%} bound"
    )


def efficiency_above_one(interval: Interval) -> str | None:
    """k cards cannot do more than k times one card's work: an interval wholly above 1 says the
    one-card windows were slowed by something the k-card windows were not."""
    if interval.low <= 1.0:
        return None
    return (
        f"scaling efficiency interval {interval.low:.3f} to {interval.high:.3f} lies above 1, which k cards cannot "
        "reach: the 1-card windows were slowed by something else"
    )


QUICK_LOOK = "quick look"


def quick_look(duration_s: float) -> str:
    return f"{QUICK_LOOK} (--duration {duration_s:g}): one window, no interval"


def invalid_reason(reasons: Iterable[str | None]) -> str:
    """The rules a row failed, joined; empty for a valid row."""
    return "; ".join(r for r in reasons if r)
