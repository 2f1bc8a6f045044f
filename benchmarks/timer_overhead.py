"""The latency loop's own cost: `timed_iterations` with an empty body, beside a real decision.

Two numbers: what the clocks record for an empty body (the floor under every percentile), and
the wall time per iteration of the whole loop (synchronize, clocks, call, store). Target: the
loop costs under 2 us per iteration. Runs in-process with the same synchronize a card uses.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np
import torch

from benchmarks import Comparison
from harness.devices import SIMULATED, open_card, synchronize
from harness.inference.forward import forward_outputs, to_device
from harness.inference.timing import measure_latency, timed_iterations
from harness.policies import load_policy
from harness.workloads import make_batch

ITERATIONS = 50_000
REPEATS = 7  # the machine is shared: the median of several runs, and the best for the floor
TARGET_US = 2.0


def _empty() -> None:
    pass


def run() -> Comparison:
    torch.set_num_threads(1)
    device = open_card(SIMULATED, 0)
    sync = partial(synchronize, device)
    timed_iterations(_empty, sync, 1000)  # warm the interpreter's caches
    loop_us, recorded_ms = [], []
    for _ in range(REPEATS):
        start = time.perf_counter()
        recorded_ms.append(timed_iterations(_empty, sync, ITERATIONS))
        loop_us.append((time.perf_counter() - start) / ITERATIONS * 1e6)
    recorded = np.concatenate(recorded_ms)
    median_us = float(np.median(loop_us))

    policy = load_policy("cartpole")
    batch = make_batch(policy.info, "normal", 1, 0)
    body = partial(forward_outputs, policy, to_device(batch.obs, device), to_device((batch.noise,), device)[0])
    forward_ms = float(np.median(measure_latency(body, sync, windows=1, window_s=1.0, min_iterations=1).windows[0].times_ms))
    return Comparison(
        name="latency loop overhead (empty timed body)",
        measured={
            "empty body, recorded p50": f"{np.median(recorded) * 1e3:.3f} us",
            "empty body, recorded mean": f"{recorded.mean() * 1e3:.3f} us",
            f"whole loop per iteration, median of {REPEATS}": f"{median_us:.3f} us",
            f"whole loop per iteration, best of {REPEATS}": f"{min(loop_us):.3f} us",
            "cartpole forward batch 1, p50": f"{forward_ms * 1e3:.1f} us",
        },
        ratio=median_us,
        ratio_label="loop overhead, us per iteration",
        target=TARGET_US,
        higher_is_better=False,
        notes=f"overhead is {median_us / (forward_ms * 1e3):.1%} of the smallest real body",
    )
