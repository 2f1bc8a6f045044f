"""A bench mode is a typed measurement, a table of rules and one registration: a toy mode, given
to the driver as the registry gives it its modes, is measured, judged by its own rules (a fault
in its figures breaks one, and the row says which) and written as `bench` and `bench_samples`
rows that read back from Parquet. Without Ray: the toy measures nothing on a card."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from tqdm import tqdm

from harness.policies import load_policy
from harness.benches.driver import bench_tables, measure
from harness.benches.modes import Bench, Mode
from harness.benches.rows import Figures, Measurement, RowKey, Sampled, Summary, sample_columns
from harness.benches.rules import Rule
from harness.benches.windows import Tally, Windows, median_of_windows, window_rules
from harness.benches.work import Work
from harness.config.command_plan import bench_plan
from harness.config.options import BenchConfig
from harness.cluster.phases import Phases
from harness.store.schema import BenchRow, BenchSampleRow
from harness.workloads import make_batch

WINDOWS = Windows(count=6, seconds=0.1, min_iterations=5, max_spread=0.25)


@dataclass(frozen=True)
class Coins:
    """The toy's measurement: coins counted per window, at `rate` a second."""

    work: Work
    rates: list[float]
    windows: Windows

    def summary(self) -> Summary:
        median, interval = median_of_windows(self.rates, self.windows)
        w = self.work
        key = RowKey(f"toy/{w.policy}/b{w.batch.size}", w.policy, w.dtype, w.batch.size, "toy", "device", "nowhere")
        return Summary(key, Figures(decisions_per_s=median, windows=len(self.rates)), "decisions_per_s", interval, {})

    def samples(self, row_id: str) -> dict[str, np.ndarray]:
        n = len(self.rates)
        return sample_columns(row_id, list(range(n)), ["nowhere"] * n, [True] * n, decisions_per_s=self.rates)

    def sampled(self) -> list[Sampled]:
        return []


def _counted(bench: Bench, _: Sequence[Measurement]) -> list[Coins]:
    # The second batch's windows count a coin that is not there: a negative rate.
    return [
        Coins(w, [100.0 + i for i in range(6)] if i == 0 else [100.0] * 5 + [-1.0], bench.windows)
        for i, w in enumerate(bench.work)
    ]


TOY = Mode(
    "toy",
    _counted,
    (
        *window_rules(lambda m: Tally(m.windows, len(m.rates), len(m.rates), [m.windows.min_iterations] * len(m.rates))),
        Rule(
            "no negative count",
            lambda m: f"{sum(r < 0 for r in m.rates)} windows counted below zero" if min(m.rates) < 0 else None,
        ),
    ),
    lambda b: len(b.work),
)


def test_a_toy_mode_is_measured_judged_and_written_as_rows(tmp_path: Path) -> None:
    policy = load_policy("cartpole")
    work = [Work("cartpole", "float32", make_batch(policy.info, "normal", size, 0)) for size in (1, 8)]
    bench = Bench([], [1], work, [], bench_plan(BenchConfig()), WINDOWS, tqdm(disable=True))
    phases = Phases()
    results = measure(bench, (TOY,), phases)

    good, bad = (r.row for r in results)
    assert good.valid and good.invalid_reason == "" and good.mode == "toy" and good.decisions_per_s == 102.5
    assert (good.ci_low, good.ci_high) == (100.0, 105.0)
    assert not bad.valid and bad.invalid_reason == "1 windows counted below zero"
    assert phases["toy"] >= 0  # the mode ran as its own phase

    for name, table in bench_tables(results, []).items():
        pq.write_table(table, tmp_path / f"{name}.parquet")
    rows = pq.read_table(tmp_path / "bench.parquet").to_pylist()
    assert [r["row_id"] for r in rows] == ["toy/cartpole/b1", "toy/cartpole/b8"]
    assert [r["valid"] for r in rows] == [True, False]
    assert list(rows[0]) == list(BenchRow.__dataclass_fields__)
    samples = pq.read_table(tmp_path / "bench_samples.parquet")
    assert samples.column_names == list(BenchSampleRow.__dataclass_fields__)
    assert samples.column("decisions_per_s").to_pylist()[6:] == [100.0] * 5 + [-1.0]

    # A quick look breaks the window rules of every row, the toy's too.
    quick = Bench([], [1], work[:1], [], bench_plan(BenchConfig()), Windows(1, 0.2, 5, 0.25, quick=True), tqdm(disable=True))
    (row,) = (r.row for r in measure(quick, (TOY,), Phases()))
    assert not row.valid and row.invalid_reason.startswith("quick look (--duration 0.2)")
