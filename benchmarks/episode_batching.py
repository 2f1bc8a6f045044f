"""Closed-loop episodes in a sweep, lockstep against single, side by side in one run.

The same cartpole float32 sweep (2 simulated cards and the CPU reference, all playing every
episode) without episodes, then with `--episodes 100` in lockstep (a unit's episodes step
together, one batched forward per step) and single (each episode alone at batch 1, as before),
then `--episodes 1000` in lockstep. What episodes add is each sweep's time after start-up over
the one without. Targets (2 cores): 100 episodes add under 4 s, 1000 under 15 s, and lockstep
plays at least 5x the episodes per second of single. Every trajectory is compared bit for bit
across the cards in all of them.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks import Comparison
from harness.devices import SIMULATED
from harness.config.command_plan import sweep_plan
from harness.config.options import EpisodeBatching, SweepConfig
from harness.sweeps.driver import run_sweep
from harness.sweeps.resolve import resolve

TARGET_SPEEDUP = 5.0
ADDED_S = {100: 4.0, 1000: 15.0}
DEVICES = 3  # two cards and the CPU reference play every episode


def after_startup(episodes: int, batching: EpisodeBatching) -> tuple[float, bool]:
    """Seconds from the actors being ready to the run written, and whether it passed."""
    with tempfile.TemporaryDirectory() as results:
        config = SweepConfig(
            policies=["cartpole"],
            dtypes=["float32"],
            batch_sizes=[1],
            episodes=episodes,
            episode_batching=batching,
            accelerator=SIMULATED,
            progress=False,
            results=Path(results),
        )
        start = time.perf_counter()
        outcome = run_sweep(resolve(sweep_plan(config)))
        total = time.perf_counter() - start
    return total - outcome.phases.startup, outcome.passed


def run() -> Comparison:
    base, _ = after_startup(0, "lockstep")
    added, passed = {}, True
    runs: tuple[tuple[int, EpisodeBatching], ...] = ((100, "lockstep"), (100, "single"), (1000, "lockstep"))
    for episodes, batching in runs:
        seconds, ok = after_startup(episodes, batching)
        added[episodes, batching] = max(seconds - base, 1e-3)
        passed &= ok
    rate = {key: 2 * key[0] * DEVICES / seconds for key, seconds in added.items()}  # 2 modes per episode count
    measured = {
        f"{n} episodes x 2 modes, {batching}": f"adds {seconds:.2f} s ({rate[n, batching]:,.0f} episodes/s over 3 devices)"
        + (f"; target < {ADDED_S[n]:g} s: {'met' if seconds < ADDED_S[n] else 'NOT met'}" if batching == "lockstep" else "")
        for (n, batching), seconds in added.items()
    }
    measured["sweep without episodes, after start-up"] = f"{base:.2f} s; every sweep passed: {passed}"
    return Comparison(
        name="sweep episodes per second: lockstep vs single (cartpole float32, 2 simulated cards + CPU)",
        measured=measured,
        ratio=rate[100, "lockstep"] / rate[100, "single"] if passed else 0.0,
        ratio_label="lockstep / single episodes per second at 100 episodes (0 unless every sweep passed)",
        target=TARGET_SPEEDUP,
    )
