"""The throughput mode: k cards at once, in rounds. In each round the first k cards run the same
batch at once for one window, for every k of the card counts; a row per card count gives the
median over kept rounds of the k cards' summed decisions/s, and the scaling efficiency as the
median over kept rounds of tput(k) / (k * tput(1)) in that round."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import ray
from tqdm import tqdm

from harness.inference.timing import Throughput
from harness.judge.bench_stats import Interval, efficiency_above_one, is_starved, round_efficiencies
from harness.outputs import Outputs
from harness.benches.modes import Bench, Mode
from harness.benches.rows import BenchResult, Figures, Measurement, RowKey, Sampled, Summary, sample_columns
from harness.benches.rules import Rule
from harness.benches.windows import Tally, Windows, kept_windows, median_of_windows, repeat_windows, window_rules
from harness.benches.work import Work
from harness.cluster.place import BenchCard

# A schedule of throughput windows opens this long after it is sent, so every card starts at the same time.
START_DELAY_S = 0.1
# Between two windows of a schedule, on top of two calls: a card's last call overruns its window.
GAP_S = 0.02
# Throughput windows are sized to hold the minimum of calls at the warm-up's pace, with room to spare.
HEADROOM = 1.25


@dataclass(frozen=True)
class Round:
    """One round of throughput windows: for each card count k, the k cards' shares of its window."""

    index: int
    windows: dict[int, list[Throughput]]
    starved: bool


@dataclass(frozen=True)
class Rounds:
    """The rounds one batch ran on the first cards of `group`, windows of `seconds`."""

    work: Work
    group: list[BenchCard]
    steps: list[int]
    rounds: list[Round]
    windows: Windows
    seconds: float

    @cached_property
    def kept(self) -> list[bool]:
        return kept_windows([r.starved for r in self.rounds], self.windows.count)

    @cached_property
    def used(self) -> list[Round]:
        return [r for r, k in zip(self.rounds, self.kept, strict=True) if k]

    @cached_property
    def totals(self) -> dict[int, list[float]]:
        """Each card count's decisions/s, summed over its cards, in each kept round."""
        return {k: [sum(t.decisions_per_s for t in r.windows[k]) for r in self.used] for k in self.steps}


@dataclass(frozen=True)
class CardCount:
    """What k cards at once did in the rounds of one batch."""

    rounds: Rounds
    k: int
    audited: tuple[Sampled, ...] = ()

    @property
    def windows(self) -> Windows:
        return self.rounds.windows

    @cached_property
    def decisions_per_s(self) -> tuple[float, Interval | None]:
        return median_of_windows(self.rounds.totals[self.k], self.windows)

    @cached_property
    def efficiency(self) -> tuple[float | None, Interval | None]:
        """The median round efficiency and its interval (none for one card); none without 1-card windows."""
        totals = self.rounds.totals
        if 1 not in totals:
            return None, None
        median, interval = median_of_windows(
            round_efficiencies(np.asarray(totals[1]), np.asarray(totals[self.k]), self.k).tolist(), self.windows
        )
        return median, interval if self.k > 1 else None

    @property
    def tally(self) -> Tally:
        r = self.rounds
        calls = [t.calls for round_ in r.used for t in round_.windows[self.k]]
        return Tally(self.windows, sum(not round_.starved for round_ in r.rounds), len(r.rounds), calls)

    def summary(self) -> Summary:
        r, k, w = self.rounds, self.k, self.rounds.work
        cards = r.group[:k]
        shares = [statistics.median(round_.windows[k][i].cpu_share for round_ in r.used) for i in range(k)]
        detail: dict[str, object] = {
            "window_s": round(r.seconds, 4),
            "input_sha256": w.batch.sha256,
            "rounds_measured": len(r.rounds),
            "per_card_decisions_per_s": [
                round(statistics.median(round_.windows[k][i].decisions_per_s for round_ in r.used), 1) for i in range(k)
            ],
            "per_card_cpu_share": [round(s, 3) for s in shares],
        }
        calls = sum(t.calls for round_ in r.used for t in round_.windows[k])
        tput, interval = self.decisions_per_s
        efficiency, scaling = self.efficiency
        figures = Figures(
            mean_ms=sum(t.elapsed_s for round_ in r.used for t in round_.windows[k]) / calls * 1e3,
            decisions_per_s=tput,
            scaling_efficiency=efficiency,
            windows=len(r.used),
            cpu_share=min(shares) if all(c.simulated for c in cards) else None,
        )
        key = RowKey(
            f"throughput/{w.policy}/{w.dtype}/b{w.batch.size}/k{k}",
            w.policy,
            w.dtype,
            w.batch.size,
            "throughput",
            "device",
            ",".join(c.label for c in cards),
            n_cards=k,
        )
        return Summary(key, figures, "decisions_per_s", interval, detail, scaling)

    def samples(self, row_id: str) -> dict[str, np.ndarray]:
        r, k = self.rounds, self.k
        cells = [(i, rd, c, t) for i, rd in enumerate(r.rounds) for c, t in zip(r.group[:k], rd.windows[k], strict=True)]
        return sample_columns(
            row_id,
            window_index=[rd.index for _, rd, _, _ in cells],
            device=[c.label for _, _, c, _ in cells],
            kept=[r.kept[i] for i, _, _, _ in cells],
            decisions_per_s=[t.decisions_per_s for _, _, _, t in cells],
            cpu_share=[t.cpu_share for _, _, _, t in cells],
        )

    def sampled(self) -> list[Sampled]:
        return list(self.audited)


def _efficiency_windows_agree(m: CardCount) -> str | None:
    efficiency, scaling = m.efficiency
    return m.windows.disagree(efficiency, scaling, "scaling efficiency") if efficiency is not None else None


def _efficiency_at_most_one(m: CardCount) -> str | None:
    scaling = m.efficiency[1]
    return efficiency_above_one(scaling) if scaling else None


RULES: tuple[Rule[CardCount], ...] = (
    *window_rules(lambda m: m.tally),
    Rule("windows agree", lambda m: m.windows.disagree(*m.decisions_per_s, "decisions/s")),
    Rule("scaling windows agree", _efficiency_windows_agree),
    Rule("efficiency at most one", _efficiency_at_most_one),
)


def scaling_measurements(
    w: Work, group: list[BenchCard], steps: list[int], rounds: list[Round], windows: Windows, seconds: float
) -> list[BenchResult]:
    """The rows of rounds measured elsewhere, one per card count."""
    every = Rounds(w, group, steps, rounds, windows, seconds)
    return MODE.results([CardCount(every, k) for k in steps])


def round_schedule(
    steps: list[int], n_rounds: int, first_round: int, seconds: float, gap_s: float
) -> list[tuple[int, int, float]]:
    """(round, k, start offset in seconds) of each window: rounds one after another, each with a
    window per card count, ascending in even rounds and descending in odd ones, so that load
    which grows or fades through a round falls on both sides of the ratio alike."""
    entries, offset = [], 0.0
    for r in range(first_round, first_round + n_rounds):
        for k in steps if r % 2 == 0 else steps[::-1]:
            entries.append((r, k, offset))
            offset += seconds + gap_s
    return entries


def measure(bench: Bench, _: Sequence[Measurement]) -> list[CardCount]:
    return measure_scaling(bench.cards, bench.steps, bench.work, bench.windows, bench.bar)


def measure_scaling(
    cards: list[BenchCard], steps: list[int], work: list[Work], windows: Windows, bar: tqdm
) -> list[CardCount]:
    """For each batch, rounds of windows: in each round the first k cards run the same batch at
    once for one window, for every k of `steps`."""
    measured = []
    for w in work:
        measured += _scaling(cards[: max(steps)], steps, w, windows)
        bar.update(len(steps))
    return measured


def _scaling(group: list[BenchCard], steps: list[int], w: Work, windows: Windows) -> list[CardCount]:
    obs, noise = ray.put(w.batch.obs), ray.put(w.batch.noise)  # one copy for all cards
    call_ms = max(ray.get([c.actor.warm_up(w.policy, w.dtype, obs, noise) for c in group]))
    seconds = max(windows.seconds, HEADROOM * windows.min_iterations * call_ms / 1e3)
    gap_s = GAP_S + 2 * call_ms / 1e3
    seen: list[Round] = []
    last: dict[str, Outputs] = {}

    def measure(n: int) -> list[Round]:
        got, outputs = _rounds(group, steps, w, obs, noise, n, len(seen), seconds, gap_s)
        seen.extend(got)
        last.update(outputs)
        return got

    every = Rounds(w, group, steps, repeat_windows(measure, lambda r: r.starved, windows.count), windows, seconds)
    top = max(steps)  # every card of the group ran its windows: its row carries their outputs to the audit
    audited = tuple(Sampled(c, w, last[c.label]) for c in group)
    return [CardCount(every, k, audited if k == top else ()) for k in steps]


def _rounds(
    group: list[BenchCard],
    steps: list[int],
    w: Work,
    obs: ray.ObjectRef,
    noise: ray.ObjectRef,
    n_rounds: int,
    first_round: int,
    seconds: float,
    gap_s: float,
) -> tuple[list[Round], dict[str, Outputs]]:
    """Run `n_rounds` rounds, every card given its own part of one schedule; with each card's
    last outputs."""
    entries = round_schedule(steps, n_rounds, first_round, seconds, gap_s)
    start = time.time() + START_DELAY_S
    mine = [[(r, k, start + offset) for r, k, offset in entries if k > i] for i in range(len(group))]
    results = ray.get(
        [
            c.actor.throughput(w.policy, w.dtype, obs, noise, [(at, seconds) for _, _, at in part])
            for c, part in zip(group, mine, strict=True)
        ]
    )
    shares: dict[tuple[int, int], list[Throughput]] = {}
    for part, (timed, _) in zip(mine, results, strict=True):
        for (r, k, _), t in zip(part, timed, strict=True):
            shares.setdefault((r, k), []).append(t)
    rounds = []
    for r in range(first_round, first_round + n_rounds):
        windows = {k: shares[r, k] for k in steps}
        bad = any(c.one_core and is_starved(t.cpu_share) for k in steps for c, t in zip(group, windows[k], strict=False))
        rounds.append(Round(r, windows, bad))
    return rounds, {c.label: last for c, (_, last) in zip(group, results, strict=True)}


MODE = Mode("throughput", measure, RULES, lambda b: len(b.work) * len(b.steps))
