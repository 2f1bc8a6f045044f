"""How every windowed measurement runs (docs/bench.md, "Windows"): a count of windows, each long enough
and holding enough calls; windows a starved card ran are measured again; a figure is the median
of the kept windows' figures with its interval; and the rules every windowed row answers to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Generic, TypeVar

import numpy as np

from harness.inference.timing import ClosedLoop, LatencyWindow
from harness.judge.bench_stats import (
    Interval,
    is_starved,
    median_interval,
    quick_look,
    starved,
    too_few_iterations,
    too_few_windows,
    windows_disagree,
)
from harness.benches.rules import Rule
from harness.config.command_plan import BenchPlan
from harness.cluster.place import BenchCard

W = TypeVar("W")
M = TypeVar("M")


@dataclass(frozen=True)
class Windows:
    """How every measurement runs: `count` windows, each at least `seconds` long and holding at
    least `min_iterations` calls; `quick` for a quick look (one window, never a valid row)."""

    count: int
    seconds: float
    min_iterations: int
    max_spread: float
    quick: bool = False

    @classmethod
    def of(cls, plan: BenchPlan) -> Windows:
        if plan.duration is not None:
            return cls(1, plan.duration, plan.min_iterations, plan.max_spread, quick=True)
        return cls(plan.windows, plan.window, plan.min_iterations, plan.max_spread)

    def disagree(self, median: float, interval: Interval | None, what: str) -> str | None:
        return windows_disagree(median, interval, self.max_spread, what) if interval else None


@dataclass(frozen=True)
class WindowRuns(Generic[W]):
    """The windows of one measurement, `bad` marking those a starved card ran, and those its
    figures come from."""

    timed: list[W]
    bad: list[bool]
    windows: Windows

    @cached_property
    def kept(self) -> list[bool]:
        return kept_windows(self.bad, self.windows.count)

    @cached_property
    def used(self) -> list[W]:
        return [t for t, k in zip(self.timed, self.kept, strict=True) if k]


@dataclass(frozen=True)
class Tally:
    """What a row's windows were: how many measured, how many clean (no card starved), and the
    calls of each kept one."""

    windows: Windows
    clean: int
    measured: int
    calls: list[int]


def window_rules(tally: Callable[[M], Tally]) -> tuple[Rule[M], ...]:
    """The rules every windowed row answers to: enough windows (never a quick look), fed cards,
    enough calls in each window."""

    def enough_windows(m: M) -> str | None:
        w = tally(m).windows
        return quick_look(w.seconds) if w.quick else too_few_windows(w.count)

    def fed(m: M) -> str | None:
        t = tally(m)
        return starved(t.clean, t.measured, t.windows.count)

    def enough_calls(m: M) -> str | None:
        t = tally(m)
        return too_few_iterations(t.calls, t.windows.min_iterations)

    return (
        Rule("enough windows", enough_windows),
        Rule("cards fed", fed),
        Rule("enough calls per window", enough_calls),
    )


def starved_window(card: BenchCard, window: LatencyWindow | ClosedLoop) -> bool:
    """A window a simulated card on one core ran with less than its core measured the machine's load."""
    return card.one_core and is_starved(window.cpu_share)


def repeat_windows(measure: Callable[[int], list[W]], is_bad: Callable[[W], bool], wanted: int) -> list[W]:
    """`wanted` windows, then as many again as were bad, until `wanted` are good or `wanted`
    more have been measured: load that comes and goes costs time, not validity."""
    got = measure(wanted)
    while (more := min(wanted - sum(not is_bad(w) for w in got), 2 * wanted - len(got))) > 0:
        got += measure(more)
    return got


def kept_windows(bad: list[bool], wanted: int) -> list[bool]:
    """The windows a row's figures come from: the good ones where there are enough of them,
    else all (and the row is invalid: `starved`)."""
    if bad.count(False) >= wanted:
        return [not b for b in bad]
    return [True] * len(bad)


def median_of_windows(values: list[float], windows: Windows) -> tuple[float, Interval | None]:
    """The median of the windows' figures and its 95% interval (none for a quick look)."""
    return float(np.median(values)), None if windows.quick else median_interval(np.asarray(values))
