"""Closed-loop returns judged as distributions: is the card's return worse than the CPU's by more
than a margin? Pure numpy and scipy.

A card that is not bit-equal to the CPU (every real one) parts from the CPU's trajectory in a
chaotic environment a few hundred steps after a one-ULP difference; from there its return and
the CPU's are two draws of one distribution, and a rule on the means (5% apart) fails honest
ports. So every card episode is paired with the CPU episode of the same seed, and the question
is one of non-inferiority (as in clinical trials, and as rliable reports RL returns: intervals,
never bare means): the 95% interval of the mean paired difference (card - CPU) against a margin
`delta` that says how much loss matters:

    PASS          the interval lies above -delta: the card loses less than delta
    FAIL          it lies below -delta: the card loses more than delta
    INCONCLUSIVE  it straddles -delta: these episodes cannot tell; the row says how many would

Exact answers come first, with no statistics: returns identical in every episode pass (CartPole
at 500, a card bit-equal to the CPU); where the CPU's return never varies, any difference fails
(an environment that is not chaotic for this policy, where an honest card plays the CPU's
episodes); a return that is not finite fails.

The interval of the paired difference is Student's t. An honest card's differences are symmetric
about zero (per seed, card and CPU are two draws of one distribution, either one as likely to be
the better), and under that symmetry the t statistic's tails at the usual levels are no heavier
than normal theory's whatever the shape of the returns (Efron 1969, "Student's t-test under
symmetry conditions"): its coverage holds at a few episodes, where the bootstrap's does not. So
there is no minimum of episodes, and a loss far beyond the margin FAILs at 5. A FAIL also needs a
loss at all beyond doubt at FAIL_LEVEL (the t interval's one-sided upper bound at 1 - FAIL_LEVEL
below zero): with the 95% interval alone honest cards failed one time in 200 at 5 episodes, since
at so few its width, not the margin, is what stands between an honest card and a FAIL. With it,
an honest card FAILs about one time in 10,000 (`python -m benchmarks.closed_loop_rule`).

Each side's own mean and IQM keep the percentile bootstrap (`interval`), expanded for small
samples as Hesterberg (2015, "What teachers should know about the bootstrap") recommends: its
level is raised until the normal quantile equals sqrt(n / (n - 1)) times Student's t of n - 1
degrees of freedom. It is seeded (BOOTSTRAP_SEED), so a row is the same every time its returns are.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
BOOTSTRAP_SEED = 0
# FAIL also needs a loss at all beyond doubt at this one-sided level: about how often an honest
# card, whose paired differences are symmetric about zero, FAILs at any number of episodes. At 3
# to 5 episodes of two far modes (a lander's landings and crashes) it is up to 1 in 1300 (every
# card episode in one mode, every CPU one in the other: no rule tells that from a loss); 1 in
# 1000 here would fail those honest cards up to 1 in 270 (at 3 episodes, simulated).
FAIL_LEVEL = 0.0001
# The 95% interval's upper quantile.
_UPPER = 0.5 + CONFIDENCE / 2
# The default margin: half of the environment's per-episode standard deviation. With 100 paired
# episodes an honest card passes about 9 times in 10, and a card that loses one standard
# deviation fails about 9 times in 10 (docs/verdicts.md, "Closed-loop returns").
DEFAULT_SD_FRACTION = 0.5
# IQM: the mean of the middle half (rliable's interquartile mean), trimming a quarter each side.
IQM_TRIM = 0.25
_MARGIN = re.compile(r"^\s*(?P<number>[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(?P<sd>std)?\s*$")


class Outcome(StrEnum):
    """A closed-loop verdict (the `outcome` column)."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Margin:
    """How much lost return matters: `fraction` of the environment's spread, or an absolute return."""

    fraction: float | None = DEFAULT_SD_FRACTION
    absolute: float | None = None

    @staticmethod
    def parse(text: str) -> Margin:
        """`0.5std` (a fraction of the spread) or `12.5` (a return). ValueError otherwise."""
        match = _MARGIN.match(text.lower())
        if not match:
            raise ValueError(f"{text!r} is neither a return (e.g. 10) nor a fraction of the spread (e.g. 0.5std)")
        number = float(match.group("number"))
        if not math.isfinite(number):
            raise ValueError(f"{text!r}: the margin must be a finite number")
        return Margin(fraction=number) if match.group("sd") else Margin(fraction=None, absolute=number)

    def of(self, spread: float) -> float:
        if self.absolute is not None:
            return self.absolute
        return (self.fraction or 0.0) * spread

    def describe(self, spread: float, source: str) -> str:
        if self.absolute is not None:
            return f"margin {self.absolute:.4g} (--return-margin)"
        return f"margin {self.of(spread):.4g} = {self.fraction:g} x {source} {spread:.4g}"


@dataclass(frozen=True)
class Interval:
    """A statistic and its 95% interval."""

    estimate: float
    low: float
    high: float

    @staticmethod
    def exact(value: float) -> Interval:
        return Interval(value, value, value)

    def __str__(self) -> str:
        return f"{self.estimate:.4g} [{self.low:.4g}, {self.high:.4g}]"


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """The interquartile mean along `axis`."""
    from scipy.stats import trim_mean

    return np.asarray(trim_mean(values, IQM_TRIM, axis=axis))


def mean(values: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(np.mean(values, axis=axis))


def expanded_level(n: int, confidence: float = CONFIDENCE) -> float:
    """The percentile bootstrap's level for `n` values whose interval covers as `confidence` should."""
    from scipy.stats import norm, t

    if n < 2:
        return confidence
    z = math.sqrt(n / (n - 1)) * float(t.ppf(0.5 + confidence / 2, n - 1))
    return float(2 * norm.cdf(z) - 1)


def interval(values: np.ndarray, statistic: Callable[..., np.ndarray] = mean) -> Interval:
    """`statistic` of `values` with its expanded-percentile bootstrap interval (exact when the
    values do not vary, or there is one)."""
    values = np.asarray(values, dtype=np.float64)
    estimate = float(statistic(values))
    if values.size < 2 or np.all(values == values[0]):
        return Interval.exact(estimate)
    from scipy.stats import bootstrap

    result = bootstrap(
        (values,),
        statistic,
        n_resamples=RESAMPLES,
        confidence_level=expanded_level(values.size),
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
        batch=max(1, 2**22 // values.size),  # resamples held at once: at most 32 MiB of them
    )
    ci = result.confidence_interval
    return Interval(estimate, float(ci.low), float(ci.high))


def t_interval(values: np.ndarray, sd_floor: float = 0.0) -> Interval:
    """The mean of `values` with its Student-t 95% interval, their standard deviation taken as at
    least `sd_floor` (a spread known beforehand, which a few values that happen to agree must
    not narrow). Exact when the spread is zero; unbounded for one value, which has no spread."""
    values = np.asarray(values, dtype=np.float64)
    estimate = float(np.mean(values))
    if values.size < 2:
        return Interval(estimate, -math.inf, math.inf)
    sd = max(float(np.std(values, ddof=1)), sd_floor)
    if sd == 0:
        return Interval.exact(estimate)
    half = _t(values.size, _UPPER) * sd / math.sqrt(values.size)
    return Interval(estimate, estimate - half, estimate + half)


def _t(n: int, level: float) -> float:
    """Student's t quantile of n - 1 degrees of freedom (scipy.special's, a hundred times quicker
    than scipy.stats.t.ppf: `_needed` asks for dozens)."""
    from scipy.special import stdtrit

    return float(stdtrit(n - 1, level))


def _doubt(n: int) -> float:
    """How much wider the t interval's upper half is at 1 - FAIL_LEVEL than at 95%, for `n` values."""
    return _t(n, 1 - FAIL_LEVEL) / _t(n, _UPPER)


@dataclass(frozen=True)
class Decision:
    """What the interval of a difference says against the margin."""

    outcome: Outcome
    difference: Interval
    margin: float
    episodes_needed: int | None
    """INCONCLUSIVE: how many episodes would likely decide, from the observed spread; None when
    no number would (the difference sits on the margin) or the answer is decided."""
    reason: str


def outcome(difference: Interval, margin: float, n: int) -> Outcome:
    """The rule alone: PASS where `difference` (a 95% interval of `n` episodes, shaped as
    Student's t) lies above `-margin`; FAIL where it lies below and its upper half, widened from
    95% to 1 - FAIL_LEVEL as Student's t widens, ends below zero too (a loss at all beyond doubt);
    INCONCLUSIVE otherwise."""
    if difference.low > -margin:
        return Outcome.PASS
    if difference.high < -margin and fail_bound(difference, n) < 0:
        return Outcome.FAIL
    return Outcome.INCONCLUSIVE


def decide(difference: Interval, margin: float, n: int, fixed_half_width: float = 0.0) -> Decision:
    """The `outcome` of `difference` against `-margin`, with its reason and, undecided, the
    episodes that would decide. `fixed_half_width` is a part of the interval more episodes cannot
    shrink (a published mean's own uncertainty)."""
    shown = f"difference {difference} against -{margin:.4g}"
    decided = outcome(difference, margin, n)
    if decided is Outcome.PASS:
        return Decision(decided, difference, margin, None, f"{shown}: the card loses less than the margin")
    if decided is Outcome.FAIL:
        return Decision(decided, difference, margin, None, f"{shown}: it loses more than the margin")
    needed = _needed(difference, margin, n, fixed_half_width)
    if difference.high < -margin:
        more = f"about {needed} episodes would decide" if needed else "no number of episodes decides"
        doubt = f"at {n} episodes a loss at all is not beyond doubt (1 in {1 / FAIL_LEVEL:.0f})"
        reason = f"{shown} lies below the margin, but {doubt}; {more}"
    else:
        more = f"about {needed} episodes would decide" if needed else "no number of episodes decides: it sits on the margin"
        reason = f"{shown} straddles the margin; {more}"
    return Decision(decided, difference, margin, needed, reason)


def fail_bound(difference: Interval, n: int) -> float:
    """The one-sided upper bound at 1 - FAIL_LEVEL of `difference`, a 95% interval of `n`
    episodes shaped as Student's t: a FAIL needs it below zero. Unbounded below 2 episodes."""
    return _fail_bound(difference.estimate, difference.high - difference.estimate, n)


def _fail_bound(estimate: float, half: float, n: int) -> float:
    """The bound from the 95% interval's upper `half`, widened as Student's t widens."""
    if half == 0:
        return estimate
    return estimate + half * _doubt(n) if n > 1 else math.inf


# Past this many episodes "about N would decide" is no longer an answer.
_MOST_NEEDED = 10**9


def _needed(difference: Interval, margin: float, n: int, fixed: float) -> int | None:
    """The fewest episodes whose interval would decide on the side the estimate lies: its part
    more episodes can shrink (all but `fixed`) shrinking as Student's t quantile over sqrt(n).
    None where none would (the estimate on the margin, `fixed` alone too wide) or n < 2."""
    failing = difference.estimate < -margin
    half = difference.high - difference.estimate if failing else difference.estimate - difference.low
    ours = math.sqrt(max(half**2 - fixed**2, 0.0))
    if n < 2 or not math.isfinite(ours) or ours == 0 or fixed >= abs(difference.estimate + margin):
        return None

    def decided(k: int) -> bool:
        at = math.hypot(ours * math.sqrt(n / k) * _t(k, _UPPER) / _t(n, _UPPER), fixed)
        return at < abs(difference.estimate + margin) and not (failing and _fail_bound(difference.estimate, at, k) >= 0)

    low, high = n, n + 1
    while not decided(high):  # doubling, then halving: the first count that decides
        if high > _MOST_NEEDED:
            return None
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if decided(middle) else (middle, high)
    return high


@dataclass(frozen=True)
class ReturnComparison:
    """Closed-loop returns against a reference, as distributions (`harness.judge.returns`):
    episode_return (a card, paired with the CPU float32's episodes of the same seeds) and
    published_return (the CPU float32's against the published score)."""

    passed: bool
    n_elements: int  # episodes judged
    outcome: str  # pass, fail, inconclusive
    return_a: float  # mean return of the card (published_return: of the CPU float32)
    return_a_low: float
    return_a_high: float
    iqm_a: float  # its interquartile mean
    iqm_a_low: float
    iqm_a_high: float
    return_b: float  # mean return of the CPU float32 (published_return: the published mean)
    return_b_low: float
    return_b_high: float
    iqm_b: float | None  # None for a published score
    iqm_b_low: float | None
    iqm_b_high: float | None
    return_diff: float  # a - b: the mean paired difference (episode_return)
    return_diff_low: float
    return_diff_high: float
    return_diff_fail_high: float | None  # its one-sided upper bound at 1 - FAIL_LEVEL (None in rows before it)
    # PASS: return_diff_low > -return_margin; FAIL: return_diff_high < -return_margin and return_diff_fail_high < 0
    return_margin: float
    episodes_needed: int | None
    published_std: float | None
    detail: str
    episode_seed: int | None = None
    """episode_return: the first episode whose trajectory parts from the CPU's; None when none does."""
    first_divergent_step: int | None = None

    def over_limit(self) -> float:
        """How far the interval reaches below zero, in margins: PASS below 1."""
        loss = max(0.0, -float(self.return_diff_low))
        if self.return_margin:
            return loss / float(self.return_margin)
        return 0.0 if self.outcome == Outcome.PASS else float("inf")

    @staticmethod
    def of(
        decision: Decision,
        n: int,
        a: tuple[Interval, Interval],
        b: tuple[Interval, Interval | None],
        published_std: float | None,
        detail: str,
    ) -> ReturnComparison:
        (mean_a, iqm_a), (mean_b, iqm_b) = a, b
        d = decision.difference
        return ReturnComparison(
            passed=decision.outcome is Outcome.PASS,
            n_elements=n,
            outcome=str(decision.outcome),
            return_a=mean_a.estimate,
            return_a_low=mean_a.low,
            return_a_high=mean_a.high,
            iqm_a=iqm_a.estimate,
            iqm_a_low=iqm_a.low,
            iqm_a_high=iqm_a.high,
            return_b=mean_b.estimate,
            return_b_low=mean_b.low,
            return_b_high=mean_b.high,
            iqm_b=None if iqm_b is None else iqm_b.estimate,
            iqm_b_low=None if iqm_b is None else iqm_b.low,
            iqm_b_high=None if iqm_b is None else iqm_b.high,
            return_diff=d.estimate,
            return_diff_low=d.low,
            return_diff_high=d.high,
            return_diff_fail_high=fail_bound(d, n),
            return_margin=decision.margin,
            episodes_needed=decision.episodes_needed,
            published_std=published_std,
            detail=detail,
        )
