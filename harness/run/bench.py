"""The driver of `harness bench`, in the order a bench happens:

load policies -> join or start Ray -> place one BenchActor per card -> latency on each card
(device time inside the actor, end to end through Ray, side by side) -> throughput of k cards
at once, in rounds -> closed-loop episodes on one card -> the server scenario
(harness/run/server.py) -> the audit of the timed path -> publish `bench`, `bench_samples`,
`checks`, then the `runs` row that says the bench ended -> print the summary.

Every measurement runs several windows (README, "Speed"): a row's figure is the median of its
windows' figures (latency percentiles pool the calls of its windows), its 95% interval comes
from their order statistics and its validity from the rules of harness/judge/bench_stats.py.
The clocks of device time, throughput and the closed loop run inside the actors; the driver
only times what it alone can see: end-to-end round trips and server requests.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import ray
from tqdm import tqdm

from harness.devices import Kind, resolve_accelerator
from harness.envs.registry import check_env
from harness.envs.spec import EnvSpec
from harness.inference.fault_specs import Fault, parse_faults, refuse_absent_cards
from harness.inference.timing import ClosedLoop, LatencyWindow, Throughput, measure_latency
from harness.judge.bench_stats import (
    efficiency_above_one,
    is_starved,
    quantile_interval,
    quantiles,
    round_efficiencies,
    too_few_for_percentile,
)
from harness.judge.verdicts import judge_bench_audit
from harness.outputs import Outputs
from harness.policies import PolicyNet, PolicySpec
from harness.report.summary import print_bench_summary
from harness.run.dispatch import check_row
from harness.run.budget import cards_source, check_cards, check_memory, estimate, expected_cards, planned_cards
from harness.run.lifecycle import claim_run_id, finish_run_row, ray_cluster, said_at_the_end
from harness.run.phases import Phases
from harness.run.options import BenchConfig
from harness.run.measure import (
    AuditSample,
    Measured,
    Measurement,
    Windows,
    judged_row,
    kept_windows,
    median_of_windows,
    repeat_windows,
    sample_columns,
    sample_table,
)
from harness.run.place import BenchCard, cluster_address, place_bench
from harness.run.plan import load_policies
from harness.run.server import measure_server
from harness.run.provenance import new_run_row, now
from harness.store.schema import BenchRow, CheckRow
from harness.store.paths import table_dir
from harness.store.writer import RunWriter, columns_table, to_table
from harness.workloads import make_batch

# A schedule of throughput windows opens this long after it is sent, so every card starts at the same time.
START_DELAY_S = 0.1
# Between two windows of a schedule, on top of two calls: a card's last call overruns its window.
GAP_S = 0.02
# Throughput windows are sized to hold the minimum of calls at the warm-up's pace, with room to spare.
HEADROOM = 1.25


@dataclass
class BenchOutcome:
    run_id: str
    rows: list[BenchRow]
    checks: list[CheckRow]
    bench_path: Path

    @property
    def passed(self) -> bool:
        """The audit gates the bench: a timed path that computes other bits fails it."""
        return all(c.passed for c in self.checks)


def run_bench(config: BenchConfig, command: str = "", phases: Phases | None = None) -> BenchOutcome:
    """The bench; its run id is held by this process (harness/store/claim.py) from the plan,
    before Ray starts, to the end of the run. `phases` may already hold what came before it (the
    command's imports)."""
    with ExitStack() as held:
        return _bench(config, command, held, phases or Phases())


def _bench(config: BenchConfig, command: str, held: ExitStack, phases: Phases) -> BenchOutcome:
    started = now()
    results = Path(config.results)
    with phases("plan"):
        kind = resolve_accelerator(config.accelerator)
        check_cards(config.cards, kind, cluster_address(config.address))
        specs, policies = load_policies(config)
        check_memory(estimate(config, policies, expected_cards(kind, config)), config.max_memory_gib)
        writer = RunWriter(held.enter_context(claim_run_id(results, config.run_id, command=command)))
        run_id = writer.run_id
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
        faults = parse_faults(config.inject_fault)
        windows = Windows.of(config)
    n_placed = config.cards or (max(config.card_counts) if config.card_counts else None)
    refuse_absent_cards(faults, n_placed or planned_cards(kind, config), cards_source(config))

    with bench_cards(
        config.address, kind, n_placed, specs, policies, config.threads, config.precision, phases, faults
    ) as cards:
        run_row = new_run_row(
            started_at=started,
            status="running",
            accelerator=kind,
            n_cards=len(cards),
            devices=[c.description for c in cards],
            config_json=config.to_json(),
            policies=policies,
            command=command,
            faults=",".join(map(str, faults)),
        )
        writer.begin(run_row)
        steps = sorted(set(config.card_counts or [1, len(cards)]))
        bar = tqdm(
            total=len(work) * (len(cards) + 2 * len(steps)) + len(loops),
            desc="bench",
            unit="step",
            disable=not config.progress,
            file=sys.stderr,
        )
        # Each mode timed on its own (runs.summary.timings_s): what a bench spends where.
        with phases("latency"):
            measured = _latency(cards, work, windows, bar)
        with phases("throughput"):
            measured += measure_scaling(cards, steps, work, windows, bar)
        with phases("closed_loop"):
            measured += _closed_loop(cards[0], loops, config, windows, bar)
        with phases("server"):
            measured += measure_server(cards, steps, work, measured, config, windows, bar)
        bar.close()
        with phases("audit"):
            checks = audit(measured)

    rows = [m.row for m in measured]
    with phases("write"):
        summary = {
            "bench_rows": len(rows),
            "invalid_rows": sum(not r.valid for r in rows),
            "card_steps": steps,
            "audit": {"checks": len(checks), "failed": sum(not c.passed for c in checks)},
        }
        tables = {
            "bench": to_table("bench", rows),
            "bench_samples": columns_table("bench_samples", sample_table(measured)),
            "checks": to_table("checks", checks),
        }
        writer.publish(tables, finish_run_row(run_row, "bench", summary, phases))
    print_bench_summary(rows, checks, run_id, sys.stdout)
    said_at_the_end(run_id, config.results, phases)
    return BenchOutcome(run_id, rows, checks, table_dir(results, "bench", run_id) / "part-0.parquet")


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
    faults: list[Fault] | None = None,
) -> Iterator[list[BenchCard]]:
    """Join or start Ray, place `cards` BenchActors (default: all the cluster has), and shut
    Ray down afterwards. The benchmarks use this too."""
    phases = phases or Phases()
    with ray_cluster(address, kind, cards, phases) as n_cards:
        refuse_absent_cards(faults or [], n_cards, "all the cluster has")
        with phases("actors"):
            placed = place_bench(kind, n_cards, specs, policies, threads, precision, faults or [])
        yield placed


# ---- latency ------------------------------------------------------------------------------------


def _latency(cards: list[BenchCard], work: list[Measured], windows: Windows, bar: tqdm) -> list[Measurement]:
    """Each card alone, one after another: device time, then end to end through Ray."""
    measured = []
    for w in work:
        for card in cards:
            measured += [_device_latency(card, w, windows), _end_to_end_latency(card, w, windows)]
            bar.update(1)
    return measured


def _device_latency(card: BenchCard, w: Measured, windows: Windows) -> Measurement:
    runs = []

    def measure(n: int) -> list[LatencyWindow]:
        runs.append(
            ray.get(
                card.actor.latency(w.policy, w.dtype, w.batch.obs, w.batch.noise, n, windows.seconds, windows.min_iterations)
            )
        )
        return list(runs[-1].windows)

    starved_window = partial(_starved, card)
    timed = repeat_windows(measure, starved_window, windows.count)
    m = latency_measurement(w, card.label, "device", runs[0].first_call_ms, timed, [starved_window(t) for t in timed], windows)
    m.audit.append(AuditSample(m.row.row_id, card, w, runs[-1].last))
    return m


def _starved(card: BenchCard, window: LatencyWindow | ClosedLoop) -> bool:
    return card.one_core and is_starved(window.cpu_share)


def _end_to_end_latency(card: BenchCard, w: Measured, windows: Windows) -> Measurement:
    # The device row warmed this batch up: the first round trip is Ray's first, not the card's.
    run = measure_latency(partial(_round_trip, card, w), _no_sync, windows.count, windows.seconds, windows.min_iterations)
    return latency_measurement(
        w, card.label, "end_to_end", run.first_call_ms, list(run.windows), [False] * windows.count, windows
    )


def _round_trip(card: BenchCard, w: Measured) -> Outputs:
    # The batch goes through Ray on every call: shipping it is part of the end-to-end time.
    outputs: Outputs = ray.get(card.actor.run_batch(w.policy, w.dtype, w.batch.obs, w.batch.noise))
    return outputs


def _no_sync() -> None:
    """ray.get returns numpy already copied off the card: nothing is left queued to wait for."""


def latency_measurement(
    w: Measured,
    device: str,
    timing: str,
    first_call_ms: float | None,
    timed: list[LatencyWindow],
    bad: list[bool],
    windows: Windows,
) -> Measurement:
    """p50, p95, p99 and the mean pool the calls of the kept windows; the interval is of the
    median of the windows' own p50s."""
    kept = kept_windows(bad, windows.count)
    used = [t for t, k in zip(timed, kept, strict=True) if k]
    pooled = np.concatenate([t.times_ms for t in used])
    p50, p95, p99 = quantiles(pooled, [0.5, 0.95, 0.99])
    _, interval = median_of_windows([quantiles(t.times_ms, [0.5])[0] for t in used], windows)
    reasons = [
        *windows.reasons(bad.count(False), len(timed), [len(t.times_ms) for t in used]),
        too_few_for_percentile(len(pooled), 0.99),
        windows.disagree(p50, interval, "p50"),
    ]
    row_id = f"latency/{timing}/{w.policy}/{w.dtype}/b{w.batch.size}/{device}"
    device_timed = timing == "device"
    p99_interval = quantile_interval(pooled, 0.99)
    detail: dict[str, object] = {
        "input_sha256": w.batch.sha256,
        "window_s": windows.seconds,
        "iterations": [len(t.times_ms) for t in used],
        "windows_measured": len(timed),
        "p99_interval_ms": [p99_interval.low, p99_interval.high] if p99_interval else None,
    }
    if not device_timed:
        detail["first_call"] = "after the device row's warm-up: first round trip of this batch"
    mean_ms = float(pooled.mean())
    row = judged_row(
        row_id=row_id,
        policy=w.policy,
        dtype=w.dtype,
        batch_size=w.batch.size,
        mode="latency",
        timing=timing,
        device=device,
        reasons=reasons,
        ci_of="p50_ms",
        interval=interval,
        detail=detail,
        first_call_ms=first_call_ms,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        mean_ms=mean_ms,
        decisions_per_s=w.batch.size / (mean_ms / 1e3),
        windows=len(used),
        cpu_share=statistics.median(t.cpu_share for t in used) if device_timed else None,
    )
    counts = [len(t.times_ms) for t in timed]
    samples = sample_columns(
        row_id,
        window_index=np.repeat(np.arange(len(timed)), counts).tolist(),
        device=[device] * sum(counts),
        kept=np.repeat(kept, counts).tolist(),
        latency_ms=np.concatenate([t.times_ms for t in timed]),
        cpu_share=np.repeat([t.cpu_share if device_timed else None for t in timed], counts).tolist(),
        sample=np.concatenate([np.arange(c) for c in counts]),
    )
    return Measurement(row, samples)


# ---- throughput: k cards at once, in rounds ------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """One round of throughput windows: for each card count k, the k cards' shares of its window."""

    index: int
    windows: dict[int, list[Throughput]]
    starved: bool


def round_schedule(
    steps: list[int], n_rounds: int, first_round: int, seconds: float, gap_s: float
) -> list[tuple[int, int, float]]:
    """(round, k, start offset in seconds) of each window: rounds one after another, each with a
    window per card count, ascending in even rounds and descending in odd ones, so that load
    which grows or fades through a round falls on both sides of the ratio alike."""
    entries, offset = [], 0.0
    for r in range(first_round, first_round + n_rounds):
        for k in steps if r % 2 == 0 else steps[::-1]:
            entries.append((r, k, offset))
            offset += seconds + gap_s
    return entries


def measure_scaling(
    cards: list[BenchCard], steps: list[int], work: list[Measured], windows: Windows, bar: tqdm
) -> list[Measurement]:
    """For each batch, rounds of windows: in each round the first k cards run the same batch at
    once for one window, for every k of `steps`."""
    measured = []
    for w in work:
        measured += _scaling(cards[: max(steps)], steps, w, windows)
        bar.update(len(steps))
    return measured


def _scaling(group: list[BenchCard], steps: list[int], w: Measured, windows: Windows) -> list[Measurement]:
    obs, noise = ray.put(w.batch.obs), ray.put(w.batch.noise)  # one copy for all cards
    call_ms = max(ray.get([c.actor.warm_up(w.policy, w.dtype, obs, noise) for c in group]))
    seconds = max(windows.seconds, HEADROOM * windows.min_iterations * call_ms / 1e3)
    gap_s = GAP_S + 2 * call_ms / 1e3
    seen: list[Round] = []
    last: dict[str, Outputs] = {}

    def measure(n: int) -> list[Round]:
        got, outputs = _rounds(group, steps, w, obs, noise, n, len(seen), seconds, gap_s)
        seen.extend(got)
        last.update(outputs)
        return got

    rounds = repeat_windows(measure, lambda r: r.starved, windows.count)
    measured = scaling_measurements(w, group, steps, rounds, windows, seconds)
    top = measured[-1]  # every card of the group ran its windows
    top.audit += [AuditSample(top.row.row_id, c, w, last[c.label]) for c in group]
    return measured


def _rounds(
    group: list[BenchCard],
    steps: list[int],
    w: Measured,
    obs: ray.ObjectRef,
    noise: ray.ObjectRef,
    n_rounds: int,
    first_round: int,
    seconds: float,
    gap_s: float,
) -> tuple[list[Round], dict[str, Outputs]]:
    """Run `n_rounds` rounds, every card given its own part of one schedule; with each card's
    last outputs."""
    entries = round_schedule(steps, n_rounds, first_round, seconds, gap_s)
    start = time.time() + START_DELAY_S
    mine = [[(r, k, start + offset) for r, k, offset in entries if k > i] for i in range(len(group))]
    results = ray.get(
        [
            c.actor.throughput(w.policy, w.dtype, obs, noise, [(at, seconds) for _, _, at in part])
            for c, part in zip(group, mine, strict=True)
        ]
    )
    shares: dict[tuple[int, int], list[Throughput]] = {}
    for part, (timed, _) in zip(mine, results, strict=True):
        for (r, k, _), t in zip(part, timed, strict=True):
            shares.setdefault((r, k), []).append(t)
    rounds = []
    for r in range(first_round, first_round + n_rounds):
        windows = {k: shares[r, k] for k in steps}
        bad = any(c.one_core and is_starved(t.cpu_share) for k in steps for c, t in zip(group, windows[k], strict=False))
        rounds.append(Round(r, windows, bad))
    return rounds, {c.label: last for c, (_, last) in zip(group, results, strict=True)}


def scaling_measurements(
    w: Measured, group: list[BenchCard], steps: list[int], rounds: list[Round], windows: Windows, seconds: float
) -> list[Measurement]:
    """A row per card count: decisions/s is the median over kept rounds of the k cards' sum;
    scaling efficiency the median over kept rounds of tput(k) / (k * tput(1)) in that round."""
    kept = kept_windows([r.starved for r in rounds], windows.count)
    used = [r for r, k in zip(rounds, kept, strict=True) if k]
    clean = sum(not r.starved for r in rounds)
    totals = {k: [sum(t.decisions_per_s for t in r.windows[k]) for r in used] for k in steps}
    measured = []
    for k in steps:
        tput, interval = median_of_windows(totals[k], windows)
        reasons = [
            *windows.reasons(clean, len(rounds), [t.calls for r in used for t in r.windows[k]]),
            windows.disagree(tput, interval, "decisions/s"),
        ]
        efficiency, scaling = None, None
        if 1 in steps:
            efficiency, scaling = median_of_windows(
                round_efficiencies(np.asarray(totals[1]), np.asarray(totals[k]), k).tolist(), windows
            )
            if k > 1:
                reasons += [
                    windows.disagree(efficiency, scaling, "scaling efficiency"),
                    efficiency_above_one(scaling) if scaling else None,
                ]
            scaling = scaling if k > 1 else None
        cards = group[:k]
        shares = [statistics.median(r.windows[k][i].cpu_share for r in used) for i in range(k)]
        detail = {
            "window_s": round(seconds, 4),
            "input_sha256": w.batch.sha256,
            "rounds_measured": len(rounds),
            "per_card_decisions_per_s": [
                round(statistics.median(r.windows[k][i].decisions_per_s for r in used), 1) for i in range(k)
            ],
            "per_card_cpu_share": [round(s, 3) for s in shares],
        }
        calls = sum(t.calls for r in used for t in r.windows[k])
        row = judged_row(
            row_id=f"throughput/{w.policy}/{w.dtype}/b{w.batch.size}/k{k}",
            policy=w.policy,
            dtype=w.dtype,
            batch_size=w.batch.size,
            mode="throughput",
            timing="device",
            device=",".join(c.label for c in cards),
            n_cards=k,
            reasons=reasons,
            ci_of="decisions_per_s",
            interval=interval,
            detail=detail,
            mean_ms=sum(t.elapsed_s for r in used for t in r.windows[k]) / calls * 1e3,
            decisions_per_s=tput,
            scaling_efficiency=efficiency,
            scaling=scaling,
            windows=len(used),
            cpu_share=min(shares) if all(c.simulated for c in cards) else None,
        )
        cells = [(i, r, c, t) for i, r in enumerate(rounds) for c, t in zip(cards, r.windows[k], strict=True)]
        samples = sample_columns(
            row.row_id,
            window_index=[r.index for _, r, _, _ in cells],
            device=[c.label for _, _, c, _ in cells],
            kept=[kept[i] for i, _, _, _ in cells],
            decisions_per_s=[t.decisions_per_s for _, _, _, t in cells],
            cpu_share=[t.cpu_share for _, _, _, t in cells],
        )
        measured.append(Measurement(row, samples))
    return measured


# ---- closed loop ------------------------------------------------------------------------------------


def _closed_loop(
    card: BenchCard, loops: list[tuple[str, EnvSpec, str, int]], config: BenchConfig, windows: Windows, bar: tqdm
) -> list[Measurement]:
    """Episodes of each policy's environment in lockstep on one card, one forward per step; each
    window plays the same seeded episodes."""
    measured = []
    for loop in loops:
        measured.append(_closed_loop_measurement(card, *loop, config, windows))
        bar.update(1)
    return measured


def _closed_loop_measurement(
    card: BenchCard, policy: str, env: EnvSpec, dtype: str, n_envs: int, config: BenchConfig, windows: Windows
) -> Measurement:
    impl = None if config.env_impl == "auto" else config.env_impl

    def measure(n: int) -> list[ClosedLoop]:
        runs: list[ClosedLoop] = ray.get(
            card.actor.closed_loop(policy, dtype, env, impl, n_envs, config.seed, windows.seconds, n)
        )
        return runs

    starved_window = partial(_starved, card)
    timed = repeat_windows(measure, starved_window, windows.count)
    bad = [starved_window(t) for t in timed]
    kept = kept_windows(bad, windows.count)
    used = [t for t, k in zip(timed, kept, strict=True) if k]
    dps, interval = median_of_windows([t.decisions_per_s for t in used], windows)
    reasons = [
        *windows.reasons(bad.count(False), len(timed), [t.steps for t in used]),
        windows.disagree(dps, interval, "decisions/s"),
    ]
    returns = timed[0].returns
    row_id = f"closed_loop/{policy}/{dtype}/b{n_envs}/{card.label}"
    detail = {
        "env_impl": config.env_impl,
        "env_id": env.key,
        "episodes": len(returns),
        "first_seed": config.seed,
        "mean_return": float(returns.mean()),
        "min_return": float(returns.min()),
        "window_s": windows.seconds,
        "windows_measured": len(timed),
    }
    row = judged_row(
        row_id=row_id,
        policy=policy,
        dtype=dtype,
        batch_size=n_envs,
        mode="closed_loop",
        timing="device",
        device=card.label,
        reasons=reasons,
        ci_of="decisions_per_s",
        interval=interval,
        detail=detail,
        mean_ms=sum(t.elapsed_s for t in used) / sum(t.steps for t in used) * 1e3,  # a lockstep step: forward and env step
        decisions_per_s=dps,
        windows=len(used),
        cpu_share=statistics.median(t.cpu_share for t in used) if card.simulated else None,
    )
    samples = sample_columns(
        row_id,
        window_index=list(range(len(timed))),
        device=[card.label] * len(timed),
        kept=kept,
        decisions_per_s=[t.decisions_per_s for t in timed],
        cpu_share=[t.cpu_share for t in timed],
    )
    return Measurement(row, samples)


# ---- the audit: the timed path against the sweep's ------------------------------------------------


def audit(measured: list[Measurement]) -> list[CheckRow]:
    """Every sampled output of the timed path against the same card's `run_batch` (the sweep's
    path) on the same input, bit for bit: a `bench_audit` check per output."""
    reference: dict[tuple[str, str, str, str], Outputs] = {}
    rows = []
    for m in measured:
        for s in m.audit:
            w = s.work
            key = (s.card.label, w.policy, w.dtype, w.batch.sha256)
            if key not in reference:
                reference[key] = ray.get(s.card.actor.run_batch(w.policy, w.dtype, w.batch.obs, w.batch.noise))
            rows += [
                check_row(
                    check,
                    unit_id=s.row_id,
                    policy=w.policy,
                    dtype=w.dtype,
                    workload=w.batch.name,
                    input_sha256=w.batch.sha256,
                )
                for check in judge_bench_audit(s.card.label, s.outputs, reference[key])
            ]
    return rows
