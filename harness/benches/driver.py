"""The driver of `harness bench`, in the order a bench happens:

the plan resolved (harness/sweeps/resolve.py: checked, policies loaded) -> its batches and
environments -> join or start Ray -> place one BenchActor per card (or set up the warm cards of
`harness up`, harness/cluster/warm.py) -> each registered mode
(harness/benches/registry.py: latency, throughput, closed loop, server) measures, and each
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

from harness.devices import Kind
from harness.judge.outcome import Gating, RunStatus, Verdict, run_verdict
from harness.policies import PolicyNet, PolicySpec
from harness.report.summary import print_bench_summary
from harness.benches.audit import audit
from harness.benches.modes import Bench, Mode
from harness.benches.registry import MODES
from harness.benches.rows import BenchResult, Measurement, sample_table
from harness.benches.windows import Windows
from harness.benches.work import Loop, Work
from harness.cluster.lifecycle import claim_run_id, finish_run_row, ray_cluster, said_at_the_end
from harness.config.command_plan import BenchPlan
from harness.cluster.phases import Phases
from harness.cluster import warm
from harness.cluster.place import BenchCard
from harness.sweeps.resolve import Resolved, complete
from harness.cluster.provenance import new_run_row, now
from harness.store.paths import table_dir
from harness.store.schema import BenchAudit, BenchRow, CheckRow, RunSummary
from harness.store.writer import RunWriter, columns_table, to_table
from harness.workloads import make_batch


@dataclass
class BenchOutcome:
    run_id: str
    rows: list[BenchRow]
    checks: list[CheckRow]
    bench_path: Path

    @property
    def verdict(self) -> Verdict:
        """The audit gates the bench: a timed path that computes other bits fails it."""
        gating = Gating.count((c.gating, c.passed) for c in self.checks)
        return run_verdict(RunStatus.BENCH, gating, len(self.rows), ending=True)

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.BENCH


def run_bench(resolved: Resolved[BenchPlan], command: str = "", phases: Phases | None = None) -> BenchOutcome:
    """The bench of a plan resolved before Ray starts (harness/sweeps/resolve.py); its run id is
    held by this process (harness/store/claim.py) from here to the end of the run. `phases` may
    already hold what came before it (the command's imports, the resolving)."""
    with ExitStack() as held:
        return _bench(resolved, command, held, phases or Phases())


def _bench(resolved: Resolved[BenchPlan], command: str, held: ExitStack, phases: Phases) -> BenchOutcome:
    plan, kind, specs, policies = resolved.plan, resolved.kind, resolved.specs, resolved.policies
    started = now()
    results = plan.common.results
    with phases("plan"):
        writer = RunWriter(held.enter_context(claim_run_id(results, plan.common.run_id, command=command)))
        run_id = writer.run_id
        work = [
            Work(name, dtype, make_batch(p.info, "normal", size, plan.common.seed))
            for name, p in policies.items()
            for dtype in plan.common.dtypes
            for size in plan.common.batch_sizes
        ]
        loops = [
            Loop(name, env, dtype, size)
            for name, env in resolved.envs.items()
            for dtype in plan.common.dtypes
            for size in plan.common.batch_sizes
        ]
        faults = plan.common.faults
        windows = Windows.of(plan)

    with ray_cluster(plan.common.address, kind, resolved.cards.asked, phases) as joined:
        complete(resolved, joined.n_cards)
        with phases("actors"):
            cards = warm.place_for_bench(
                kind, joined.n_cards, specs, plan.common.threads, plan.common.precision, faults, policies, run_id
            )
        run_row = new_run_row(
            started_at=started,
            status=RunStatus.RUNNING,
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
        summary = RunSummary(
            bench_rows=len(rows),
            invalid_rows=sum(not r.valid for r in rows),
            card_steps=steps,
            audit=BenchAudit(len(checks), sum(not c.passed for c in checks)),
        )
        writer.publish(bench_tables(measured, checks), finish_run_row(run_row, RunStatus.BENCH, summary, phases))
    outcome = BenchOutcome(run_id, rows, checks, table_dir(results, "bench", run_id) / "part-0.parquet")
    print_bench_summary(rows, checks, run_id, outcome.verdict, sys.stdout)
    said_at_the_end(run_id, plan.common.results, phases)
    return outcome


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
    """Join or start Ray, place `cards` BenchActors without faults (default: all the cluster
    has), and shut Ray down afterwards: the benchmarks' cards, outside any plan."""
    phases = phases or Phases()
    with ray_cluster(address, kind, cards, phases) as joined:
        with phases("actors"):
            placed = warm.place_for_bench(kind, joined.n_cards, specs, threads, precision, (), policies, "a benchmark")
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
