"""The default sweep's wall time, Ray start included, split into start-up, compute and the
harness's own overhead (planning, fan-out, comparison, Parquet), and what the CPU reference
spends on the float64 golden, on each card dtype beside float32, and on its episodes and their
replay as an honest port (seconds of the reference actor, which runs beside the cards: a share of
the wall time, not all of it added to it).
Targets: under 60 s in all on a 2-core machine, and the overhead under 10% of the total."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks import Comparison
from harness.cluster.phases import Phases
from harness.config.command_plan import sweep_plan
from harness.config.options import SweepConfig
from harness.sweeps.driver import run_sweep
from harness.sweeps.resolve import resolve

TARGET_OVERHEAD = 0.10
TARGET_TOTAL_S = 60.0


def run() -> Comparison:
    with tempfile.TemporaryDirectory() as results:
        start = time.perf_counter()
        phases = Phases()
        outcome = run_sweep(resolve(sweep_plan(SweepConfig(results=Path(results), progress=False)), phases), phases=phases)
        total = time.perf_counter() - start
    t = outcome.phases
    overhead = t["plan"] + t["fanout"] + t["judge"] + t["write"]
    reference = outcome.reference_s
    episodes = reference.get("episodes float32", 0.0)
    replay = reference.get("episodes float32 honest replay", 0.0)
    same_dtype = sum(s for dtype, s in reference.items() if dtype not in ("float64", "float32") and "episodes" not in dtype)
    met = "met" if total < TARGET_TOTAL_S else "NOT met"
    return Comparison(
        name="default sweep wall time (cartpole + huggy-arch, 3 dtypes, 2 simulated cards)",
        measured={
            "total": f"{total:.1f} s (target < {TARGET_TOTAL_S:.0f} s: {met}), verdict {outcome.status}",
            "start-up (Ray, actors ready)": f"{t.startup:.1f} s",
            "compute (waiting on actors)": f"{t['compute']:.1f} s",
            "overhead: plan": f"{t['plan']:.2f} s",
            "overhead: fan-out": f"{t['fanout']:.2f} s",
            "overhead: compare": f"{t['judge']:.2f} s",
            "overhead: write Parquet": f"{t['write']:.2f} s",
            "CPU reference: float64 "
            "golden": f"{reference.get('float64', 0.0):.2f} s ({reference.get('float64', 0.0) / total:.1%} of the wall time)",
            "CPU reference: float32": f"{reference.get('float32', 0.0):.2f} s ({reference.get('float32', 0.0) / total:.1%})",
            "CPU reference: float16, bfloat16 (same dtype as the cards)": f"{same_dtype:.2f} s ({same_dtype / total:.1%})",
            "CPU reference: episodes float32": f"{episodes:.2f} s ({episodes / total:.1%})",
            "CPU reference: their replay as an honest port": f"{replay:.2f} s ({replay / total:.1%})",
        },
        ratio=overhead / total,
        ratio_label="harness overhead / total",
        target=TARGET_OVERHEAD,
        higher_is_better=False,
    )
