"""`harness report`: what one run found, in the terminal, and as PNG plots and one static HTML page.

Everything is read through the DuckDB views of `harness.store.views`; numbers are formatted in SQL so
the terminal and the HTML page show the same text. A plot without data is skipped with a note.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import duckdb
import numpy as np
import pyarrow as pa

from harness.dtypes import LABEL_ORDER
from harness.judge.kinds import CheckKind
from harness.judge.returns import Outcome
from harness.judge.verdicts import HONEST
from harness.report.summary import batch_invariance_lines, short_name, summarize

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# The policy's head, the output the reference ports report precision on.
HEAD_OUTPUTS = ("logits", "q_values", "mu")

PAGE = "report.html"


def dtype_order(column: str = "dtype") -> str:
    """SQL ORDER BY terms: float32, float16, bfloat16 as a sweep lists them, then any other dtype."""
    return f"list_position({list(LABEL_ORDER)}, {column}) NULLS LAST, {column}"


@dataclass
class Section:
    title: str
    table: pa.Table  # cells already formatted
    empty_note: str  # shown instead of an empty table


@dataclass
class Plot:
    title: str
    file: str  # PNG name inside the output folder
    note: str  # why it was skipped; empty when drawn


@dataclass
class Report:
    run_id: str
    status: str
    facts: list[tuple[str, str]]
    sections: list[Section]
    n_checks: int
    n_failed: int
    n_inconclusive: int = 0
    """Closed-loop verdicts their episodes could not decide, not gating: never a pass."""

    @property
    def failed(self) -> bool:
        return self.n_failed > 0 or self.status in ("failed", "error")

    @property
    def verdict(self) -> str:
        """FAILED, PASSED, or what keeps a run from either: no checks at all (a bench, or a sweep
        that judged nothing), or a sweep that has not finished (running, or stopped short)."""
        if self.failed:
            return "FAILED"
        if self.status == "running":
            return "INCOMPLETE"
        return "PASSED" if self.n_checks else "NO CHECKS"


def _rows(con: duckdb.DuckDBPyConnection, sql: str, run_id: str) -> pa.Table:
    return con.sql(sql, params={"run_id": run_id}).to_arrow_table()


def _run_facts(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[str, list[tuple[str, str]]]:
    """The run's status and provenance; a run with no `runs` row (a bare bench) has neither."""
    rows = _rows(con, "SELECT * FROM runs WHERE run_id = $run_id", run_id).to_pylist()
    if not rows:
        return "unknown", []
    run = rows[0]
    devices = json.loads(run["devices"] or "[]")
    labelled = ", ".join(
        f"{d.get('label', '?')} ({d.get('model', '?')}{', simulated' if d.get('simulated') else ''})" for d in devices
    )
    policies = json.loads(run["policies"] or "[]")
    named = ", ".join(
        f"{p.get('name')} ({p.get('source')}{', synthetic' if p.get('synthetic') else ''}, sha256 {str(p.get('sha256'))[:12]})"
        for p in policies
    )
    facts = [
        ("started", f"{run['started_at']} (finished {run['finished_at'] or 'never'})"),
        ("host", run["hostname"]),
        ("accelerator", f"{run['accelerator']}, {run['n_cards']} cards"),
        ("devices", labelled),
        ("policies", named),
        (
            "versions",
            f"harness {run['harness_version']}, torch {run['torch_version']}, ray {run['ray_version']}, git "
            f"{run['git_revision'] or 'unknown'}",
        ),
        ("faults injected", run["faults"] or "none"),
        ("command", run["command"]),
    ]
    return run["status"], facts


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


FAILED_SQL = f"""
SELECT CASE WHEN gating THEN 'FAIL' ELSE 'finding' END AS verdict, policy, dtype, kind AS check,
       workload || '/' || output AS output,
       device_a || CASE WHEN device_b = '' THEN '' ELSE ' vs ' || device_b END AS devices, detail AS "first mismatch"
FROM checks WHERE run_id = $run_id AND NOT passed
ORDER BY NOT gating, policy, {dtype_order()}, kind, workload, output, device_a
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


def build_report(con: duckdb.DuckDBPyConnection, run_id: str) -> Report:
    status, facts = _run_facts(con, run_id)
    checks = _rows(con, "SELECT * FROM checks WHERE run_id = $run_id", run_id)
    sections = [
        _verdict_section(checks),
        Section(
            "Failed checks (FAIL gates the run; a finding does not)", _rows(con, FAILED_SQL, run_id), "every check passed"
        ),
        _card_properties_section(checks),
        Section(
            "Is the port right: the head's error against the float64 golden, over the CPU's own in that dtype",
            _rows(con, PRECISION_SQL, run_id),
            "no cpu_reference checks of logits or mu",
        ),
        Section(
            "Closed loop: returns as distributions (mean and IQM with 95% intervals), the paired difference against "
            "the margin (PASS above it, FAIL below, INCONCLUSIVE across), and where trajectories part from the CPU's "
            "next to where an honest port's do",
            _rows(con, CLOSED_LOOP_SQL, run_id),
            "no closed-loop verdicts in this run",
        ),
        Section("Benchmarks", _rows(con, BENCH_SQL, run_id), "no bench rows for this run"),
    ]
    n_failed = sum(1 for r in checks.select(["gating", "passed"]).to_pylist() if r["gating"] and not r["passed"])
    n_inconclusive = sum(
        1 for r in checks.select(["outcome", "gating"]).to_pylist() if r["outcome"] == Outcome.INCONCLUSIVE and not r["gating"]
    )
    return Report(run_id, status, facts, sections, checks.num_rows, n_failed, n_inconclusive)


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


def headline(report: Report) -> str:
    undecided = f", {report.n_inconclusive} inconclusive" if report.n_inconclusive else ""
    return (
        f"run {report.run_id}: {report.verdict} (status {report.status}; {report.n_checks} checks, {report.n_failed} failed"
        f"{undecided})"
    )


def print_report(report: Report, out: TextIO) -> None:
    print(headline(report), file=out)
    for key, value in report.facts:
        print(f"  {key + ':':<17} {value}", file=out)
    print_sections(report.sections, out)


# ---- plots -------------------------------------------------------------------------------------


def _new_axes(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    # A bare Figure on the Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def _throughput_rows(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict[str, Any]]:
    # One aggregate row per card count is expected; max() keeps it if per-card rows sit beside it.
    return _rows(
        con,
        f"""
        SELECT policy, dtype, batch_size, timing, n_cards, max(decisions_per_s) AS dps, any_value(ci_low) AS low,
               any_value(ci_high) AS high, any_value(scaling_efficiency) AS efficiency,
               any_value(scaling_ci_low) AS efficiency_low, any_value(scaling_ci_high) AS efficiency_high,
               bool_and(coalesce(valid, false)) AS valid
        FROM bench WHERE run_id = $run_id AND mode = 'throughput' AND decisions_per_s > 0
        GROUP BY policy, dtype, batch_size, timing, n_cards ORDER BY policy, {dtype_order()}, batch_size, timing, n_cards""",
        run_id,
    ).to_pylist()


def _with_intervals(
    ax: Axes, x: np.ndarray, points: list[dict[str, Any]], value: str, low: str, high: str, color: str
) -> None:
    """Points with their 95% intervals as error bars; an invalid row's point is hollow (not a result)."""
    y = np.array([p[value] for p in points], dtype=float)
    below = np.array([0.0 if p[low] is None else p[value] - p[low] for p in points])
    above = np.array([0.0 if p[high] is None else p[high] - p[value] for p in points])
    ax.errorbar(x, y, yerr=[below, above], fmt="none", ecolor=color, capsize=4, alpha=0.8)
    valid = np.array([bool(p["valid"]) for p in points])
    ax.plot(x[valid], y[valid], "o", color=color)
    ax.plot(x[~valid], y[~valid], "o", markerfacecolor="none", color=color)


def _plot_throughput(con: duckdb.DuckDBPyConnection, run_id: str, path: Path) -> str:
    rows = _throughput_rows(con, run_id)
    if not rows:
        return "no bench rows with mode throughput in this run"
    fig, ax = _new_axes("Decisions per second against cards (95% intervals; hollow: invalid)", "cards", "decisions/s")
    for i, (key, points) in enumerate(_series(rows, ("policy", "dtype", "batch_size", "timing")).items()):
        cards = np.array([p["n_cards"] for p in points])
        dps = np.array([p["dps"] for p in points])
        color = f"C{i % 10}"
        ax.plot(cards, dps, "-", color=color, label=f"{key[0]} {key[1]} batch {key[2]} ({key[3]})")
        _with_intervals(ax, cards, points, "dps", "low", "high", color)
        # Ideal: the smallest configuration's per-card rate, times the cards.
        ax.plot(cards, dps[0] / cards[0] * cards, "--", color=color, alpha=0.6)
    ax.plot([], [], "k--", alpha=0.6, label="ideal (linear)")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)
    return ""


def _plot_scaling(con: duckdb.DuckDBPyConnection, run_id: str, path: Path) -> str:
    rows = [r for r in _throughput_rows(con, run_id) if r["efficiency"] is not None]
    if not rows:
        return "no bench rows with a scaling efficiency in this run"
    fig, ax = _new_axes("Scaling efficiency against cards (95% intervals; hollow: invalid)", "cards", "tput(k) / (k tput(1))")
    series = _series(rows, ("policy", "dtype", "batch_size", "timing"))
    for i, (key, points) in enumerate(series.items()):
        # Each series a little to the side of the others, so that their intervals can be told apart.
        cards = np.array([p["n_cards"] for p in points]) + 0.04 * (i - (len(series) - 1) / 2)
        color = f"C{i % 10}"
        ax.plot(cards, [p["efficiency"] for p in points], "-", color=color, label=f"{key[0]} {key[1]} batch {key[2]}")
        _with_intervals(ax, cards, points, "efficiency", "efficiency_low", "efficiency_high", color)
    ax.axhline(1.0, color="C3", linestyle="--", label="the limit: k cards do at most k times one card's work")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)
    return ""


def _plot_latency(con: duckdb.DuckDBPyConnection, run_id: str, path: Path) -> str:
    # The worst card at each point: the number a port is signed off on.
    rows = _rows(
        con,
        f"""
        SELECT policy, dtype, timing, batch_size, max(p50_ms) AS p50, max(p95_ms) AS p95, max(p99_ms) AS p99
        FROM bench WHERE run_id = $run_id AND mode = 'latency' AND p50_ms IS NOT NULL
        GROUP BY policy, dtype, timing, batch_size ORDER BY policy, {dtype_order()}, timing, batch_size""",
        run_id,
    ).to_pylist()
    if not rows:
        return "no bench rows with mode latency in this run"
    fig, ax = _new_axes("Latency percentiles against batch size (worst card)", "batch size", "ms")
    styles = {"p50": "-", "p95": "--", "p99": ":"}
    for i, (key, points) in enumerate(_series(rows, ("policy", "dtype", "timing")).items()):
        batch = [p["batch_size"] for p in points]
        for pct, style in styles.items():
            ax.plot(
                batch,
                [p[pct] for p in points],
                style,
                marker="o",
                color=f"C{i % 10}",
                label=f"{key[0]} {key[1]} ({key[2]})" if pct == "p50" else None,
            )
    for pct, style in styles.items():
        ax.plot([], [], style, color="k", label=pct)
    ax.set_xscale("log", base=2)
    sizes = sorted({r["batch_size"] for r in rows})
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_yscale("log")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)
    return ""


def _plot_errors(con: duckdb.DuckDBPyConnection, run_id: str, path: Path) -> str:
    rows = _rows(
        con,
        f"""
        SELECT dtype, error_ratio, ratio_limit FROM checks
        WHERE run_id = $run_id AND kind = '{CheckKind.CPU_REFERENCE}' AND isfinite(error_ratio)
        ORDER BY {dtype_order()}""",
        run_id,
    ).to_pylist()
    if not any(r["error_ratio"] > 0 for r in rows):
        return "no card-vs-golden error to draw on a log scale" + (" (every card matched the golden exactly)" if rows else "")
    fig, ax = _new_axes("Is the port right: error_ratio per check, against its limit", "dtype", "error_ratio (log)")
    labels = []
    for x, (key, points) in enumerate(_series(rows, ("dtype",)).items()):
        ratios = np.array([p["error_ratio"] for p in points])
        positive = ratios[ratios > 0]
        # Exact matches have no place on a log axis: they are counted in the label instead.
        labels.append(f"{key[0]}\n{len(ratios) - len(positive)} of {len(ratios)} exact")
        if positive.size:
            ax.boxplot(positive, positions=[x], widths=0.5, showfliers=False)
            ax.plot(x + np.linspace(-0.15, 0.15, positive.size), positive, "o", alpha=0.6, color=f"C{x % 10}")
        for limit in sorted({p["ratio_limit"] for p in points}):
            ax.hlines(limit, x - 0.4, x + 0.4, colors="C3", linestyles="--")
    ax.plot([], [], "--", color="C3", label="limit (by elements)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), labels)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)
    return ""


def _plot_returns(con: duckdb.DuckDBPyConnection, run_id: str, path: Path) -> str:
    """Each mode's returns per device, every episode a dot, with the mean and its 95% interval."""
    episodes = _rows(
        con,
        f"""
        SELECT DISTINCT policy, dtype, mode, batching, device, episode_seed, episode_return FROM episodes
        WHERE run_id = $run_id AND device <> '{HONEST}' ORDER BY policy, {dtype_order()}, mode, device, episode_seed""",
        run_id,
    ).to_pylist()
    verdicts = _rows(
        con,
        f"""
        SELECT policy, dtype, split_part(workload, '-', 2) AS mode, split_part(workload, '-', -1) AS batching, device_a,
               return_a, return_a_low, return_a_high, return_b, return_b_low, return_b_high, outcome
        FROM checks WHERE run_id = $run_id AND kind = '{CheckKind.EPISODE_RETURN}'""",
        run_id,
    ).to_pylist()
    if not verdicts:
        return "no closed-loop verdicts in this run"
    intervals: dict[tuple[Any, ...], tuple[float, float, float, str]] = {}
    for v in verdicts:
        mode = (v["policy"], v["dtype"], v["mode"], v["batching"])
        intervals[(*mode, v["device_a"])] = (v["return_a"], v["return_a_low"], v["return_a_high"], v["outcome"])
        intervals[(*mode, "cpu")] = (v["return_b"], v["return_b_low"], v["return_b_high"], "")
    fig, ax = _new_axes("Returns per device (dots: episodes; bars: mean and 95% interval)", "", "episode return")
    labels = []
    for x, (key, points) in enumerate(_series(episodes, ("policy", "dtype", "mode", "batching", "device")).items()):
        returns = np.array([p["episode_return"] for p in points], dtype=float)
        color = "k" if key[4] == "cpu" else f"C{x % 10}"
        ax.plot(x + np.linspace(-0.2, 0.2, returns.size), returns, ".", alpha=0.35, color=color)
        if key in intervals:
            value, low, high, outcome = intervals[key]
            ax.errorbar([x], [value], yerr=[[value - low], [high - value]], fmt="o", color=color, capsize=6)
        outcome = intervals.get(key, (0, 0, 0, ""))[3]
        labels.append(f"{short_name(key[0])} {key[1]}\n{key[2][:5]}. {key[4]}" + (f"\n{outcome.upper()}" if outcome else ""))
    ax.set_xticks(range(len(labels)), labels, fontsize="x-small", rotation=90)
    fig.savefig(path, dpi=100)
    return ""


def _series(rows: list[dict[str, Any]], key: tuple[str, ...]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Rows grouped by `key`, in the order the (sorted) rows come."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in key), []).append(row)
    return groups


PLOTS: list[tuple[str, str, Callable[[duckdb.DuckDBPyConnection, str, Path], str]]] = [
    ("Decisions/s against cards", "throughput.png", _plot_throughput),
    ("Scaling efficiency against cards", "scaling.png", _plot_scaling),
    ("Latency against batch size", "latency.png", _plot_latency),
    ("Card against the golden: error_ratio per dtype", "errors.png", _plot_errors),
    ("Closed-loop returns per device, with the mean's 95% interval", "returns.png", _plot_returns),
]


def draw_plots(con: duckdb.DuckDBPyConnection, run_id: str, out_dir: Path) -> list[Plot]:
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = []
    for title, file, draw in PLOTS:
        path = out_dir / file
        path.unlink(missing_ok=True)  # never leave an older run's plot beside this run's page
        plots.append(Plot(title, file, draw(con, run_id, path)))
    return plots


# ---- HTML --------------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.fail, h1.fail { color: #b00020; font-weight: bold; }
td.pass, h1.pass { color: #1b5e20; }
table.facts th { background: none; border: none; }
table.facts td { border: none; }
.note { color: #666; font-style: italic; }
img { max-width: 100%; border: 1px solid #ddd; }
"""


def html_table(table: pa.Table) -> str:
    head = "".join(f"<th>{html.escape(n)}</th>" for n in table.column_names)
    body = []
    for row in table.to_pylist():
        cells = []
        for value in map(_cell, row.values()):
            cls = ' class="fail"' if value.startswith("FAIL") else ' class="pass"' if value == "PASS" else ""
            cells.append(f"<td{cls}>{html.escape(value)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def write_html(report: Report, plots: list[Plot], out_dir: Path) -> Path:
    """One self-contained page: inline style, images referenced beside it, nothing from the network."""
    verdict = "fail" if report.failed else "pass"
    facts = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in report.facts)
    parts = [
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>harness report '
        f"{html.escape(report.run_id)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f'<h1 class="{verdict}">{html.escape(headline(report))}</h1>',
        f'<table class="facts">{facts}</table>',
    ]
    for section in report.sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        parts.append(
            html_table(section.table) if section.table.num_rows else f'<p class="note">{html.escape(section.empty_note)}</p>'
        )
    parts.append("<h2>Plots</h2>")
    for plot in plots:
        if plot.note:
            parts.append(f'<h3>{html.escape(plot.title)}</h3><p class="note">skipped: {html.escape(plot.note)}</p>')
        else:
            parts.append(
                f'<figure><img src="{html.escape(plot.file)}" '
                f'alt="{html.escape(plot.title)}"><figcaption>{html.escape(plot.title)}</figcaption></figure>'
            )
    parts.append("</body></html>\n")
    page = out_dir / PAGE
    page.write_text("\n".join(parts), encoding="utf-8")
    return page
