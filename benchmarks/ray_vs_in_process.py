"""Through Ray against in-process: the same batches of 65536 observations run by
`harness.inference.run_batch` in this process, and sent to one card actor (numpy through the
object store, outputs back) with every call in flight at once, as a sweep sends them.

Alternating rounds of each, the median rate of each side is compared; the outputs must be
identical (same weights, thread count and batch shape). Target: Ray at least 0.8 of in-process.
This process holds freed host memory as a simulated card actor does (`keep_freed_host_memory`),
so both sides run the same allocator policy.
"""

from __future__ import annotations

import harness.devices  # noqa: F401  (sets TORCH_DEVICE_BACKEND_AUTOLOAD before torch loads)

import statistics
import time

import numpy as np
import ray
import torch

from actors.bench_actor import keep_freed_host_memory
from benchmarks import Comparison
from harness.bench import bench_cards
from harness.devices import open_card
from harness.inference import run_batch
from harness.policies import load_policy
from harness.workloads import ObsBatch, make_batch

BATCH = 65536
BATCHES = 4  # distinct seeded batches, each sent CALLS_PER_BATCH times per round
CALLS_PER_BATCH = 3
ROUNDS = 3
TARGET = 0.8


def in_process(policy: torch.nn.Module, batches: list[ObsBatch]) -> tuple[float, list[dict[str, np.ndarray]]]:
    device = open_card("cpu", 0)
    start = time.perf_counter()
    outputs = [run_batch(policy, device, b.obs, b.noise) for b in batches]
    return len(batches) * BATCH / (time.perf_counter() - start), outputs


def through_ray(actor: ray.actor.ActorHandle, batches: list[ObsBatch]) -> tuple[float, list[dict[str, np.ndarray]]]:
    start = time.perf_counter()
    refs = [actor.run_batch.remote("cartpole", "float32", b.obs, b.noise) for b in batches]
    outputs = ray.get(refs)
    return len(batches) * BATCH / (time.perf_counter() - start), outputs


def run() -> Comparison:
    torch.set_num_threads(1)
    keep_freed_host_memory()
    policy = load_policy("cartpole")
    batches = [make_batch(policy.info, "normal", BATCH, seed) for seed in range(BATCHES)] * CALLS_PER_BATCH
    local_rates, ray_rates, identical = [], [], True
    with bench_cards(None, "cpu", 1, ["cartpole"], threads=1) as cards:
        through_ray(cards[0].actor, batches[:1])  # the actor's first call: cast and cache the policy
        for _ in range(ROUNDS):
            local_rate, local_out = in_process(policy, batches)
            ray_rate, ray_out = through_ray(cards[0].actor, batches)
            local_rates.append(local_rate)
            ray_rates.append(ray_rate)
            identical &= all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(local_out, ray_out))
    local, remote = statistics.median(local_rates), statistics.median(ray_rates)
    return Comparison(
        name=f"cartpole forward at batch {BATCH}: through Ray (1 card actor) vs in-process",
        measured={
            "in-process run_batch": f"{local:,.0f} decisions/s (median of {ROUNDS} rounds of {len(batches)} batches)",
            "through Ray, all calls in flight": f"{remote:,.0f} decisions/s (median of {ROUNDS})",
            "outputs identical": str(identical),
        },
        ratio=remote / local,
        ratio_label="Ray / in-process decisions/s",
        target=TARGET,
    )
