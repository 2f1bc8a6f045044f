"""The driver of `harness bench`, in the order a bench happens:

load policies -> join or start Ray -> place one BenchActor per card -> latency on each card
(device time inside the actor, end-to-end time through Ray, side by side) -> throughput of k
cards at once for each k -> closed-loop CartPole on one card -> write the `bench` and `runs`
rows -> print the summary.

The clocks of device time, throughput and the closed loop run inside the actors; the driver
only times what it alone can see, the end-to-end round trip.
"""

from __future__ import annotations

import harness.devices  # noqa: F401  (sets TORCH_DEVICE_BACKEND_AUTOLOAD before torch loads)

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TextIO

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group
from tqdm import tqdm

from actors.bench_actor import BenchActor, LatencyStats, Throughput, measure_latency
from harness.bench_cli import BenchConfig
from harness.cluster import card_count, card_options, connect, reserve, wait_described
from harness.devices import Kind, resolve_accelerator
from harness.errors import UsageError
from harness.policies import load_policy
from harness.provenance import new_run_row, now
from harness.results import BenchRow, new_run_id, table_dir, write_rows
from harness.summary import short_name
from harness.vec_cartpole import ENV_ID
from harness.workloads import ObsBatch, make_batch

# Throughput windows open this long after they are sent, so every card starts at the same time.
START_DELAY_S = 0.1


@dataclass(frozen=True)
class Card:
    label: str
    actor: ray.actor.ActorHandle
    description: dict[str, object]  # what the actor reported about its card


@dataclass(frozen=True)
class Work:
    """One (policy, dtype, batch) combination, its batch made on the driver from the seed."""

    policy: str
    dtype: str
    batch: ObsBatch


@dataclass
class BenchOutcome:
    run_id: str
    rows: list[BenchRow]
    bench_path: Path


def run_bench(config: BenchConfig, command: str = "") -> BenchOutcome:
    started = now()
    results = Path(config.results)
    kind = resolve_accelerator(config.accelerator)
    policies = {name: load_policy(name) for name in config.policies}
    run_id = _new_run(results, config.run_id)
    work = [Work(name, dtype, make_batch(p.info, "normal", size, config.seed)) for name, p in policies.items() for dtype in config.dtypes for size in config.batch_sizes]
    loops = [(name, dtype, size) for name, p in policies.items() if p.info.env_id == ENV_ID for dtype in config.dtypes for size in config.batch_sizes]

    with bench_cards(config.address, kind, max(config.cards) if config.cards else None, list(policies), config.threads) as cards:
        steps = sorted(set(config.cards or [1, len(cards)]))
        bar = tqdm(total=len(work) * (len(cards) + len(steps)) + len(loops), desc="bench", unit="step", disable=not config.progress, file=sys.stderr)
        rows = _latency(cards, work, config.duration, bar)
        rows += measure_scaling(cards, steps, work, config.duration, bar)
        rows += _closed_loop(cards[0], loops, config, bar)
        bar.close()

    bench_path = write_rows(results, "bench", run_id, rows)
    run_row = new_run_row(
        started_at=started, status="bench", accelerator=kind, n_cards=len(cards), devices=[c.description for c in cards],
        config_json=config.to_json(), policies=policies, command=command,
        summary=json.dumps({"bench_rows": len(rows), "card_steps": steps}),
    )
    run_row.finished_at = now()
    write_rows(results, "runs", run_id, [run_row])
    print_bench_summary(rows, run_id, sys.stdout)
    return BenchOutcome(run_id, rows, bench_path)


def _new_run(results: Path, run_id: str | None) -> str:
    run_id = run_id or new_run_id()
    if table_dir(results, "runs", run_id).exists() or table_dir(results, "bench", run_id).exists():
        raise UsageError(f"--run-id {run_id}: a run of that name exists in {results}; pick another")
    return run_id


@contextmanager
def bench_cards(address: str | None, kind: Kind, cards: int | None, policies: list[str], threads: int) -> Iterator[list[Card]]:
    """Join or start Ray, place `cards` BenchActors (default: all the cluster has), and shut
    Ray down afterwards. The benchmarks use this too."""
    connect(address, kind, cards)
    try:
        group, placed = place_cards(kind, card_count(kind, cards), policies, threads)
        yield placed
        remove_placement_group(group)
    finally:
        ray.shutdown()


def place_cards(kind: Kind, n_cards: int, policies: list[str], threads: int) -> tuple[PlacementGroup, list[Card]]:
    """One bundle per card, one BenchActor in each, as harness.cluster.place does for sweeps
    (minus the CPU reference: a bench judges nothing)."""
    group = reserve(kind, n_cards, "PACK", cpu_bundle=False)
    actors = [
        ray.remote(BenchActor).options(**card_options(kind, group, position, {})).remote(kind, position, policies, threads)
        for position in range(n_cards)
    ]
    return group, [Card(str(d["label"]), a, d) for d, a in zip(wait_described(actors), actors)]


def _latency(cards: list[Card], work: list[Work], budget_s: float, bar: tqdm) -> list[BenchRow]:
    """Each card alone, one after another: device time, then end to end through Ray."""
    rows = []
    for w in work:
        for card in cards:
            device = ray.get(card.actor.latency.remote(w.policy, w.dtype, w.batch.obs, w.batch.noise, budget_s))
            end_to_end = measure_latency(partial(_round_trip, card, w), _no_sync, budget_s)
            rows += [_latency_row(w, card, device, "device"), _latency_row(w, card, end_to_end, "end_to_end")]
            bar.update(1)
    return rows


def _round_trip(card: Card, w: Work) -> object:
    # The batch goes through Ray on every call: shipping it is part of the end-to-end time.
    return ray.get(card.actor.run_batch.remote(w.policy, w.dtype, w.batch.obs, w.batch.noise))


def _no_sync() -> None:
    """ray.get returns numpy already copied off the card: nothing is left queued to wait for."""


def _latency_row(w: Work, card: Card, stats: LatencyStats, timing: str) -> BenchRow:
    detail = {"iterations": stats.iterations, "input_sha256": w.batch.sha256}
    if timing == "end_to_end":
        detail["first_call"] = "after the device row's warm-up: first round trip of this batch"
    return BenchRow(
        policy=w.policy, dtype=w.dtype, device=card.label, n_cards=1, batch_size=w.batch.size, mode="latency",
        first_call_ms=stats.first_call_ms, p50_ms=stats.p50_ms, p95_ms=stats.p95_ms, p99_ms=stats.p99_ms,
        mean_ms=stats.mean_ms, decisions_per_s=w.batch.size / (stats.mean_ms / 1e3), scaling_efficiency=None,
        timing=timing, detail=json.dumps(detail),
    )


def measure_scaling(cards: list[Card], steps: list[int], work: list[Work], duration_s: float, bar: tqdm) -> list[BenchRow]:
    """For each k, the first k cards run the same batch at once for one window."""
    rows = []
    for w in work:
        obs, noise = ray.put(w.batch.obs), ray.put(w.batch.noise)  # one copy for all cards
        one_card: float | None = None
        for k in steps:
            group = cards[:k]
            ray.get([c.actor.warm_up.remote(w.policy, w.dtype, obs, noise) for c in group])
            start_at = time.time() + START_DELAY_S
            runs: list[Throughput] = ray.get([c.actor.throughput.remote(w.policy, w.dtype, obs, noise, start_at, duration_s) for c in group])
            total = sum(r.decisions_per_s for r in runs)
            if k == 1:
                one_card = total
            efficiency = total / (k * one_card) if one_card else None  # None without a 1-card baseline
            rows.append(_throughput_row(w, group, runs, total, efficiency, duration_s))
            bar.update(1)
    return rows


def _throughput_row(w: Work, group: list[Card], runs: list[Throughput], total: float, efficiency: float | None, duration_s: float) -> BenchRow:
    detail = {
        "window_s": duration_s, "input_sha256": w.batch.sha256,
        "per_card_decisions_per_s": [round(r.decisions_per_s, 1) for r in runs],
        "per_card_cpu_share": [round(r.cpu_share, 3) for r in runs],
    }
    mean_ms = sum(r.elapsed_s / r.calls for r in runs) / len(runs) * 1e3  # a window always holds a call
    return BenchRow(
        policy=w.policy, dtype=w.dtype, device=",".join(c.label for c in group), n_cards=len(group), batch_size=w.batch.size,
        mode="throughput", first_call_ms=None, p50_ms=None, p95_ms=None, p99_ms=None, mean_ms=mean_ms,
        decisions_per_s=total, scaling_efficiency=efficiency, timing="device", detail=json.dumps(detail),
    )


def _closed_loop(card: Card, loops: list[tuple[str, str, int]], config: BenchConfig, bar: tqdm) -> list[BenchRow]:
    rows = []
    for policy, dtype, n_envs in loops:
        result = ray.get(card.actor.closed_loop.remote(policy, dtype, config.env, n_envs, config.seed, config.duration))
        step_ms = result.elapsed_s / (result.decisions / n_envs) * 1e3  # one lockstep step: a forward and an env step
        detail = {
            "env": config.env, "env_id": ENV_ID, "episodes": len(result.returns), "first_seed": config.seed,
            "mean_return": float(result.returns.mean()), "min_return": float(result.returns.min()),
        }
        rows.append(BenchRow(
            policy=policy, dtype=dtype, device=card.label, n_cards=1, batch_size=n_envs, mode="closed_loop",
            first_call_ms=None, p50_ms=None, p95_ms=None, p99_ms=None, mean_ms=step_ms,
            decisions_per_s=result.decisions_per_s, scaling_efficiency=None, timing="device", detail=json.dumps(detail),
        ))
        bar.update(1)
    return rows


def print_bench_summary(rows: list[BenchRow], run_id: str, out: TextIO) -> None:
    header = f"{'mode':<11} {'timing':<10} {'policy':<24} {'dtype':<8} {'device':<17} {'batch':>6} {'first ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'decisions/s':>13} {'scaling':>7}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        print(
            f"{r.mode:<11} {r.timing:<10} {short_name(r.policy):<24} {r.dtype:<8} {r.device[:17]:<17} {r.batch_size:>6} {_num(r.first_call_ms, 9, '.3f')} "
            f"{_num(r.p50_ms, 9, '.3f')} {_num(r.p99_ms, 9, '.3f')} {_num(r.decisions_per_s, 13, ',.0f')} {_num(r.scaling_efficiency, 7, '.2f')}",
            file=out,
        )
    print(f"run {run_id}: {len(rows)} bench rows", file=out)


def _num(value: float | None, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"
