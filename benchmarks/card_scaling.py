"""2 simulated cards against 1 on this machine, with the same `measure_scaling` that
`harness bench` runs: k card actors, one torch thread each, run the same large batch at once
for a window, in rounds (a 1-card window and a 2-card window back to back, their order
alternating); efficiency = median over rounds of tput(2) / (2 * tput(1)). Target: at least 0.85
on every large batch (the smallest efficiency is the ratio reported).

The machine is shared with other work that comes and goes: rounds in which a card got under 90%
of a core are measured again (`harness.judge.bench_stats.STARVED_SHARE`), and each efficiency is
printed with its 95% interval, the share of a core the cards got, and whether the row is valid.
"""

from __future__ import annotations

from tqdm import tqdm

from benchmarks import Comparison
from harness.devices import SIMULATED
from harness.policies import PolicySpec, load_policy
from harness.benches import bench_cards
from harness.benches.throughput import MODE, measure_scaling
from harness.benches.windows import Windows
from harness.benches.work import Work
from harness.workloads import make_batch

LARGE = {"cartpole": (4096, 65536), "huggy-arch": (4096,)}
WINDOWS = Windows(count=9, seconds=1.0, min_iterations=15, max_spread=0.25)
TARGET = 0.85


def run() -> Comparison:
    policies = {name: load_policy(name) for name in LARGE}
    work = [
        Work(name, "float32", make_batch(policies[name].info, "normal", size, 0))
        for name, sizes in LARGE.items()
        for size in sizes
    ]
    with bench_cards(None, SIMULATED, 2, [PolicySpec(name) for name in LARGE], policies, threads=1) as cards:
        rows = [r.row for r in MODE.results(measure_scaling(cards, [1, 2], work, WINDOWS, tqdm(disable=True)))]
    measured, efficiencies = {}, []
    for w, two in zip(work, (r for r in rows if r.n_cards == 2), strict=True):
        assert two.scaling_efficiency is not None  # a 1-card window runs in every round
        efficiencies.append(two.scaling_efficiency)
        measured[f"{w.policy} batch {w.batch.size}"] = (
            f"efficiency {two.scaling_efficiency:.3f} (95% interval {two.scaling_ci_low or float('nan'):.3f} to "
            f"{two.scaling_ci_high or float('nan'):.3f}); 2 cards {two.decisions_per_s:,.0f}/s; least CPU share of a card "
            f"{two.cpu_share or float('nan'):.2f}; {'valid' if two.valid else 'INVALID: ' + two.invalid_reason}"
        )
    return Comparison(
        name=f"scaling, 2 simulated cards vs 1 ({WINDOWS.seconds:g} s windows, {WINDOWS.count} rounds, 1 thread per card, "
        "2 cores)",
        measured=measured,
        ratio=min(efficiencies),
        ratio_label="smallest median scaling efficiency tput(2) / (2 * tput(1))",
        target=TARGET,
        limit=1.0,  # two cards cannot do more than twice one card's work
    )
