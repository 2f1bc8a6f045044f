"""The sign-off page of one run (`harness report RUN --out DIR`): one self-contained HTML file that
an engineer attaches to a sign-off.

In the order a reader asks: the verdict, the grid of policy x dtype x check, what was run (the
configuration, the devices and every precision setting as set and as read back), what failed
grouped by cause, what was found without gating, the port rule per output and card, the
episodes, the bench. A part with nothing to show is left out; the grid says what was not run.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from harness.dtypes import LABEL_ORDER
from harness.judge.kinds import CheckKind
from harness.judge.localize import named_layer
from harness.judge.outcome import fails_the_run
from harness.judge.results import measured_over_limit
from harness.report import plots
from harness.report.page import Cell, Content, PageSection, as_text, Table, document, plot, policy_cell, verdict_class
from harness.report.run_report import HEAD_OUTPUTS, BENCH_SQL, Report, dtype_order
from harness.report.names import PolicyNames
from harness.report.summary import Group, batch_invariance_lines, summarize

# Rows shown in a table before the rest is folded.
SHOWN_ROWS = 8
# Episode kinds of check, and the cross_card checks of episode workloads (actions, returns).
EPISODE_KINDS = (CheckKind.EPISODE_RETURN, CheckKind.PUBLISHED_RETURN)
EPISODE_WORKLOAD = "episodes-"
EPISODE_HEADINGS = {
    CheckKind.EPISODE_RETURN: "episode_return: each card's returns against the CPU float32's",
    CheckKind.PUBLISHED_RETURN: "published_return: the CPU's mean return against the score the policy's files state",
}
# Columns of a check row that say where it is, not what it measured: the closed-loop table shows
# every other column that any of its rows fills, so columns added to `checks` appear there.
IDENTITY = {
    "run_id", "unit_id", "policy", "dtype", "workload", "output", "kind", "device_a", "device_b", "input_sha256",
    "gating", "passed", "detail",
}  # fmt: skip
# Configuration keys that say where a run went, not what it was.
NOT_CONFIG = ("results", "run_id", "resume", "progress")
CONFIG_ORDER = (
    "policies", "dtypes", "batch_sizes", "seed", "episodes", "episode_batching", "env", "envs", "precision",
    "tolerance", "ratio_limits", "require_batch_invariance", "published_return", "inject_fault",
    "accelerator", "cards", "card_counts", "threads", "placement", "hang_timeout", "max_memory_gib",
)  # fmt: skip


def write_page(con: duckdb.DuckDBPyConnection, report: Report, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"report-{report.run_id}.html"
    path.write_text(render(con, report), encoding="utf-8")
    return path


def render(con: duckdb.DuckDBPyConnection, report: Report) -> str:
    colours = plots.CardColours(report.record.card_labels())
    checks = report.checks.to_pylist()
    judged = [c for c in checks if c["kind"] != CheckKind.BENCH_AUDIT]
    bench = _bench_section(con, report, checks)
    sections = [
        _grid_section(report, judged),
        *([bench] if report.is_bench else []),
        _configuration_section(report),
        _devices_section(report),
        _failures_section(report, judged),
        _findings_section(report, judged),
        _port_rule_section(judged, colours, report.names),
        _episodes_section(con, report, judged, colours),
        *([bench] if not report.is_bench else []),
    ]
    shown = [s for s in sections if s is not None]
    return document(
        "run_page.html.j2",
        f"harness report {report.run_id}: {report.verdict}",
        shown,
        header=_header(report),
        footer={
            "made": f"Made by harness report from {report.results} on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
            "query": f"harness query \"SELECT * FROM checks WHERE run_id = '{report.run_id}'\" --results {report.results}",
        },
    )


def _header(report: Report) -> dict[str, Any]:
    run = report.record.row
    ran = None
    if run:
        policies = ", ".join(report.names(str(p.get("name"))) for p in report.record.policies)
        ran = (
            f"{policies} on {run['n_cards']} {run['accelerator']} cards · started {run['started_at']} · "
            f"finished {run['finished_at'] or 'never'} · {run['hostname']}"
        )
    failed = [
        r
        for r in report.checks.select(["device_a", "kind", "gating", "passed"]).to_pylist()
        if fails_the_run(r["gating"], r["passed"])
    ]
    failed_on = None
    if failed:
        counts = ", ".join(f"{device} ({n})" for device, n in sorted(Counter(r["device_a"] for r in failed).items()))
        # Where they are shown: the failures, or the bench's audit.
        where = "#bench" if all(r["kind"] == CheckKind.BENCH_AUDIT for r in failed) else "#failures"
        failed_on = (counts, where)
    step = report.next_step()
    resume = report.resume_command() if step and report.resumable else None
    return {
        "verdict": str(report.verdict),
        "badge": str(report.verdict).lower().replace(" ", "-"),
        "run_id": report.run_id,
        "status": report.status,
        "counts": report.counts(),
        "ran": ran,
        "failed_on": failed_on,
        "step": step.removesuffix(resume) if resume else step,
        "resume": resume,
    }


# ---- the grid -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridRow:
    """A row of the grid: a policy and dtype, and per kind of check its cell (None: not run)."""

    policy: str
    label: str
    dtype: str
    cells: list[GridCell | None]


@dataclass(frozen=True)
class GridCell:
    verdict: str  # in bold
    note: str  # under it
    attrs: dict[str, str | None]  # the cell's class, data-* attributes and title


def grid_data(rows: list[GridRow], kinds: Sequence[str], class_: str, absent: str) -> dict[str, Any]:
    """What parts.html.j2's `grid` lays out; `absent` is the title of a cell with no checks."""
    return {"rows": rows, "kinds": kinds, "class_": class_, "absent": absent}


def _grid_section(report: Report, judged: list[dict[str, Any]]) -> PageSection | None:
    if not judged:
        return None
    groups = summarize(pa.Table.from_pylist(judged, schema=report.checks.schema))
    kinds = [k for k in CheckKind if any(g.kind == k for g in groups)]
    cells: dict[tuple[str, str], dict[str, Group]] = {}
    for g in groups:
        cells.setdefault((g.policy, g.dtype), {})[g.kind] = g
    rows = []
    for (policy, dtype), mine in cells.items():
        row: list[GridCell | None] = []
        for kind in kinds:
            group = mine.get(kind)
            row.append(
                None
                if group is None
                else GridCell(
                    group.verdict + (" so far" if report.unfinished else ""),
                    f"{group.checks} · {group.worst_text}",
                    {
                        "class": f"cell {verdict_class(group.verdict)}",
                        "data-policy": policy,
                        "data-dtype": dtype,
                        "data-check": str(kind),
                        "data-verdict": group.verdict.split(" ")[0],
                        "title": group.first_failure or None,
                    },
                )
            )
        rows.append(GridRow(policy, report.names(policy), dtype, row))
    lede = (
        "PASS / FAIL: checks that gate the run; pass / finding: reported, never gating. Under each: the checks in the "
        "cell and the worst measured value over its limit (1 is the limit), or the largest ULP distance."
    )
    if report.unfinished:
        lede = f"The run has not finished: the cells hold its {report.units_done} finished units only. " + lede
    grid = grid_data(
        rows, [str(k) for k in kinds], "grid partial" if report.unfinished else "grid", "not run for this policy and dtype"
    )
    return PageSection("verdicts", "Verdicts: policy x dtype x check", "grid", grid, lede)


# ---- what was run -------------------------------------------------------------------------------


def _value(value: Any) -> str:
    if value is None:
        return "not set (the default)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(str, value)) if value else "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} = {v}" for k, v in value.items()) if value else "none"
    return str(value)


def _configuration_section(report: Report) -> PageSection | None:
    config = {k: v for k, v in report.record.config.items() if k not in NOT_CONFIG}
    if not config and not report.record.row:
        return None
    ordered = [k for k in CONFIG_ORDER if k in config] + sorted(k for k in config if k not in CONFIG_ORDER)
    unset = [k for k in ordered if config[k] is None]
    run = report.record.row
    policies: list[list[Content]] = [
        [
            policy_cell(str(p.get("name")), report.names(str(p.get("name")))),
            str(p.get("source")),
            Cell(str(p.get("sha256"))[:16], code=True),
            str(p.get("env_id") or "none"),
            Cell(str(p.get("detail") or ""), fold=90),
        ]
        for p in report.record.policies
    ]
    data = {
        "configured": [(k.replace("_", " "), _value(config[k])) for k in ordered if config[k] is not None],
        "unset": ", ".join(k.replace("_", " ") for k in unset),
        "facts": [
            (k, Cell(v, code=True) if k == "command" else v)
            for k, v in report.facts()
            if k not in ("devices", "policies", "started")
        ],
        "policies": Table(["policy", "source", "sha256", "environment", "what it is"], policies) if policies else None,
        "stored": json.dumps(report.record.config, indent=1) if run and run.get("config_json") else None,
    }
    return PageSection("configuration", "Configuration", "configuration", data)


def _devices_section(report: Report) -> PageSection | None:
    devices = report.record.devices
    if not devices:
        return None
    labels = [str(d.get("label")) + (f" (replaces {d['replaces']})" if d.get("replaces") else "") for d in devices]

    general: list[tuple[str, list[Content]]] = []
    precision: list[tuple[str, list[Content]]] = []

    def row(into: list[tuple[str, list[Content]]], name: str, values: list[Content]) -> None:
        if any(v != "" for v in values):  # a setting no device has says nothing
            into.append((name, values))

    row(general, "model", [as_text(d.get("model")) for d in devices])
    row(general, "node", [as_text(d.get("node")) for d in devices])
    row(general, "simulated", [_value(bool(d.get("simulated"))) for d in devices])
    runtime_keys = list(dict.fromkeys(k for d in devices for k in (d.get("runtime") or {})))
    for key in runtime_keys:
        row(general, key, [as_text((d.get("runtime") or {}).get(key, "")) for d in devices])
    if "threads" not in runtime_keys:
        row(general, "threads", [as_text(d.get("threads", "")) for d in devices])
    faults: list[Content] = [Cell(", ".join(d["faults"]), class_="mismatch") if d.get("faults") else "none" for d in devices]
    row(general, "faults injected", faults)
    row(precision, "precision mode", [as_text((d.get("settings") or {}).get("precision", "")) for d in devices])
    setting_keys = list(dict.fromkeys(k for d in devices for k in (d.get("settings") or {}) if k not in ("precision", "set")))
    for key in setting_keys:
        row(precision, key, [_setting(d.get("settings") or {}, key) for d in devices])
    lede = (
        "As each device's process described itself (runs.devices). 'set → read' where the harness set a setting: a "
        "read-back that differs from what was set is red."
    )
    data = {"labels": labels, "general": general, "precision": precision}
    return PageSection("devices", "Devices and precision", "devices", data, lede)


def _setting(settings: dict[str, Any], key: str) -> Content:
    read = settings.get(key)
    done = settings.get("set") or {}
    if key in done:
        same = str(done[key]) == str(read)
        return Cell(f"set {done[key]} → read {read}", class_=None if same else "mismatch")
    return as_text(read)


# ---- failures and findings -----------------------------------------------------------------------

# Where a row's own first failing element is named (harness/judge/compare.py, golden.py, verdicts.py):
# bit for bit, against the golden, a decision, the tolerance table, an episode.
_FIRST = re.compile(
    r"first mismatch at \[[^\]]*\]: [^;]*?\)(?=;|$| )"
    r"|largest error \S+ at \[[^\]]*\] \([^)]*\)"
    r"|first at \[[^\]]*\]: [^;(]*"
    r"|at \[[^\]]*\]: actual=[^;]*"
    r"|seed \S+ first, at step \d+"
)


def first_mismatch(detail: str) -> str:
    """The row's own first failing element, as its detail names it; else the detail's first part."""
    found = _FIRST.search(detail)
    return found.group(0).strip() if found else detail.split("; ")[0]


def layer_text(detail: str) -> str:
    named = named_layer(detail)
    if named is None:
        return ""
    how, where, on = named
    return f"{where} ({'bit for bit' if 'divergent' in how else 'against the golden'}{', found on ' + on if on else ''})"


def _over_limit_text(row: dict[str, Any]) -> str:
    score = measured_over_limit(row)
    if score is not None:
        return f"{score:.3g}"
    return f"{row['max_ulp']} ulp" if row.get("max_ulp") else ""


def _cause_rows(rows: list[dict[str, Any]], names: PolicyNames) -> list[list[Content]]:
    return [
        [
            policy_cell(r["policy"], names(r["policy"])),
            r["dtype"],
            f"{r['workload']}/{r['output']}",
            r["device_b"] or "-",
            layer_text(r["detail"]),
            Cell(first_mismatch(r["detail"]), fold=90),
            _over_limit_text(r),
            Cell(r["detail"], detail=True),
        ]
        for r in rows
    ]


CAUSE_COLUMNS = ["policy", "dtype", "input/output", "against", "first diverging layer", "first mismatch", "worst/limit", ""]


@dataclass(frozen=True)
class Cause:
    """Rows of one device and kind of check, under a line that says where they are."""

    device: str
    kind: str
    said: str  # "3 failed in cartpole float32, ..."
    faults: str  # the faults injected on the device, or ""
    layers: str  # the first diverging layers, or ""
    rows: Table
    finding: bool


def _causes(rows: list[dict[str, Any]], faults: dict[str, list[str]], finding: bool, names: PolicyNames) -> list[Cause]:
    """Rows grouped by cause: the device that failed and the kind of check."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["device_a"], r["kind"]), []).append(r)
    causes = []
    for (device, kind), mine in sorted(groups.items(), key=lambda kv: (kv[0][0], rank(tuple(CheckKind), kv[0][1]))):
        where = sorted({f"{names(r['policy'])} {r['dtype']}" for r in mine})
        layers = sorted({layer_text(r["detail"]).split(" (")[0] for r in mine} - {""})
        body = _cause_rows(mine, names)
        columns = list(CAUSE_COLUMNS)
        if not layers:  # no layer search for this kind of check
            at = columns.index("first diverging layer")
            columns.pop(at)
            body = [row[:at] + row[at + 1 :] for row in body]
        causes.append(
            Cause(
                device,
                str(kind),
                f"{len(mine)} {'found' if finding else 'failed'} in {', '.join(where)}",
                ", ".join(faults.get(device, [])),
                ", ".join(layers),
                Table(columns, body, shown=SHOWN_ROWS),
                finding,
            )
        )
    return causes


def rank(order: tuple[str, ...], value: str) -> tuple[int, str]:
    """Where `value` sorts: its place in `order`, anything else after it by name."""
    return (order.index(value) if value in order else len(order), value)


def dtype_rank(dtype: str) -> tuple[int, str]:
    """float32, float16, bfloat16 as a sweep lists them, then any other dtype."""
    return rank(LABEL_ORDER, dtype)


def _order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["policy"], dtype_rank(r["dtype"]), r["workload"], r["output"], r["device_a"]))


def _failures_section(report: Report, judged: list[dict[str, Any]]) -> PageSection | None:
    failed = _order([r for r in judged if fails_the_run(r["gating"], r["passed"])])
    if not failed:
        return None
    lede = (
        f"{len(failed)} gating checks failed, grouped by the device that failed and the kind of check. The first "
        "diverging layer comes from a search that captures every layer on both sides for the same input."
    )
    causes = _causes(failed, report.record.device_faults(), False, report.names)
    return PageSection("failures", "Failed checks, by cause", "failures", {"causes": causes}, lede)


def _findings_section(report: Report, judged: list[dict[str, Any]]) -> PageSection | None:
    found = _order([r for r in judged if not r["gating"] and not r["passed"] and r["kind"] != CheckKind.BATCH_INVARIANCE])
    properties = batch_invariance_lines(pa.Table.from_pylist(judged, schema=report.checks.schema)) if judged else []
    notes = _run_notes(report)
    if not found and not properties and not notes:
        return None
    lede = (
        "What the run found that does not gate it: the fixed tolerance table off bounded outputs, properties of the "
        "cards, and what the run noted."
    )
    data = {"lines": [*properties, *notes], "causes": _causes(found, report.record.device_faults(), True, report.names)}
    return PageSection("findings", "Findings and notes (not gating)", "findings", data, lede)


def _run_notes(report: Report) -> list[str]:
    summary = report.record.summary
    notes = [
        f"no episodes for {p}: it names no environment ({flag} gives it episodes)"
        for p, flag in (summary.without_episodes or {}).items()
    ]
    notes += [f"renamed environment for {p}: {r}" for p, r in (summary.env_renames or {}).items()]
    notes += list(summary.events or [])
    notes += [f"LOST {line}" for line in summary.lost or []]
    notes += [f"dead card: {c}" for c in summary.dead_cards or []]
    return notes


# ---- the port rule --------------------------------------------------------------------------------


def _port_rule_section(judged: list[dict[str, Any]], colours: plots.CardColours, names: PolicyNames) -> PageSection | None:
    rows = [r for r in judged if r["kind"] == CheckKind.CPU_REFERENCE and r["ratio_limit"]]
    if not rows:
        return None
    failing = {r["device_a"] for r in rows if not r["passed"]}
    points = [
        plots.RatioPoint(r["output"], f"{names(r['policy'])} {r['dtype']}", r["device_a"], score, bool(r["passed"]))
        for r in rows
        if (score := measured_over_limit(r)) is not None
    ]
    exact_outputs = [
        o for o in dict.fromkeys(p.output for p in points) if all(p.over_limit == 0 for p in points if p.output == o)
    ]
    drawn = [p for p in points if p.output not in exact_outputs]
    ratios = None
    if drawn:
        note = f" {', '.join(exact_outputs)}: every card exact against the golden, not drawn." if exact_outputs else ""
        ratios = plot(
            plots.port_rule(drawn, colours, failing),
            "Each point is one check: a card's error against the float64 golden over the CPU's own error in that "
            "dtype, divided by its limit (the larger of error_ratio and max_ratio over ratio_limit); above the dashed "
            "line it fails. Each card has its own column"
            + (
                f"; {', '.join(sorted(failing))} failed and stand{'s' if len(failing) == 1 else ''} apart on the "
                "right, its failing checks marked X."
                if failing
                else "; no card failed."
            )
            + note,
            "port rule per output and card",
        )
    ulps: dict[str, list[int]] = {}
    for r in judged:
        if r["kind"] == CheckKind.CROSS_CARD and r["max_ulp"] is not None and not r["workload"].startswith(EPISODE_WORKLOAD):
            ulps.setdefault(r["device_a"], []).append(r["max_ulp"])
    errors: dict[str, list[float]] = {}
    for r in rows:
        if r["max_abs"] is not None:
            errors.setdefault(r["device_a"], []).append(r["max_abs"])
    exact = [
        f"{what}: all {sum(map(len, by_card.values()))} checks exact"
        for what, by_card in (("cross_card max_ulp", ulps), ("cpu_reference max_abs", errors))
        if by_card and not plots.has_inexact(by_card)
    ]
    histograms = None
    if plots.has_inexact(ulps) or plots.has_inexact(errors):
        histograms = plot(
            plots.worst_element_histograms(ulps, errors, colours),
            "Histograms of each check's worst element, from the rows' own columns (cross_card max_ulp; cpu_reference "
            "max_abs against the golden): the rows keep no per-element errors, so these count checks, not elements."
            + "".join(f" {line}, not drawn." for line in exact),
            "ULP and absolute error histograms",
        )
    lede = "Is the port right? A card must be no worse against the float64 golden than the CPU is in the card's dtype."
    data = {"ratios": ratios, "per_card": _per_card_table(rows, names), "histograms": histograms}
    return PageSection("port-rule", "The port rule, per output and card", "port_rule", data, lede)


def _per_card_table(rows: list[dict[str, Any]], names: PolicyNames) -> Table | None:
    cards = list(dict.fromkeys(r["device_a"] for r in rows))
    worst: dict[tuple[str, str, str], dict[str, tuple[float, bool]]] = {}
    for r in rows:
        if r["output"] not in HEAD_OUTPUTS:
            continue
        score = measured_over_limit(r) or 0.0
        cell = worst.setdefault((r["policy"], r["dtype"], r["output"]), {})
        old = cell.get(r["device_a"])
        if old is None or score > old[0]:
            cell[r["device_a"]] = (score, bool(r["passed"]) and (old is None or old[1]))
        elif not r["passed"]:
            cell[r["device_a"]] = (old[0], False)
    body = []
    for (policy, dtype, output), by_card in sorted(worst.items(), key=lambda kv: (kv[0][0], dtype_rank(kv[0][1]), kv[0][2])):
        cells: list[Content] = [names(policy), dtype, output]
        for card in cards:
            if card not in by_card:
                cells.append("")
                continue
            score, passed = by_card[card]
            cells.append(Cell("exact" if score == 0 else f"{score:.3g}", class_="v-pass" if passed else "v-fail"))
        body.append(cells)
    return Table(["policy", "dtype", "output", *cards], body) if body else None


# ---- episodes ---------------------------------------------------------------------------------------


def _episodes_section(
    con: duckdb.DuckDBPyConnection, report: Report, judged: list[dict[str, Any]], colours: plots.CardColours
) -> PageSection | None:
    episodes = (
        con.sql(
            f"SELECT * FROM episodes WHERE run_id = $run_id ORDER BY policy, {dtype_order()}, mode, episode_seed, device",
            params={"run_id": report.run_id},
        )
        .to_arrow_table()
        .to_pylist()
    )
    verdicts = [r for r in judged if r["kind"] in EPISODE_KINDS or r["workload"].startswith(EPISODE_WORKLOAD)]
    if not episodes and not verdicts:
        return None
    data: dict[str, Any] = {"returns": None, "returns_table": None, **_closed_loop_tables(verdicts, report.names)}
    if episodes:
        devices = ["cpu", *[d for d in colours.order if any(e["device"] == d for e in episodes)]]
        devices += [d for d in dict.fromkeys(e["device"] for e in episodes) if d not in devices]
        points = [
            plots.EpisodePoint(
                f"{report.names(e['policy'])} {e['dtype']}",
                e["mode"],
                e["device"],
                e["episode_seed"],
                e["episode_return"],
                e["first_divergent_step"],
            )
            for e in episodes
        ]
        data["returns"] = plot(
            plots.episode_returns(points, devices, colours),
            "Each point is one episode (one seed) on one device, each mode in its own column; hollow where its "
            "trajectory parted from the CPU reference's. The bar is the mean of the device's episodes in that mode.",
            "episode returns per device and seed",
        )
        data["returns_table"] = _returns_table(episodes, devices, report.names)
    n = len({(e["policy"], e["dtype"], e["mode"], e["episode_seed"]) for e in episodes})
    lede = f"{n} seeded episodes per device played closed loop, each device against the CPU reference." if episodes else ""
    return PageSection("episodes", "Episodes", "episodes", data, lede)


def _closed_loop_tables(rows: list[dict[str, Any]], names: PolicyNames) -> dict[str, Any]:
    """The closed-loop checks, one table per kind of check, each with every column its rows fill
    (so a column added to `checks` shows here too). The bit-for-bit checks of trajectories and
    returns against card 0 are counted, their rows folded."""
    bitwise = [r for r in rows if r["kind"] == CheckKind.CROSS_CARD]
    kinds = [
        (EPISODE_HEADINGS.get(kind, kind), _check_table([r for r in rows if r["kind"] == kind], names))
        for kind in dict.fromkeys(r["kind"] for r in rows if r["kind"] != CheckKind.CROSS_CARD)
    ]
    bit_for_bit = None
    if bitwise:
        parted = [r for r in bitwise if not r["passed"]]
        summary = f"{kind_word(bitwise)} bit for bit against card 0: {len(bitwise) - len(parted)} of {len(bitwise)} equal" + (
            f"; {len(parted)} differ ({', '.join(sorted({r['device_a'] for r in parted}))})" if parted else ""
        )
        bit_for_bit = (summary, _check_table(bitwise, names))
    return {"kinds": kinds, "bit_for_bit": bit_for_bit}


def kind_word(rows: list[dict[str, Any]]) -> str:
    return " and ".join(sorted({"trajectories" if r["output"] == "actions" else "returns" for r in rows}))


def _check_table(rows: list[dict[str, Any]], names: PolicyNames) -> Table:
    measured = [c for c in rows[0] if c not in IDENTITY and any(r.get(c) is not None for r in rows)]
    ordered = sorted(rows, key=lambda r: (r["policy"], dtype_rank(r["dtype"]), r["workload"], r["output"], r["device_a"]))
    columns = ["policy", "dtype", "episodes", "output", "devices", "verdict", *measured, "detail"]
    body: list[list[Content]] = []
    for r in ordered:
        verdict = ("PASS" if r["passed"] else "FAIL") if r["gating"] else ("pass" if r["passed"] else "finding")
        body.append(
            [
                names(r["policy"]),
                r["dtype"],
                r["workload"].removeprefix(EPISODE_WORKLOAD),
                r["output"],
                r["device_a"] + (f" vs {r['device_b']}" if r["device_b"] else ""),
                Cell(verdict, class_=f"v-{verdict_class(verdict)}"),
                *(_number(r.get(c)) for c in measured),
                Cell(r["detail"] or "", fold=60),
            ]
        )
    return Table(columns, body, "nowrap", shown=40)


def _number(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _returns_table(episodes: list[dict[str, Any]], devices: list[str], names: PolicyNames) -> Table:
    by_key: dict[tuple[str, str, str, int], dict[str, dict[str, Any]]] = {}
    for e in episodes:
        by_key.setdefault((e["policy"], e["dtype"], e["mode"], e["episode_seed"]), {})[e["device"]] = e
    body = []
    for (policy, dtype, mode, seed), on in by_key.items():
        cells: list[Content] = [names(policy), dtype, mode, str(seed)]
        for d in devices:
            episode = on.get(d)
            if episode is None:
                cells.append("")
            elif episode["first_divergent_step"] is None:
                cells.append(f"{episode['episode_return']:.6g}")
            else:
                parted = Cell(f"parted at {episode['first_divergent_step']}", class_="parted")
                cells.append([f"{episode['episode_return']:.6g} ", parted])
        body.append(cells)
    return Table(["policy", "dtype", "mode", "seed", *devices], body, "nowrap", shown=24, more="more seeds")


# ---- bench ---------------------------------------------------------------------------------------------


def _bench_section(con: duckdb.DuckDBPyConnection, report: Report, checks: list[dict[str, Any]]) -> PageSection | None:
    rows = report.bench
    if not rows:
        return None
    figures = []
    throughput = [r for r in rows if r["mode"] == "throughput" and r["decisions_per_s"]]
    if throughput:
        figures.append(
            plot(
                plots.bench_plot(
                    [
                        _point(
                            report.names,
                            r,
                            "n_cards",
                            "decisions_per_s",
                            "ci_low",
                            "ci_high",
                            ("policy", "dtype", "batch_size", "timing"),
                        )
                        for r in throughput
                    ],
                    "Decisions per second against cards (95% intervals)",
                    "cards",
                    "decisions/s",
                    log_y=True,
                ),
                "Throughput of k cards at once. Filled: valid rows, joined; hollow: invalid rows, never joined.",
                "throughput against cards",
            )
        )
    scaling = [r for r in throughput if r["scaling_efficiency"] is not None]
    if scaling:
        figures.append(
            plot(
                plots.bench_plot(
                    [
                        _point(
                            report.names,
                            r,
                            "n_cards",
                            "scaling_efficiency",
                            "scaling_ci_low",
                            "scaling_ci_high",
                            ("policy", "dtype", "batch_size", "timing"),
                        )
                        for r in scaling
                    ],
                    "Scaling efficiency against cards (95% intervals)",
                    "cards",
                    "tput(k) / (k tput(1))",
                    limit=1.0,
                ),
                "k cards do at most k times one card's work (the dashed line): a point above it is an invalid row, "
                "hollow, and no line goes through it.",
                "scaling efficiency against cards",
            )
        )
    latency = [r for r in rows if r["mode"] == "latency" and r["p50_ms"] is not None]
    if latency:
        figures.append(
            plot(
                plots.bench_plot(
                    [
                        _point(
                            report.names,
                            r,
                            "batch_size",
                            "p50_ms",
                            "ci_low",
                            "ci_high",
                            ("policy", "dtype", "device", "timing"),
                        )
                        for r in latency
                    ],
                    "Latency p50 against batch size (95% intervals)",
                    "batch size",
                    "ms",
                    log_x=True,
                    log_y=True,
                ),
                "Each card alone, inside the actor (device) and through Ray (end_to_end).",
                "latency against batch size",
            )
        )
    loop = [r for r in rows if r["mode"] == "closed_loop" and r["decisions_per_s"]]
    if loop:
        figures.append(
            plot(
                plots.bench_plot(
                    [
                        _point(
                            report.names,
                            r,
                            "batch_size",
                            "decisions_per_s",
                            "ci_low",
                            "ci_high",
                            ("policy", "dtype", "device"),
                        )
                        for r in loop
                    ],
                    "Closed-loop decisions per second against environments (95% intervals)",
                    "environments (batch)",
                    "decisions/s",
                    log_x=True,
                    log_y=True,
                ),
                "The policy and its environment on one card, stepping together.",
                "closed loop decisions per second",
            )
        )
    formatted = con.sql(BENCH_SQL, params={"run_id": report.run_id}).to_arrow_table().to_pylist()
    valid_rows = [r for r in formatted if r["valid"] == "yes"]
    invalid_rows = [r for r in formatted if r["valid"] != "yes"]
    data: dict[str, Any] = {"figures": figures, "valid": None, "invalid": None, "audit": None, "causes": []}
    if valid_rows:
        names = _filled(valid_rows)
        data["valid"] = Table(names, [[as_text(r[n]) for n in names] for r in valid_rows], "nowrap")
    if invalid_rows:
        names = _filled(invalid_rows)
        at = names.index("timing") + 1 if "timing" in names else len(names)  # why, before the figures it voids
        names = [*names[:at], WHY, *names[at:]]
        cells = [[_why(r) if n == WHY else as_text(r[n]) for n in names] for r in invalid_rows]
        data["invalid"] = Table(names, cells, "nowrap invalid")
    audit = [c for c in checks if c["kind"] == CheckKind.BENCH_AUDIT]
    failed = [c for c in audit if not c["passed"]]
    if audit:
        data["audit"] = (
            (
                f"audit: {len(audit)} outputs sampled from the timed path equal the sweep's run_batch bit for bit",
                "v-pass-gating",
            )
            if not failed
            else (f"FAIL audit: {len(failed)} of {len(audit)} sampled outputs differ from the sweep's run_batch", "v-fail")
        )
        data["causes"] = _causes(failed, report.record.device_faults(), False, report.names)
    lede = f"{report.n_valid} of {len(rows)} rows valid. An invalid row's figure is shown hollow and apart, never as a result."
    return PageSection("bench", "Benchmarks", "bench", data, lede)


WHY = "why it is not a result"


def _why(row: dict[str, Any]) -> Cell:
    reason = str(row["valid"]).removeprefix("NO:").strip() or "not said (rows of an older harness)"
    return Cell(reason, class_="why", fold=70, block=True)


def _filled(rows: list[dict[str, Any]]) -> list[str]:
    """The columns any of `rows` fills, `valid` aside (said by the table the rows are in)."""
    return [n for n in rows[0] if n != "valid" and any(r[n] not in (None, "") for r in rows)]


def _point(names: PolicyNames, r: dict[str, Any], x: str, y: str, low: str, high: str, key: Sequence[str]) -> plots.BenchPoint:
    series = " ".join(
        names(str(r[k])) if k == "policy" else (f"batch {r[k]}" if k == "batch_size" else str(r[k])) for k in key
    )
    return plots.BenchPoint(series, float(r[x]), float(r[y]), r[low], r[high], bool(r["valid"]))
