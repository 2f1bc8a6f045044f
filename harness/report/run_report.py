"""`harness report`: what one run found, in the terminal; the sign-off page (run_page.py) is drawn
from the same `Report`.

Everything is read through the DuckDB views of `harness.store.views`, a run that has not finished
with the units it has done so far (its staging). Numbers are formatted in SQL so the terminal and
the page show the same text. The verdict and the exit code follow the run (harness/judge/outcome.py).
"""

from __future__ import annotations

import functools
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import duckdb
import pyarrow as pa

from harness.dtypes import LABEL_ORDER
from harness.judge.kinds import CheckKind
from harness.judge.outcome import NO_RUN_ROW, Gating, RunStatus, Verdict, is_bench, run_verdict, unfinished
from harness.judge.verdicts import HONEST
from harness.report.names import PolicyNames
from harness.report.summary import batch_invariance_lines, gating_of, summarize, undecided
from harness.store.schema import RunSummary

# The policy's head, the output the reference ports report precision on.
HEAD_OUTPUTS = ("logits", "q_values", "mu")


def dtype_order(column: str = "dtype") -> str:
    """SQL ORDER BY terms: float32, float16, bfloat16 as a sweep lists them, then any other dtype."""
    return f"list_position({list(LABEL_ORDER)}, {column}) NULLS LAST, {column}"


@dataclass
class Section:
    """A table of the terminal report."""

    title: str
    table: pa.Table  # cells already formatted
    empty_note: str  # shown instead of an empty table


@dataclass
class RunRecord:
    """The run's `runs` row, its JSON columns parsed; a run with none (rows written by hand, an
    older bench) has status `unknown` and nothing else."""

    status: str = NO_RUN_ROW
    row: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    policies: list[dict[str, Any]] = field(default_factory=list)
    summary: RunSummary = field(default_factory=RunSummary)

    @property
    def faults(self) -> str:
        return str(self.row.get("faults") or "")

    def card_labels(self) -> tuple[str, ...]:
        """The cards, in the order the run lists them: every device but the CPU reference (kind
        cpu and not simulated, as harness/devices/cpu.py describes it)."""
        return tuple(str(d.get("label")) for d in self.devices if d.get("kind") != "cpu" or d.get("simulated"))

    def device_faults(self) -> dict[str, list[str]]:
        """Each card's label and the faults injected on it."""
        return {str(d.get("label")): [str(f) for f in d.get("faults") or []] for d in self.devices if d.get("faults")}


def _json(value: str | None, empty: Any) -> Any:
    try:
        return json.loads(value) if value else empty
    except ValueError:
        return empty


def run_record(con: duckdb.DuckDBPyConnection, run_id: str) -> RunRecord:
    rows = _rows(con, "SELECT * FROM runs WHERE run_id = $run_id", run_id).to_pylist()
    return record_of(rows[-1]) if rows else RunRecord()


def record_of(run: dict[str, Any]) -> RunRecord:
    """A `runs` row as a RunRecord."""
    return RunRecord(
        status=run["status"],
        row=run,
        config=_json(run["config_json"], {}),
        devices=_json(run["devices"], []),
        policies=_json(run["policies"], []),
        summary=RunSummary.read(run),
    )


@dataclass
class Report:
    run_id: str
    results: Path
    record: RunRecord
    checks: pa.Table  # every check of the run: committed, or the finished units of a run that has not finished
    bench: list[dict[str, Any]]
    sections: list[Section]

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def n_checks(self) -> int:
        return self.checks.num_rows

    @functools.cached_property
    def gating(self) -> Gating:
        return gating_of(self.checks)

    @property
    def n_gating(self) -> int:
        return self.gating.checks

    @property
    def n_failed(self) -> int:
        return self.gating.failed

    @property
    def n_inconclusive(self) -> int:
        """Closed-loop verdicts their episodes could not decide: never a pass; gating only with --require-conclusive."""
        return len(undecided(self.checks))

    @functools.cached_property
    def names(self) -> PolicyNames:
        """The labels of the run's policies: those it recorded, checked or benched."""
        checked = self.checks.column("policy").to_pylist() if self.n_checks else []
        recorded = [str(p.get("name")) for p in self.record.policies]
        return PolicyNames.of([*recorded, *checked, *(r["policy"] for r in self.bench)])

    @property
    def is_bench(self) -> bool:
        return is_bench(self.status, len(self.bench))

    @property
    def n_valid(self) -> int:
        return sum(1 for r in self.bench if r["valid"])

    @property
    def verdict(self) -> Verdict:
        return run_verdict(self.status, self.gating, len(self.bench))

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def unfinished(self) -> bool:
        return unfinished(self.status)

    @property
    def units_done(self) -> int:
        return len(set(self.checks.column("unit_id").to_pylist())) if self.n_checks else 0

    @property
    def units_planned(self) -> int | None:
        return self.record.summary.units

    @property
    def resumable(self) -> bool:
        return resumable(self.run_id, self.results, self.record)

    def resume_command(self) -> str:
        return resume_command(self.run_id, self.results, self.record)

    def counts(self) -> str:
        """What the verdict stands on, in a few words."""
        if self.is_bench:
            audit = "audit passed" if self.n_checks and not self.n_failed else f"audit: {self.n_failed} failed"
            none = ": none is a result" if not self.n_valid else ""
            return f"{self.n_valid} of {len(self.bench)} bench rows valid{none}; {audit} ({self.n_checks} outputs sampled)"
        text = f"{self.n_checks} checks, {self.n_gating} gating, {self.n_failed} failed"
        if self.n_inconclusive:
            text += f", {self.n_inconclusive} inconclusive"
        if self.unfinished:
            planned = f" of {self.units_planned}" if self.units_planned is not None else ""
            units = "unit" if self.units_done == 1 and not planned else "units"
            text = f"not finished: {self.units_done}{planned} {units} done; {text} so far"
        return text

    def headline(self) -> str:
        return f"run {self.run_id}: {self.verdict} (status {self.status}; {self.counts()})"

    def next_step(self) -> str:
        return next_step(self.run_id, self.results, self.record)

    def facts(self) -> list[tuple[str, str]]:
        """The run's provenance, as the terminal and the page's header list it."""
        run = self.record.row
        if not run:
            return []
        devices = ", ".join(
            f"{d.get('label', '?')} ({d.get('model', '?')}{', simulated' if d.get('simulated') else ''})"
            for d in self.record.devices
        )
        policies = ", ".join(
            f"{p.get('name')} ({p.get('source')}{', synthetic' if p.get('synthetic') else ''}, "
            f"sha256 {str(p.get('sha256'))[:12]})"
            for p in self.record.policies
        )
        return [
            ("started", f"{run['started_at']} (finished {run['finished_at'] or 'never'})"),
            ("host", run["hostname"]),
            ("accelerator", f"{run['accelerator']}, {run['n_cards']} cards"),
            ("devices", devices),
            ("policies", policies),
            ("versions", versions(run)),
            ("faults injected", run["faults"] or "none"),
            ("command", run["command"]),
        ]


def resumable(run_id: str, results: Path, record: RunRecord) -> bool:
    return unfinished(record.status) and (results / ".staging" / run_id).is_dir()


def resume_command(run_id: str, results: Path, record: RunRecord) -> str:
    """The command that finishes run `run_id`, as the sweep would have printed it."""
    tail = ["--resume", run_id, "--results", str(results)]
    address = record.config.get("address")
    if "jobs/sweep.py" in str(record.row.get("command") or ""):
        return "ray job submit --address http://DASHBOARD --working-dir . -- python jobs/sweep.py " + shlex.join(tail)
    return "harness sweep " + shlex.join([*tail, *(["--address", str(address)] if address else [])])


def next_step(run_id: str, results: Path, record: RunRecord) -> str:
    """For a run that has not finished: what its status means, how it is finished, or why it
    cannot be; every command that meets such a run (report, diagnose, repro) says this."""
    if not unfinished(record.status):
        return ""
    running = (
        "it is still running, or it stopped before it could record how it ended; "
        if record.status == RunStatus.RUNNING
        else ""
    )
    if resumable(run_id, results, record):
        return f"{running}finish it with: {resume_command(run_id, results, record)}"
    return f"{running}its staged units are gone from {results / '.staging'}: run it again"


def versions(run: dict[str, Any]) -> str:
    return (
        f"harness {run['harness_version']}, torch {run['torch_version']}, ray {run['ray_version']}, "
        f"git {run['git_revision'] or 'unknown'}"
    )


def _rows(con: duckdb.DuckDBPyConnection, sql: str, run_id: str) -> pa.Table:
    return con.sql(sql, params={"run_id": run_id}).to_arrow_table()


def _verdict_section(checks: pa.Table) -> Section:
    rows = [
        {
            "policy": g.policy,
            "dtype": g.dtype,
            "check": g.kind,
            "verdict": g.verdict,
            "checks": str(g.checks),
            "worst/limit": g.worst_text,
        }
        for g in summarize(checks)
    ]
    table = pa.Table.from_pylist(rows) if rows else pa.table({})
    return Section("Verdict per policy and dtype (PASS/FAIL gate; pass/finding do not)", table, "no checks in this run")


def _card_properties_section(checks: pa.Table) -> Section:
    lines = batch_invariance_lines(checks)
    table = pa.Table.from_pylist([{"card property": line} for line in lines]) if lines else pa.table({})
    return Section("Properties of the cards", table, "no batch invariance checks in this run")


def _not_passed_sql(gating: bool) -> str:
    # Batch invariance is the card's property, said once per card ("Properties of the cards").
    where = "gating" if gating else f"NOT gating AND kind <> '{CheckKind.BATCH_INVARIANCE}'"
    return f"""
SELECT policy, dtype, kind AS check, workload || '/' || output AS output,
       device_a || CASE WHEN device_b = '' THEN '' ELSE ' vs ' || device_b END AS devices, detail AS "first mismatch"
FROM checks WHERE run_id = $run_id AND NOT passed AND {where}
ORDER BY policy, {dtype_order()}, kind, workload, output, device_a
"""


PRECISION_SQL = f"""
SELECT policy, dtype, output, count(*)::VARCHAR AS checks,
       printf('%.3g', max(error_ratio)) AS "error_ratio (max)", printf('%.3g', max(max_ratio)) AS "max_ratio (max)",
       printf('%.3g', min(ratio_limit)) AS "limit (min)", printf('%.3g', max(golden_rmse)) AS "RMSE vs golden (max)",
       printf('%.3g', max(max_abs)) AS "max_abs vs golden (max)", printf('%.8f', min(cosine)) AS "cosine (min)",
       CASE WHEN bool_and(passed) THEN 'PASS' ELSE 'FAIL ' || count(*) FILTER (NOT passed) END AS verdict
FROM checks
WHERE run_id = $run_id AND kind = '{CheckKind.CPU_REFERENCE}' AND output IN {HEAD_OUTPUTS}
GROUP BY policy, dtype, output ORDER BY policy, {dtype_order()}
"""

STATE_SQL = f"""
SELECT policy, dtype, device_a AS card, split_part(output, '@', 1) AS state, split_part(output, '@', 2) AS steps,
       printf('%.3g', max(error_ratio)) AS "error_ratio (max)", printf('%.3g', max(golden_rmse)) AS "RMSE vs golden (max)",
       printf('%.3g', max(cpu_golden_rmse)) AS "the CPU's (max)", printf('%.3g', max(max_abs)) AS "max_abs vs golden (max)",
       CASE WHEN bool_and(passed) THEN 'within' ELSE 'beyond ' || count(*) FILTER (NOT passed) END AS "port rule"
FROM checks
WHERE run_id = $run_id AND kind = '{CheckKind.CPU_REFERENCE}' AND output LIKE 'state_%@%'
GROUP BY policy, dtype, device_a, output
ORDER BY policy, {dtype_order()}, device_a, split_part(output, '@', 1),
         try_cast(split_part(split_part(output, '@', 2), '-', 1) AS INTEGER)
"""

CLOSED_LOOP_SQL = f"""
WITH parting AS (
    SELECT policy, dtype, mode, batching, device, count(*) AS n, count(first_divergent_step) AS parted,
           median(first_divergent_step) AS median_step
    FROM episodes WHERE run_id = $run_id GROUP BY ALL
), rows AS (
    SELECT *, split_part(workload, '-', 2) AS mode, split_part(workload, '-', -1) AS batching
    FROM checks WHERE run_id = $run_id AND kind IN ('{CheckKind.EPISODE_RETURN}', '{CheckKind.PUBLISHED_RETURN}')
)
SELECT c.policy, c.dtype, c.mode, c.device_a || ' vs ' || c.device_b AS devices, c.n_elements::VARCHAR AS episodes,
       printf('%.4g [%.4g, %.4g]', c.return_a, c.return_a_low, c.return_a_high) AS "mean (95%)",
       printf('%.4g [%.4g, %.4g]', c.iqm_a, c.iqm_a_low, c.iqm_a_high) AS "IQM (95%)",
       printf('%.4g [%.4g, %.4g]', c.return_b, c.return_b_low, c.return_b_high) AS "its reference's mean (95%)",
       CASE WHEN c.iqm_b IS NULL THEN '' ELSE printf('%.4g [%.4g, %.4g]', c.iqm_b, c.iqm_b_low, c.iqm_b_high) END
           AS "its reference's IQM (95%)",
       printf('%.4g [%.4g, %.4g]', c.return_diff, c.return_diff_low, c.return_diff_high) AS "difference (95%)",
       printf('%.4g', -c.return_margin) AS "-margin",
       upper(c.outcome)
           || CASE WHEN c.episodes_needed IS NULL THEN '' ELSE ' (about ' || c.episodes_needed || ' episodes decide)' END
           AS verdict,
       CASE WHEN p.n IS NULL THEN '' ELSE p.parted || ' of ' || p.n
           || coalesce(' (median step ' || p.median_step || ')', '') END AS "card parts from the CPU",
       CASE WHEN h.n IS NULL THEN '' ELSE h.parted || ' of ' || h.n
           || coalesce(' (median step ' || h.median_step || ')', '') END AS "an honest port parts"
FROM rows c
LEFT JOIN parting p ON (p.policy, p.dtype, p.mode, p.batching, p.device) = (c.policy, c.dtype, c.mode, c.batching, c.device_a)
LEFT JOIN parting h ON (h.policy, h.dtype, h.mode, h.batching, h.device) = (c.policy, c.dtype, c.mode, c.batching, '{HONEST}')
ORDER BY c.policy, {dtype_order("c.dtype")}, c.mode, c.kind, c.device_a
"""

BENCH_SQL = f"""
SELECT mode, policy, dtype, device, n_cards::VARCHAR AS cards, batch_size::VARCHAR AS batch, timing,
       printf('%.3g', first_call_ms) AS "first call ms", printf('%.3g', p50_ms) AS "p50 ms",
       printf('%.3g', p95_ms) AS "p95 ms", printf('%.3g', p99_ms) AS "p99 ms",
       printf('%.0f', decisions_per_s) AS "decisions/s", printf('%.0f', max_qps) AS "max qps",
       CASE WHEN ci_low IS NULL THEN NULL ELSE ci_of || ' ' || printf('%.4g', ci_low) || ' to ' || printf('%.4g', ci_high)
       END AS "95% interval",
       printf('%.3f', scaling_efficiency) || coalesce(printf(' [%.3f, %.3f]', scaling_ci_low, scaling_ci_high), '')
           AS "efficiency (95%)",
       CASE WHEN valid THEN 'yes' ELSE 'NO: ' || invalid_reason END AS valid
FROM bench WHERE run_id = $run_id
ORDER BY mode, policy, {dtype_order()}, n_cards, batch_size, device, timing
"""


def build_report(con: duckdb.DuckDBPyConnection, run_id: str, results: Path) -> Report:
    """`con` from `connect(results, staged=True)`, so a run that has not finished shows its finished units."""
    record = run_record(con, run_id)
    checks = _rows(con, "SELECT * FROM checks WHERE run_id = $run_id", run_id)
    bench = _rows(con, "SELECT * FROM bench WHERE run_id = $run_id", run_id).to_pylist()
    sections = [_verdict_section(checks)] if checks.num_rows else []
    if any(k != CheckKind.BENCH_AUDIT for k in checks.column("kind").to_pylist()):
        sections += [
            Section("Failed checks (these gate the run)", _rows(con, _not_passed_sql(True), run_id), "none failed"),
            Section("Findings (reported, not gating)", _rows(con, _not_passed_sql(False), run_id), "none"),
            _card_properties_section(checks),
            Section(
                "Is the port right: the head's error against the float64 golden, over the CPU's own in that dtype",
                _rows(con, PRECISION_SQL, run_id),
                "no cpu_reference checks of the policy's head",
            ),
            Section(
                "A recurrent policy's state against the float64 golden, by the steps its episode has run: does its error "
                "stay bounded? (findings; the whole state gates)",
                _rows(con, STATE_SQL, run_id),
                "no recurrent policy in this run",
            ),
            Section(
                "Closed loop: returns as distributions (mean and IQM with 95% intervals), the paired difference against "
                "the margin (PASS above it, FAIL below, INCONCLUSIVE across), and where trajectories part from the CPU's "
                "next to where an honest port's do",
                _rows(con, CLOSED_LOOP_SQL, run_id),
                "no closed-loop verdicts in this run",
            ),
        ]
    if bench:
        sections.append(Section("Benchmarks", _rows(con, BENCH_SQL, run_id), "no bench rows"))
    return Report(run_id, results, record, checks, bench, sections)


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def text_table(table: pa.Table) -> str:
    """Plain aligned columns: a report is read, not parsed (`harness query` gives CSV and JSON)."""
    names = table.column_names
    cells = [[_cell(v) for v in row.values()] for row in table.to_pylist()]
    widths = [max(len(n), *(len(r[i]) for r in cells)) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def print_sections(sections: list[Section], out: TextIO) -> None:
    for section in sections:
        print(f"\n{section.title}", file=out)
        print(text_table(section.table) if section.table.num_rows else f"  ({section.empty_note})", file=out)


def print_report(report: Report, out: TextIO) -> None:
    print(report.headline(), file=out)
    if report.next_step():
        print(f"  {report.next_step()}", file=out)
    for key, value in report.facts():
        print(f"  {key + ':':<17} {value}", file=out)
    print_sections(report.sections, out)
