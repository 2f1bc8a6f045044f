"""The default sweep's wall time, Ray start included, split into start-up, compute and the
harness's own overhead (planning, fan-out, comparison, Parquet). Targets: under 60 s in all on
a 2-core machine, and the overhead under 10% of the total."""

from __future__ import annotations

import tempfile
import time

from benchmarks import Comparison
from harness.config import SweepConfig
from harness.sweep import run_sweep

TARGET_OVERHEAD = 0.10
TARGET_TOTAL_S = 60.0


def run() -> Comparison:
    with tempfile.TemporaryDirectory() as results:
        start = time.perf_counter()
        outcome = run_sweep(SweepConfig(results=results, progress=False))
        total = time.perf_counter() - start
    t = outcome.timings
    overhead = t.plan_s + t.fanout_s + t.judge_s + t.write_s
    return Comparison(
        name="default sweep wall time (cartpole + huggy-arch, 3 dtypes, 2 simulated cards)",
        measured={
            "total": f"{total:.1f} s (target < {TARGET_TOTAL_S:.0f} s: {'met' if total < TARGET_TOTAL_S else 'NOT met'}), verdict {outcome.status}",
            "start-up (Ray, actors ready)": f"{t.startup_s:.1f} s",
            "compute (waiting on actors)": f"{t.compute_s:.1f} s",
            "overhead: plan": f"{t.plan_s:.2f} s",
            "overhead: fan-out": f"{t.fanout_s:.2f} s",
            "overhead: compare": f"{t.judge_s:.2f} s",
            "overhead: write Parquet": f"{t.write_s:.2f} s",
        },
        ratio=overhead / total,
        ratio_label="harness overhead / total",
        target=TARGET_OVERHEAD,
        higher_is_better=False,
    )
