"""The harness from Python: `harness.sweep(**options)` and `harness.bench(**options)`, what the
command line runs, for a notebook, a user's own pytest suite or an orchestration script.

Options are the command's, by name with underscores (`policy=["cartpole"]`, `batch_sizes=[8]`,
`max_memory=4`, or the field names `--help`'s TOML keys use: `policies`, `max_memory_gib`), with
the values a TOML file takes; `progress=False` hides the bar. A bad option raises `UsageError`
with the one line the command prints, before torch or Ray is imported. A run returns a
`RunResult`: its id, status, exit code, summary and tables; a run that stops early (a lost card,
Ray that did not start, a full disk, Ctrl-C) returns too, with its status and the options that
finish it. Light on purpose: `import harness` imports this module only when asked for it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config.fields import config_from, given_by_mapping
from harness.config.options import BenchConfig, SweepConfig, validate

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class RunResult:
    """A finished (or stopped) run, as the `runs` table records it, with its tables at hand."""

    run_id: str
    status: str
    """A RunStatus: passed, failed, bench (a bench that ran), incomplete or interrupted (resumable)."""
    exit_code: int
    """What the command exits with (harness/judge/outcome.py): 0 passed, 1 failed, 3 incomplete, 130 interrupted."""
    results: Path
    resume_args: tuple[str, ...] = ()
    """Where the run stopped early and can be finished: the options that finish it."""
    reason: str = ""
    """Why it stopped early, in one line, where the summary does not say."""
    dashboard: str = ""
    """The cluster's dashboard (host:port) where it has one: where a Ray job's resume is submitted."""
    row: Mapping[str, Any] = field(default_factory=dict)
    """The run's `runs` row as it was written last (empty where the run stopped before one was)."""

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def summary(self) -> Mapping[str, Any]:
        """The `runs` row's summary: units, phase timings, events, what was lost."""
        return dict(json.loads(self.row.get("summary") or "{}"))

    def table(self, name: str) -> pa.Table:
        """This run's rows of table `name` (checks, episodes, bench, ...), as Parquet holds them
        once the run published them; an empty table before that."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from harness.store.paths import table_dir
        from harness.store.schema import SCHEMAS

        folder = table_dir(self.results, name, self.run_id)
        table = pq.read_table(folder, schema=SCHEMAS[name]) if folder.is_dir() else SCHEMAS[name].empty_table()
        # The run id is the folder's name (hive partitioning): a column here, as `harness query` shows it.
        return table.append_column("run_id", pa.array([self.run_id] * table.num_rows, pa.string()))

    def checks(self) -> pa.Table:
        return self.table("checks")

    def episodes(self) -> pa.Table:
        return self.table("episodes")

    def failures(self) -> list[str]:
        """Each failed gating check in one line: what a test of the user's own asserts on."""
        from harness.judge.outcome import fails_the_run

        rows = self.checks().to_pylist()
        return [
            f"{r['policy']} {r['dtype']} {r['kind']} {r['device_a']}: {r['detail']}"
            for r in rows
            if fails_the_run(r["gating"], r["passed"])
        ]


def sweep(**options: Any) -> RunResult:
    """`harness sweep` with `options`; the summary is printed as the command prints it."""
    given = given_by_mapping(SweepConfig, options, "harness.sweep()")
    return run_sweep_config(validate(config_from(SweepConfig, given)), called("harness.sweep", options), set(given.values))


def bench(**options: Any) -> RunResult:
    """`harness bench` with `options`."""
    config = validate(config_from(BenchConfig, given_by_mapping(BenchConfig, options, "harness.bench()")))
    return run_bench_config(config, called("harness.bench", options))


def called(function: str, options: Mapping[str, Any]) -> str:
    """The call as the runs table records it (its `command`), e.g. harness.sweep(policy=['cartpole'])."""
    return f"{function}({', '.join(f'{name}={value!r}' for name, value in options.items())})"


def run_sweep_config(config: SweepConfig, command: str, given: Collection[str] = ()) -> RunResult:
    """The sweep of a validated `config`, as `command` (what the runs table records) ran it;
    `given`: the options the caller set, which --resume holds to the run's own."""
    from harness.cluster.phases import Phases
    from harness.cluster.warm_record import adopt_auth
    from harness.config.command_plan import sweep_plan
    from harness.sweeps.resolve import resolve

    adopt_auth(config.address)
    plan = sweep_plan(config, given)
    phases = Phases()
    resolved = resolve(plan, phases)
    with phases("imports"):
        from harness.sweeps.driver import run_sweep

    outcome = run_sweep(resolved, command=command, phases=phases)
    code = outcome.verdict.exit_code
    stopped = (tuple(outcome.resume_args), outcome.reason, outcome.dashboard)
    return _with_junit(config.junit_xml, _result(outcome.run_id, outcome.status, code, plan.common.results, *stopped))


def run_bench_config(config: BenchConfig, command: str) -> RunResult:
    """The bench of a validated `config`."""
    from harness.cluster.phases import Phases
    from harness.cluster.warm_record import adopt_auth
    from harness.config.command_plan import bench_plan
    from harness.sweeps.resolve import resolve

    adopt_auth(config.address)
    plan = bench_plan(config)
    phases = Phases()
    resolved = resolve(plan, phases)
    with phases("imports"):
        from harness.benches import run_bench
        from harness.judge.outcome import RunStatus

    outcome = run_bench(resolved, command=command, phases=phases)
    code = outcome.verdict.exit_code
    return _with_junit(config.junit_xml, _result(outcome.run_id, RunStatus.BENCH, code, plan.common.results))


def _result(
    run_id: str, status: str, code: int, results: Path, resume: tuple[str, ...] = (), reason: str = "", dashboard: str = ""
) -> RunResult:
    from harness.store.writer import read_run

    try:
        rows = read_run(results, run_id)
    except FileNotFoundError:  # stopped before its row could be written
        rows = []
    return RunResult(run_id, status, code, results, resume, reason, dashboard, rows[-1] if rows else {})


def _with_junit(path: str | None, result: RunResult) -> RunResult:
    """--junit-xml PATH: the run's checks as JUnit XML, from the rows the result holds."""
    if path is not None:
        from harness.report.junit import junit

        junit(Path(path), result.run_id, result.status, result.row, result.checks().to_pylist())
    return result
