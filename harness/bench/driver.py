"""The driver of `harness bench`, in the order a bench happens:

load policies -> join or start Ray -> place one BenchActor per card -> each registered mode
(harness/bench/registry.py: latency, throughput, closed loop, server) measures, and each
measurement is judged by its mode's rules into a row -> the audit of the timed path -> publish
`bench`, `bench_samples`, `checks`, then the `runs` row that says the bench ended -> print the
summary.

Every measurement runs several windows (docs/bench.md): a row's figure is the median of its
windows' figures (a latency row's p95 and p99 pool the calls of its windows), its 95% interval comes
from their order statistics and its validity from the rules of harness/judge/bench_stats.py.
The clocks of device time, throughput and the closed loop run inside the actors; the driver
only times what it alone can see: end-to-end round trips and server requests.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from harness.devices import Kind, resolve_accelerator
from harness.envs.registry import check_env
from harness.envs.spec import EnvSpec
from harness.inference.fault_specs import Fault, refuse_absent_cards, refuse_maskless
from harness.policies import PolicyNet, PolicySpec
from harness.report.summary import print_bench_summary
from harness.bench.audit import audit
from harness.bench.modes import Bench, Mode
from harness.bench.registry import MODES
from harness.bench.rows import BenchResult, Measurement, sample_table
from harness.bench.windows import Windows
from harness.bench.work import Loop, Work
from harness.sweep.budget import cards_source, check_cards, check_memory, estimate, expected_cards, planned_cards
from harness.cluster.lifecycle import claim_run_id, finish_run_row, ray_cluster, said_at_the_end
from harness.config.command_plan import BenchPlan
from harness.cluster.phases import Phases
from harness.cluster import warm
from harness.cluster.place import BenchCard, cluster_address, place_bench
from harness.sweep.plan import load_policies
from harness.cluster.provenance import new_run_row, now
from harness.store.paths import table_dir
from harness.store.schema import BenchRow, CheckRow
from harness.store.writer import RunWriter, columns_table, to_table
from harness.workloads import make_batch


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


def run_bench(plan: BenchPlan, command: str = "", phases: Phases | None = None) -> BenchOutcome:
    """The bench; its run id is held by this process (harness/store/claim.py) from the plan,
    before Ray starts, to the end of the run. `phases` may already hold what came before it (the
    command's imports)."""
    with ExitStack() as held:
        return _bench(plan, command, held, phases or Phases())


def _bench(plan: BenchPlan, command: str, held: ExitStack, phases: Phases) -> BenchOutcome:
    started = now()
    results = plan.common.results
    with phases("plan"):
        kind = resolve_accelerator(plan.common.accelerator)
        check_cards(plan.common.cards, kind, cluster_address(plan.common.address))
        specs, policies = load_policies(plan.common)
        refuse_maskless(plan.common.faults, any(p.info.masked for p in policies.values()), list(policies))
        check_memory(estimate(plan, policies, expected_cards(kind, plan.common)), plan.common.max_memory_gib)
        writer = RunWriter(held.enter_context(claim_run_id(results, plan.common.run_id, command=command)))
        run_id = writer.run_id
        work = [
            Work(name, dtype, make_batch(p.info, "normal", size, plan.common.seed))
            for name, p in policies.items()
            for dtype in plan.common.dtypes
            for size in plan.common.batch_sizes
        ]
        envs = {name: env for name, p in policies.items() if (env := EnvSpec.played_by(p.info)) is not None}
        for name, env in envs.items():
            check_env(env, policies[name].info)
        loops = [
            Loop(name, env, dtype, size)
            for name, env in envs.items()
            for dtype in plan.common.dtypes
            for size in plan.common.batch_sizes
        ]
        faults = plan.common.faults
        windows = Windows.of(plan)
    n_placed = plan.common.cards or (max(plan.card_counts) if plan.card_counts else None)
    refuse_absent_cards(faults, n_placed or planned_cards(kind, plan.common), cards_source(plan.common))

    with bench_cards(
        plan.common.address, kind, n_placed, specs, policies, plan.common.threads, plan.common.precision, phases, faults
    ) as cards:
        run_row = new_run_row(
            started_at=started,
            status="running",
            accelerator=kind,
            n_cards=len(cards),
            devices=[c.described.record() for c in cards],
            config_json=plan.common.recorded,
            policies=policies,
            command=command,
            faults=",".join(map(str, faults)),
        )
        writer.begin(run_row)
        steps = sorted(set(plan.card_counts or [1, len(cards)]))
        bar = tqdm(disable=not plan.common.progress, desc="bench", unit="step", file=sys.stderr)
        bench = Bench(cards, steps, work, loops, plan, windows, bar)
        bar.reset(total=sum(mode.steps(bench) for mode in MODES))
        measured = measure(bench, MODES, phases)
        bar.close()
        with phases("audit"):
            checks = audit(measured)

    rows = [r.row for r in measured]
    with phases("write"):
        summary = {
            "bench_rows": len(rows),
            "invalid_rows": sum(not r.valid for r in rows),
            "card_steps": steps,
            "audit": {"checks": len(checks), "failed": sum(not c.passed for c in checks)},
        }
        writer.publish(bench_tables(measured, checks), finish_run_row(run_row, "bench", summary, phases))
    print_bench_summary(rows, checks, run_id, sys.stdout)
    said_at_the_end(run_id, plan.common.results, phases)
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
    faults: Sequence[Fault] = (),
) -> Iterator[list[BenchCard]]:
    """Join or start Ray, place `cards` BenchActors (default: all the cluster has), and shut
    Ray down afterwards. The benchmarks use this too."""
    phases = phases or Phases()
    with ray_cluster(address, kind, cards, phases) as joined:
        refuse_absent_cards(faults, joined.n_cards, "all the cluster has")
        warm.refuse_for_bench()
        with phases("actors"):
            placed = place_bench(kind, joined.n_cards, specs, policies, threads, precision, faults)
        yield placed


def measure(bench: Bench, modes: Sequence[Mode[Any]], phases: Phases) -> list[BenchResult]:
    """Every mode in turn, each timed on its own (runs.summary.timings_s: what a bench spends
    where), each given what the modes before it measured; each measurement judged by its
    mode's rules into a row."""
    measured: list[Measurement] = []
    results: list[BenchResult] = []
    for mode in modes:
        with phases(mode.name):
            got = mode.measure(bench, measured)
        measured += got
        results += mode.results(got)
    return results


def bench_tables(measured: list[BenchResult], checks: list[CheckRow]) -> dict[str, pa.Table]:
    """What a bench publishes: its rows, their raw samples and the audit's checks."""
    return {
        "bench": to_table("bench", [r.row for r in measured]),
        "bench_samples": columns_table("bench_samples", sample_table(measured)),
        "checks": to_table("checks", checks),
    }
