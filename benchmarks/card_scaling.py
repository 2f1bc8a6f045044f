"""2 simulated cards against 1 on this machine, with the same `measure_scaling` that
`harness bench` runs: k card actors, one torch thread each, run the same large batch at once
for a fixed window; efficiency = tput(2) / (2 * tput(1)). Target: at least 0.85 on every large
batch (the smallest efficiency is the ratio reported).

The machine is shared with other work that comes and goes, so each batch is measured REPEATS
times, 1 card then 2 back to back, and each pair gives one efficiency; the median of those is
the result. Printed beside it: the best window of each k (timeit's view of what the cards can
do) and the share of a core each card process got while two ran, which falls below 1 when other
work on the machine is taking the cores.
"""

from __future__ import annotations

import json
import statistics

from tqdm import tqdm

from benchmarks import Comparison
from harness.devices import SIMULATED
from harness.policies import PolicySpec, load_policy
from harness.run.bench import Measured, bench_cards, measure_scaling
from harness.workloads import make_batch

LARGE = {"cartpole": (4096, 65536), "huggy-arch": (4096,)}
WINDOW_S = 1.0
REPEATS = 7
TARGET = 0.85


def run() -> Comparison:
    policies = {name: load_policy(name) for name in LARGE}
    work = [
        Measured(name, "float32", make_batch(policies[name].info, "normal", size, 0))
        for name, sizes in LARGE.items()
        for size in sizes
    ]
    with bench_cards(None, SIMULATED, 2, [PolicySpec(name) for name in LARGE], policies, threads=1) as cards:
        repeats = [measure_scaling(cards, [1, 2], work, WINDOW_S, tqdm(disable=True)) for _ in range(REPEATS)]
    measured, efficiencies = {}, []
    for i, w in enumerate(work):
        pairs = [(rows[2 * i], rows[2 * i + 1]) for rows in repeats]
        each = [two.scaling_efficiency for _, two in pairs if two.scaling_efficiency is not None]
        best_one, best_two = (max(r.decisions_per_s for r in side) for side in zip(*pairs, strict=True))
        shares = [share for _, two in pairs for share in json.loads(two.detail)["per_card_cpu_share"]]
        efficiencies.append(statistics.median(each))
        measured[f"{w.policy} batch {w.batch.size}"] = (
            f"efficiency {efficiencies[-1]:.3f} (each pair: {', '.join(f'{e:.2f}' for e in each)}); "
            f"best windows: 1 card {best_one:,.0f}/s, 2 cards {best_two:,.0f}/s ({best_two / (2 * best_one):.2f}); "
            f"CPU share of a card while 2 ran: median {statistics.median(shares):.2f}"
        )
    return Comparison(
        name=f"scaling, 2 simulated cards vs 1 ({WINDOW_S:g} s windows, median of {REPEATS} pairs, 1 thread per card, "
        "2 cores)",
        measured=measured,
        ratio=min(efficiencies),
        ratio_label="smallest median scaling efficiency tput(2) / (2 * tput(1))",
        target=TARGET,
        limit=1.0,  # two cards cannot do more than twice one card's work
    )
