"""The driver of `harness bench`, in the order a bench happens:

load policies -> join or start Ray -> place one BenchActor per card -> latency on each card
(device time inside the actor, end-to-end time through Ray, side by side) -> throughput of k
cards at once for each k -> closed-loop CartPole on one card -> write the `bench` and `runs`
rows -> print the summary.

The clocks of device time, throughput and the closed loop run inside the actors; the driver
only times what it alone can see, the end-to-end round trip.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import ray
from tqdm import tqdm

from harness.devices import Kind, resolve_accelerator
from harness.envs.registry import check_env
from harness.envs.spec import EnvSpec
from harness.inference.timing import LatencyStats, Throughput, measure_latency
from harness.policies import PolicyNet, PolicySpec
from harness.report.summary import print_bench_summary
from harness.run.budget import check_cards, check_memory, estimate, expected_cards
from harness.run.lifecycle import Phases, claim_run_id, finish_run_row, ray_cluster
from harness.run.options import BenchConfig
from harness.run.place import BenchCard, cluster_address, place_bench
from harness.run.plan import load_policies
from harness.run.provenance import new_run_row, now
from harness.store.schema import BenchRow
from harness.store.writer import write_rows
from harness.workloads import ObsBatch, make_batch

# Throughput windows open this long after they are sent, so every card starts at the same time.
START_DELAY_S = 0.1


@dataclass(frozen=True)
class Measured:
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
    phases = Phases()
    started = now()
    results = Path(config.results)
    with phases("plan"):
        kind = resolve_accelerator(config.accelerator)
        check_cards(config.cards, kind, cluster_address(config.address))
        specs, policies = load_policies(config)
        check_memory(estimate(config, policies, expected_cards(kind, config)), config.max_memory_gib)
        run_id = claim_run_id(results, config.run_id)
        work = [
            Measured(name, dtype, make_batch(p.info, "normal", size, config.seed))
            for name, p in policies.items()
            for dtype in config.dtypes
            for size in config.batch_sizes
        ]
        envs = {name: env for name, p in policies.items() if (env := EnvSpec.played_by(p.info)) is not None}
        for name, env in envs.items():
            check_env(env, policies[name].info)
        loops = [
            (name, env, dtype, size) for name, env in envs.items() for dtype in config.dtypes for size in config.batch_sizes
        ]
    n_placed = config.cards or (max(config.card_counts) if config.card_counts else None)

    with bench_cards(config.address, kind, n_placed, specs, policies, config.threads, config.precision, phases) as cards:
        steps = sorted(set(config.card_counts or [1, len(cards)]))
        bar = tqdm(
            total=len(work) * (len(cards) + len(steps)) + len(loops),
            desc="bench",
            unit="step",
            disable=not config.progress,
            file=sys.stderr,
        )
        with phases("compute"):
            rows = _latency(cards, work, config.duration, bar)
            rows += measure_scaling(cards, steps, work, config.duration, bar)
            rows += _closed_loop(cards[0], loops, config, bar)
        bar.close()

    with phases("write"):
        bench_path = write_rows(results, "bench", run_id, rows)
        run_row = new_run_row(
            started_at=started,
            status="bench",
            accelerator=kind,
            n_cards=len(cards),
            devices=[c.description for c in cards],
            config_json=config.to_json(),
            policies=policies,
            command=command,
        )
        write_rows(
            results, "runs", run_id, [finish_run_row(run_row, "bench", {"bench_rows": len(rows), "card_steps": steps}, phases)]
        )
    print_bench_summary(rows, run_id, sys.stdout)
    return BenchOutcome(run_id, rows, bench_path)


@contextmanager
def bench_cards(
    address: str | None,
    kind: Kind,
    cards: int | None,
    specs: list[PolicySpec],
    policies: dict[str, PolicyNet],
    threads: int,
    precision: str = "strict",
    phases: Phases | None = None,
) -> Iterator[list[BenchCard]]:
    """Join or start Ray, place `cards` BenchActors (default: all the cluster has), and shut
    Ray down afterwards. The benchmarks use this too."""
    phases = phases or Phases()
    with ray_cluster(address, kind, cards, phases) as n_cards:
        with phases("startup"):
            placed = place_bench(kind, n_cards, specs, policies, threads, precision)
        yield placed


def _latency(cards: list[BenchCard], work: list[Measured], budget_s: float, bar: tqdm) -> list[BenchRow]:
    """Each card alone, one after another: device time, then end to end through Ray."""
    rows = []
    for w in work:
        for card in cards:
            device = ray.get(card.actor.latency.remote(w.policy, w.dtype, w.batch.obs, w.batch.noise, budget_s))
            end_to_end = measure_latency(partial(_round_trip, card, w), _no_sync, budget_s)
            rows += [_latency_row(w, card, device, "device"), _latency_row(w, card, end_to_end, "end_to_end")]
            bar.update(1)
    return rows


def _round_trip(card: BenchCard, w: Measured) -> object:
    # The batch goes through Ray on every call: shipping it is part of the end-to-end time.
    return ray.get(card.actor.run_batch.remote(w.policy, w.dtype, w.batch.obs, w.batch.noise))


def _no_sync() -> None:
    """ray.get returns numpy already copied off the card: nothing is left queued to wait for."""


def _latency_row(w: Measured, card: BenchCard, stats: LatencyStats, timing: str) -> BenchRow:
    detail = {"iterations": stats.iterations, "input_sha256": w.batch.sha256}
    if timing == "end_to_end":
        detail["first_call"] = "after the device row's warm-up: first round trip of this batch"
    return BenchRow(
        policy=w.policy,
        dtype=w.dtype,
        device=card.label,
        n_cards=1,
        batch_size=w.batch.size,
        mode="latency",
        first_call_ms=stats.first_call_ms,
        p50_ms=stats.p50_ms,
        p95_ms=stats.p95_ms,
        p99_ms=stats.p99_ms,
        mean_ms=stats.mean_ms,
        decisions_per_s=w.batch.size / (stats.mean_ms / 1e3),
        scaling_efficiency=None,
        timing=timing,
        detail=json.dumps(detail),
    )


def measure_scaling(
    cards: list[BenchCard], steps: list[int], work: list[Measured], duration_s: float, bar: tqdm
) -> list[BenchRow]:
    """For each k, the first k cards run the same batch at once for one window."""
    rows = []
    for w in work:
        obs, noise = ray.put(w.batch.obs), ray.put(w.batch.noise)  # one copy for all cards
        one_card: float | None = None
        for k in steps:
            group = cards[:k]
            ray.get([c.actor.warm_up.remote(w.policy, w.dtype, obs, noise) for c in group])
            start_at = time.time() + START_DELAY_S
            runs: list[Throughput] = ray.get(
                [c.actor.throughput.remote(w.policy, w.dtype, obs, noise, start_at, duration_s) for c in group]
            )
            total = sum(r.decisions_per_s for r in runs)
            if k == 1:
                one_card = total
            efficiency = total / (k * one_card) if one_card else None  # None without a 1-card baseline
            rows.append(_throughput_row(w, group, runs, total, efficiency, duration_s))
            bar.update(1)
    return rows


def _throughput_row(
    w: Measured, group: list[BenchCard], runs: list[Throughput], total: float, efficiency: float | None, duration_s: float
) -> BenchRow:
    detail = {
        "window_s": duration_s,
        "input_sha256": w.batch.sha256,
        "per_card_decisions_per_s": [round(r.decisions_per_s, 1) for r in runs],
        "per_card_cpu_share": [round(r.cpu_share, 3) for r in runs],
    }
    mean_ms = sum(r.elapsed_s / r.calls for r in runs) / len(runs) * 1e3  # a window always holds a call
    return BenchRow(
        policy=w.policy,
        dtype=w.dtype,
        device=",".join(c.label for c in group),
        n_cards=len(group),
        batch_size=w.batch.size,
        mode="throughput",
        first_call_ms=None,
        p50_ms=None,
        p95_ms=None,
        p99_ms=None,
        mean_ms=mean_ms,
        decisions_per_s=total,
        scaling_efficiency=efficiency,
        timing="device",
        detail=json.dumps(detail),
    )


def _closed_loop(
    card: BenchCard, loops: list[tuple[str, EnvSpec, str, int]], config: BenchConfig, bar: tqdm
) -> list[BenchRow]:
    """Episodes of each policy's environment in lockstep on one card, one forward per step."""
    impl = None if config.env_impl == "auto" else config.env_impl
    rows = []
    for policy, env, dtype, n_envs in loops:
        result = ray.get(card.actor.closed_loop.remote(policy, dtype, env, impl, n_envs, config.seed, config.duration))
        step_ms = result.elapsed_s / result.steps * 1e3  # one lockstep step: a forward and an env step
        detail = {
            "env_impl": config.env_impl,
            "env_id": env.key,
            "episodes": len(result.returns),
            "first_seed": config.seed,
            "mean_return": float(result.returns.mean()),
            "min_return": float(result.returns.min()),
        }
        rows.append(
            BenchRow(
                policy=policy,
                dtype=dtype,
                device=card.label,
                n_cards=1,
                batch_size=n_envs,
                mode="closed_loop",
                first_call_ms=None,
                p50_ms=None,
                p95_ms=None,
                p99_ms=None,
                mean_ms=step_ms,
                decisions_per_s=result.decisions_per_s,
                scaling_efficiency=None,
                timing="device",
                detail=json.dumps(detail),
            )
        )
        bar.update(1)
    return rows
