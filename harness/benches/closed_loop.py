"""The closed-loop mode: episodes of each policy's environment in lockstep on card 0, one
forward per step; each window plays the same seeded episodes."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, partial

import numpy as np
import ray

from harness.inference.timing import ClosedLoop
from harness.judge.bench_stats import Interval
from harness.benches.modes import Bench, Mode
from harness.benches.rows import Figures, Measurement, RowKey, Sampled, Summary, sample_columns
from harness.benches.rules import Rule
from harness.benches.windows import (
    Tally,
    WindowRuns,
    Windows,
    median_of_windows,
    repeat_windows,
    starved_window,
    window_rules,
)
from harness.benches.work import Loop
from harness.cluster.place import BenchCard


@dataclass(frozen=True)
class Episodes(WindowRuns[ClosedLoop]):
    """The windows of one closed loop on one card."""

    loop: Loop
    card: BenchCard
    env_impl: str
    seed: int

    @cached_property
    def decisions_per_s(self) -> tuple[float, Interval | None]:
        return median_of_windows([t.decisions_per_s for t in self.used], self.windows)

    @property
    def tally(self) -> Tally:
        return Tally(self.windows, self.bad.count(False), len(self.timed), [t.steps for t in self.used])

    def summary(self) -> Summary:
        loop, card, used = self.loop, self.card, self.used
        returns = self.timed[0].returns
        detail: dict[str, object] = {
            "env_impl": self.env_impl,
            "env_id": loop.env.key,
            "episodes": len(returns),
            "first_seed": self.seed,
            "mean_return": float(returns.mean()),
            "min_return": float(returns.min()),
            "window_s": self.windows.seconds,
            "windows_measured": len(self.timed),
        }
        dps, interval = self.decisions_per_s
        figures = Figures(
            # a lockstep step: forward and env step
            mean_ms=sum(t.elapsed_s for t in used) / sum(t.steps for t in used) * 1e3,
            decisions_per_s=dps,
            windows=len(used),
            cpu_share=statistics.median(t.cpu_share for t in used) if card.simulated else None,
        )
        row_id = f"closed_loop/{loop.policy}/{loop.dtype}/b{loop.n_envs}/{card.label}"
        key = RowKey(row_id, loop.policy, loop.dtype, loop.n_envs, "closed_loop", "device", card.label)
        return Summary(key, figures, "decisions_per_s", interval, detail)

    def samples(self, row_id: str) -> dict[str, np.ndarray]:
        return sample_columns(
            row_id,
            window_index=list(range(len(self.timed))),
            device=[self.card.label] * len(self.timed),
            kept=self.kept,
            decisions_per_s=[t.decisions_per_s for t in self.timed],
            cpu_share=[t.cpu_share for t in self.timed],
        )

    def sampled(self) -> list[Sampled]:
        return []


RULES: tuple[Rule[Episodes], ...] = (
    *window_rules(lambda m: m.tally),
    Rule("windows agree", lambda m: m.windows.disagree(*m.decisions_per_s, "decisions/s")),
)


def measure(bench: Bench, _: Sequence[Measurement]) -> list[Episodes]:
    """Every loop on card 0."""
    measured = []
    for loop in bench.loops:
        measured.append(_episodes(bench.cards[0], loop, bench.plan.env_impl, bench.plan.common.seed, bench.windows))
        bench.bar.update(1)
    return measured


def _episodes(card: BenchCard, loop: Loop, env_impl: str, seed: int, windows: Windows) -> Episodes:
    impl = None if env_impl == "auto" else env_impl

    def measure(n: int) -> list[ClosedLoop]:
        runs: list[ClosedLoop] = ray.get(
            card.actor.closed_loop(loop.policy, loop.dtype, loop.env, impl, loop.n_envs, seed, windows.seconds, n)
        )
        return runs

    starved = partial(starved_window, card)
    timed = repeat_windows(measure, starved, windows.count)
    return Episodes(timed, [starved(t) for t in timed], windows, loop=loop, card=card, env_impl=env_impl, seed=seed)


MODE = Mode("closed_loop", measure, RULES, lambda b: len(b.loops))
