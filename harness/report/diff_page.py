"""The page of `harness report --compare RUN_A RUN_B --out DIR`: the same kind of page as one run's
sign-off page, for what changed from A to B. How the two runs were made differently comes first,
then the grid of verdicts A -> B, then what got worse (a part with nothing in it is left out and
the header says so in its counts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from harness.judge.kinds import CheckKind
from harness.report.page import Cell, Content, PageSection, as_text, Table, document, policy_cell, verdict_class
from harness.report.run_diff import RunDiff
from harness.report.run_page import GridCell, GridRow, first_mismatch, grid_data, layer_text
from harness.report.run_report import Report, build_report
from harness.report.names import PolicyNames
from harness.report.summary import Group, summarize


def write_diff_page(con: duckdb.DuckDBPyConnection, diff: RunDiff, results: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"compare-{diff.run_a}-{diff.run_b}.html"
    reports = (build_report(con, diff.run_a, results), build_report(con, diff.run_b, results))
    # One label per policy across both runs, so a policy reads alike in A and B.
    names = PolicyNames.of([*reports[0].names.labels, *reports[1].names.labels])
    sections = [
        _differences_section(diff),
        _grid_section(diff, names),
        _table_section(
            "newly-failed", "Checks that passed in A and fail in B", diff.newly_failed, names, "first mismatch in B"
        ),
        _table_section(
            "errors-grew", f"Errors (max_abs) that grew more than {diff.thresholds.error_factor:g}x", diff.errors_grew, names
        ),
        _table_section(
            "throughput-dropped",
            f"Throughput that dropped more than {diff.thresholds.drop_percent:g}%",
            diff.throughput_dropped,
            names,
        ),
    ]
    shown = [s for s in sections if s is not None]
    title = f"harness compare {diff.run_a} -> {diff.run_b}: {'REGRESSED' if diff.regressed else 'no regression'}"
    footer = {"command": f"harness report --compare {diff.run_a} {diff.run_b} --results {results}"}
    path.write_text(
        document("diff_page.html.j2", title, shown, header=_header(diff, reports), footer=footer), encoding="utf-8"
    )
    return path


def _header(diff: RunDiff, reports: tuple[Report, Report]) -> dict[str, Any]:
    badge = "REGRESSED" if diff.regressed else "NO REGRESSION"
    counts = (
        f"{diff.newly_failed.num_rows} checks now fail, {diff.errors_grew.num_rows} errors grew, "
        f"{diff.throughput_dropped.num_rows} throughputs dropped; {diff.matched_checks} checks matched"
    )
    return {
        "badge": badge,
        "class_": badge.lower().replace(" ", "-"),
        "title": f"compare {diff.run_a} → {diff.run_b}",
        "counts": counts,
        "runs": [(side, f"run {r.run_id}, {r.verdict} ({r.counts()})") for side, r in zip("AB", reports, strict=True)],
    }


def _differences_section(diff: RunDiff) -> PageSection:
    differences = diff.differences
    if not differences:
        return PageSection("differences", "How the runs differ", "differences", {"table": None})
    rows: list[list[Content]] = [[d.what, Cell(d.a, fold=100), Cell(d.b, fold=100)] for d in differences]
    lede = (
        f"{len(differences)} differences in how the runs were made. Checks are matched only where both runs have the "
        "same unit (its policy, dtype, workload and seed), output, kind and devices; the rest is compared by nothing."
    )
    return PageSection("differences", "How the runs differ", "differences", {"table": Table(["what", "A", "B"], rows)}, lede)


def _groups(checks: pa.Table) -> dict[tuple[str, str, str], Group]:
    judged = (
        checks.filter(pa.compute.not_equal(checks.column("kind"), str(CheckKind.BENCH_AUDIT))) if checks.num_rows else checks
    )
    return {(g.policy, g.dtype, g.kind): g for g in summarize(judged)} if judged.num_rows else {}


def _grid_section(diff: RunDiff, names: PolicyNames) -> PageSection | None:
    a, b = (_groups(c) for c in diff.checks)
    if not a and not b:
        return None
    keys = list(dict.fromkeys([*a, *b]))
    kinds = [k for k in CheckKind if any(key[2] == k for key in keys)]
    rows = []
    for policy, dtype in dict.fromkeys((p, d) for p, d, _ in keys):
        cells: list[GridCell | None] = []
        for kind in kinds:
            ga, gb = a.get((policy, dtype, kind)), b.get((policy, dtype, kind))
            if ga is None and gb is None:
                cells.append(None)
                continue
            va, vb = (g.verdict if g else "absent" for g in (ga, gb))
            attrs: dict[str, str | None] = {
                "class": f"cell {verdict_class(vb) if gb else 'none'}",
                "data-policy": policy,
                "data-dtype": dtype,
                "data-check": str(kind),
                "data-verdict-a": va.split(" ")[0],
                "data-verdict-b": vb.split(" ")[0],
            }
            cells.append(GridCell(vb, f"A: {va}", attrs))
        rows.append(GridRow(policy, names(policy), dtype, cells))
    lede = "Each cell: B's verdict, A's under it; absent where a run has no such check (another dtype, policy or card count)."
    grid = grid_data(rows, [str(k) for k in kinds], "grid", "in neither run")
    return PageSection("verdicts", "Verdicts: A → B", "grid", grid, lede)


# Rows shown before the rest of a table is folded.
SHOWN_ROWS = 20


def _table_section(anchor: str, title: str, rows: pa.Table, names: PolicyNames, detail_column: str = "") -> PageSection | None:
    """`rows` as a table; a `detail_column` is split as the run's page splits a detail: the first
    diverging layer and the first mismatch in their own columns, the whole text folded."""
    if not rows.num_rows:
        return None
    shown = [n for n in rows.column_names if n != detail_column]
    columns = [*shown, *(["first diverging layer", "first mismatch", ""] if detail_column else [])]
    body: list[list[Content]] = []
    for r in rows.to_pylist():
        cells: list[Content] = [policy_cell(r[n], names(r[n])) if n == "policy" else as_text(r[n]) for n in shown]
        if detail_column:
            detail = str(r[detail_column] or "")
            cells += [layer_text(detail), Cell(first_mismatch(detail), fold=90), Cell(detail, detail=True)]
        body.append(cells)
    data = {"table": Table(columns, body, shown=SHOWN_ROWS)}
    return PageSection(anchor, title, "changed", data, f"{rows.num_rows} rows")
