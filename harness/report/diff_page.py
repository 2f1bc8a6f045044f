"""The page of `harness report --compare RUN_A RUN_B --out DIR`: the same kind of page as one run's
sign-off page, for what changed from A to B. How the two runs were made differently comes first,
then the grid of verdicts A -> B, then what got worse (a part with nothing in it is left out and
the header says so in its counts)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from harness.judge.kinds import CheckKind
from harness.report.page import Html, PageSection, code, document, fold_long, folded, join, table, tag, text, verdict_class
from harness.report.run_diff import RunDiff
from harness.report.run_page import first_mismatch, layer_text
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
    footer = join(["Made by ", code(f"harness report --compare {diff.run_a} {diff.run_b} --results {results}"), "."])
    title = f"harness compare {diff.run_a} -> {diff.run_b}: {'REGRESSED' if diff.regressed else 'no regression'}"
    path.write_text(document(title, _header(diff, reports), shown, footer), encoding="utf-8")
    return path


def _header(diff: RunDiff, reports: tuple[Report, Report]) -> Html:
    badge = "REGRESSED" if diff.regressed else "NO REGRESSION"
    counts = (
        f"{diff.newly_failed.num_rows} checks now fail, {diff.errors_grew.num_rows} errors grew, "
        f"{diff.throughput_dropped.num_rows} throughputs dropped; {diff.matched_checks} checks matched"
    )
    runs = join(
        tag("div", join([tag("b", f"{side}: "), f"run {r.run_id}, {r.verdict} ({r.counts()})"]), class_="sub")
        for side, r in zip("AB", reports, strict=True)
    )
    lines = join([tag("h1", f"compare {diff.run_a} → {diff.run_b}"), tag("div", counts, class_="sub"), runs])
    return join([tag("div", badge, class_=f"badge {badge.lower().replace(' ', '-')}", id="verdict"), tag("div", lines)])


def _differences_section(diff: RunDiff) -> PageSection:
    differences = diff.differences
    if not differences:
        return PageSection(
            "differences",
            "How the runs differ",
            tag("p", "They were made alike: configuration, policies, versions and devices."),
        )
    rows = [[text(d.what), fold_long(d.a, 100), fold_long(d.b, 100)] for d in differences]
    lede = (
        f"{len(differences)} differences in how the runs were made. Checks are matched only where both runs have the "
        "same unit (its policy, dtype, workload and seed), output, kind and devices; the rest is compared by nothing."
    )
    return PageSection("differences", "How the runs differ", table(["what", "A", "B"], rows), lede)


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
        cells: list[Html] = [Html(f'<th title="{text(policy)}">{text(names(policy))}</th>'), tag("th", dtype)]
        for kind in kinds:
            ga, gb = a.get((policy, dtype, kind)), b.get((policy, dtype, kind))
            if ga is None and gb is None:
                cells.append(Html('<td class="none" title="in neither run">—</td>'))
                continue
            va, vb = (g.verdict if g else "absent" for g in (ga, gb))
            cells.append(
                tag(
                    "td",
                    join([tag("b", vb), tag("span", f"A: {va}")]),
                    class_=f"cell {verdict_class(vb) if gb else 'none'}",
                    data_policy=policy,
                    data_dtype=dtype,
                    data_check=str(kind),
                    data_verdict_a=va.split(" ")[0],
                    data_verdict_b=vb.split(" ")[0],
                )
            )
        rows.append(join(cells))
    head = join([tag("th", "policy"), tag("th", "dtype"), *(tag("th", str(k)) for k in kinds)])
    grid = tag("table", join([tag("thead", tag("tr", head)), tag("tbody", join(tag("tr", r) for r in rows))]), class_="grid")
    lede = "Each cell: B's verdict, A's under it; absent where a run has no such check (another dtype, policy or card count)."
    return PageSection("verdicts", "Verdicts: A → B", grid, lede)


# Rows shown before the rest of a table is folded.
SHOWN_ROWS = 20


def _table_section(anchor: str, title: str, rows: pa.Table, names: PolicyNames, detail_column: str = "") -> PageSection | None:
    """`rows` as a table; a `detail_column` is split as the run's page splits a detail: the first
    diverging layer and the first mismatch in their own columns, the whole text folded."""
    if not rows.num_rows:
        return None
    shown = [n for n in rows.column_names if n != detail_column]
    columns = [*shown, *(["first diverging layer", "first mismatch", ""] if detail_column else [])]
    body = []
    for r in rows.to_pylist():
        cells = [
            Html(f'<span title="{text(r[n])}">{text(names(r[n]))}</span>') if n == "policy" else text(r[n]) for n in shown
        ]
        if detail_column:
            detail = str(r[detail_column] or "")
            cells += [
                text(layer_text(detail)),
                fold_long(first_mismatch(detail), 90),
                folded("detail", tag("div", detail, class_="detail")),
            ]
        body.append(cells)
    rest = folded(f"{len(body) - SHOWN_ROWS} more", table(columns, body[SHOWN_ROWS:])) if len(body) > SHOWN_ROWS else ""
    return PageSection(anchor, title, join([table(columns, body[:SHOWN_ROWS]), rest]), f"{rows.num_rows} rows")
