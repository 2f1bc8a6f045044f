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

The interval is the percentile bootstrap, expanded for small samples as Hesterberg (2015, "What
teachers should know about the bootstrap") recommends: its level is raised until the normal
quantile equals sqrt(n / (n - 1)) times Student's t of n - 1 degrees of freedom, which undoes the
plain percentile interval's narrowness at a few dozen episodes. It is seeded (BOOTSTRAP_SEED), so
a row is the same every time its returns are. Fewer than MIN_EPISODES pairs give no statistical
answer at all: in simulation (`python -m benchmarks closed_loop_rule`) 4 to 12 episodes of
bimodal returns failed honest cards up to 0.5% of the time even so.
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
# Pairs below which no interval is trusted: INCONCLUSIVE, unless an exact answer applies.
MIN_EPISODES = 20
# The default margin: half of the environment's per-episode standard deviation. With 100 paired
# episodes an honest card passes about 9 times in 10, and a card that loses one standard
# deviation fails about 9 times in 10 (README, "Closed-loop returns").
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


def decide(
    difference: Interval, margin: float, n: int, fixed_half_width: float = 0.0, min_episodes: int = MIN_EPISODES
) -> Decision:
    """PASS, FAIL or INCONCLUSIVE for `difference` (of `n` episodes) against `-margin`.
    `fixed_half_width` is a part of the interval more episodes cannot shrink (a published mean's
    own uncertainty); `min_episodes` other than MIN_EPISODES only to measure what it guards against."""
    shown = f"difference {difference} against -{margin:.4g}"
    if n < min_episodes:
        needed: int | None = max(min_episodes, _needed(difference, margin, n, fixed_half_width) or min_episodes)
        reason = f"{n} episodes are fewer than the {min_episodes} an interval needs ({shown})"
        return Decision(Outcome.INCONCLUSIVE, difference, margin, needed, reason)
    if difference.low > -margin:
        return Decision(Outcome.PASS, difference, margin, None, f"{shown}: the card loses less than the margin")
    if difference.high < -margin:
        return Decision(Outcome.FAIL, difference, margin, None, f"{shown}: it loses more than the margin")
    needed = _needed(difference, margin, n, fixed_half_width)
    more = f"about {needed} episodes would decide" if needed else "no number of episodes decides: it sits on the margin"
    return Decision(Outcome.INCONCLUSIVE, difference, margin, needed, f"{shown} straddles the margin; {more}")


def _needed(difference: Interval, margin: float, n: int, fixed: float) -> int | None:
    """Episodes whose interval, shrinking as 1 / sqrt(n), would clear -margin on the side the
    estimate lies, the part more episodes cannot shrink (`fixed`) apart."""
    gap = abs(difference.estimate + margin)
    half = difference.estimate - difference.low if difference.estimate > -margin else difference.high - difference.estimate
    ours = math.sqrt(max(half**2 - fixed**2, 0.0))
    room = gap**2 - fixed**2
    if room <= 0 or ours == 0:
        return None
    return max(n + 1, math.ceil(n * ours**2 / room))


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
    return_margin: float  # PASS when return_diff_low > -return_margin, FAIL when return_diff_high < -return_margin
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
            return_margin=decision.margin,
            episodes_needed=decision.episodes_needed,
            published_std=published_std,
            detail=detail,
        )
