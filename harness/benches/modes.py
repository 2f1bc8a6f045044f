"""A bench mode: how it measures, the rules its rows answer to, and its share of the progress
bar. The driver runs the registered modes (harness/benches/registry.py) in order, judges each
measurement by its mode's rules and writes the rows; it knows no mode's insides."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic

from tqdm import tqdm

from harness.benches.rows import BenchResult, M, Measurement, judged
from harness.benches.rules import Rule
from harness.benches.windows import Windows
from harness.benches.work import Loop, Work
from harness.config.command_plan import BenchPlan
from harness.cluster.place import BenchCard


@dataclass(frozen=True)
class Bench:
    """What every mode measures with: the placed cards, the card counts (`steps`) of throughput
    and the server, the work, the closed loops, the options, how windows run, the progress bar."""

    cards: list[BenchCard]
    steps: list[int]
    work: list[Work]
    loops: list[Loop]
    plan: BenchPlan
    windows: Windows
    bar: tqdm


@dataclass(frozen=True)
class Mode(Generic[M]):
    name: str  # bench.mode of its rows, and its phase in runs.summary.timings_s
    # Its measurements, given the bench and what the modes before it measured, in order.
    measure: Callable[[Bench, Sequence[Measurement]], list[M]]
    rules: Sequence[Rule[M]]
    steps: Callable[[Bench], int]  # how many times it advances the progress bar

    def results(self, measured: list[M]) -> list[BenchResult]:
        return [judged(m, self.rules) for m in measured]
