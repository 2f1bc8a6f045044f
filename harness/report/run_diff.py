"""`harness report --compare RUN_A RUN_B`: what got worse from run A to run B.

First how the two runs were made differently (configuration, faults, versions, devices), so a
reader knows what the matched units can be compared on. Then three questions, each one SQL join
over the views: gating checks that passed in A and fail in B,
errors (max_abs) of gating checks that grew by more than a factor, and throughput (decisions/s)
that dropped by more than a percentage. Checks are matched on (unit_id, output, kind, device_a,
device_b): unit ids are stable across runs of the same plan, so two sweeps of one config line up
row for row. Findings that do not gate (batch invariance, the tolerance table off bounded
outputs) are the card's properties, not a regression.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TextIO

import duckdb
import pyarrow as pa

from harness.errors import UsageError
from harness.report.run_report import RunRecord, Section, dtype_order, print_sections, run_record, versions


@dataclass
class Thresholds:
    error_factor: float = 2.0  # flag max_abs in B above this many times A's
    drop_percent: float = 10.0  # flag decisions/s in B this many percent below A's

    def __post_init__(self) -> None:
        if not self.error_factor >= 1.0:
            raise UsageError(f"--error-factor must be at least 1 (got {self.error_factor}); e.g. --error-factor 2")
        if not 0.0 <= self.drop_percent < 100.0:
            raise UsageError(f"--drop-percent must be in [0, 100) (got {self.drop_percent}); e.g. --drop-percent 10")


@dataclass(frozen=True)
class Difference:
    """One way in which the two runs were made differently: what, as A had it, as B had it."""

    what: str
    a: str
    b: str


# Keys of the stored configuration that say where a run went, not what it was.
WHERE_ONLY = ("results", "run_id", "resume", "progress", "address")


def _shown(value: Any) -> str:
    if value is None:
        return "not set"
    if isinstance(value, list):
        return ", ".join(map(str, value)) if value else "none"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True) if value else "none"
    return str(value)


def _flat(device: dict[str, Any]) -> dict[str, str]:
    """A device's description as field -> text: model, node, runtime and precision settings one by one."""
    flat = {k: _shown(device.get(k)) for k in ("model", "node", "simulated", "threads", "faults")}
    flat |= {f"runtime {k}": _shown(v) for k, v in (device.get("runtime") or {}).items()}
    settings = device.get("settings") or {}
    flat |= {f"{k}": _shown(v) for k, v in settings.items() if k != "set"}
    flat |= {f"set {k}": _shown(v) for k, v in (settings.get("set") or {}).items()}
    return flat


def _device_differences(a: RunRecord, b: RunRecord) -> list[Difference]:
    devices = [{str(d.get("label")): d for d in r.devices} for r in (a, b)]
    found = []
    for label in dict.fromkeys([*devices[0], *devices[1]]):
        a_device, b_device = devices[0].get(label), devices[1].get(label)
        if a_device is None or b_device is None:
            shown = [
                "absent" if d is None else f"{d.get('model')}{' (simulated)' if d.get('simulated') else ''}"
                for d in (a_device, b_device)
            ]
            found.append(Difference(f"device {label}", *shown))
            continue
        fields = [_flat(a_device), _flat(b_device)]
        for name in dict.fromkeys([*fields[0], *fields[1]]):
            if fields[0].get(name) != fields[1].get(name):
                found.append(
                    Difference(f"device {label}: {name}", fields[0].get(name, "absent"), fields[1].get(name, "absent"))
                )
    return found


def configuration_differences(a: RunRecord, b: RunRecord) -> list[Difference]:
    """Every way the runs' `runs` rows differ in what was run: the configuration key by key
    (dtypes, policies, faults, batch sizes, seeds, episodes, ...), the policies' bytes, the
    versions, and each device field by field (model, runtime, precision settings). Empty when
    they match."""
    found = []
    for key in sorted(set(a.config) | set(b.config)):
        if key not in WHERE_ONLY and a.config.get(key) != b.config.get(key):
            found.append(Difference(key.replace("_", " "), _shown(a.config.get(key)), _shown(b.config.get(key))))
    sha = [{str(p.get("name")): str(p.get("sha256")) for p in r.policies} for r in (a, b)]
    for name in sorted(set(sha[0]) & set(sha[1])):
        if sha[0][name] != sha[1][name]:
            found.append(Difference(f"policy {name} sha256", sha[0][name][:16], sha[1][name][:16]))
    if a.row and b.row:
        for column in ("accelerator", "n_cards"):
            if a.row[column] != b.row[column] and not (column == "n_cards" and a.config.get("cards") != b.config.get("cards")):
                found.append(Difference(column.replace("_", " "), str(a.row[column]), str(b.row[column])))
        if versions(a.row) != versions(b.row):
            found.append(Difference("versions", versions(a.row), versions(b.row)))
    return found + _device_differences(a, b)


@dataclass
class RunDiff:
    run_a: str
    run_b: str
    thresholds: Thresholds
    matched_checks: int
    newly_failed: pa.Table
    errors_grew: pa.Table
    throughput_dropped: pa.Table
    records: tuple[RunRecord, RunRecord] = field(default_factory=lambda: (RunRecord(), RunRecord()))
    checks: tuple[pa.Table, pa.Table] = field(default_factory=lambda: (pa.table({}), pa.table({})))

    @property
    def differences(self) -> list[Difference]:
        return configuration_differences(*self.records)

    @property
    def regressed(self) -> bool:
        return bool(self.newly_failed.num_rows or self.errors_grew.num_rows or self.throughput_dropped.num_rows)


# Checks of one run each; the join key is written once and shared by both queries below.
PAIRS = """
WITH a AS (SELECT * FROM checks WHERE run_id = $run_a), b AS (SELECT * FROM checks WHERE run_id = $run_b)
"""
MATCH = """a.unit_id = b.unit_id AND a.output = b.output AND a.kind = b.kind
           AND a.device_a = b.device_a AND a.device_b = b.device_b"""
CHECK_COLUMNS = """b.policy, b.dtype, b.kind AS check, b.workload || '/' || b.output AS output,
       b.device_a || CASE WHEN b.device_b = '' THEN '' ELSE ' vs ' || b.device_b END AS devices"""

# A failure in B with no counterpart in A (a card that died, a new error row) counts too.
NEWLY_FAILED_SQL = f"""{PAIRS}
SELECT {CHECK_COLUMNS}, CASE WHEN a.unit_id IS NULL THEN 'absent' ELSE 'passed' END AS "in A",
       b.detail AS "first mismatch in B"
FROM b LEFT JOIN a ON {MATCH}
WHERE b.gating AND NOT b.passed AND (a.unit_id IS NULL OR a.passed)
ORDER BY b.policy, {dtype_order("b.dtype")}, b.kind, output, devices
"""

# Bit-exact in A and not in B counts as growth; NaN (error rows) never compares, so is left out.
ERRORS_GREW_SQL = f"""{PAIRS}
SELECT {CHECK_COLUMNS}, printf('%.3g', a.max_abs) AS "max_abs A", printf('%.3g', b.max_abs) AS "max_abs B",
       CASE WHEN a.max_abs = 0 THEN 'was exact' ELSE printf('%.3gx', b.max_abs / a.max_abs) END AS growth
FROM a JOIN b ON {MATCH}
WHERE b.gating AND isfinite(a.max_abs) AND isfinite(b.max_abs) AND b.max_abs > $factor * a.max_abs
ORDER BY b.policy, {dtype_order("b.dtype")}, b.kind, output, devices
"""

MATCHED_SQL = f"{PAIRS} SELECT count(*) FROM a JOIN b ON {MATCH}"

THROUGHPUT_SQL = f"""
WITH a AS (SELECT * FROM bench WHERE run_id = $run_a), b AS (SELECT * FROM bench WHERE run_id = $run_b)
SELECT b.mode, b.policy, b.dtype, b.device, b.n_cards::VARCHAR AS cards, b.batch_size::VARCHAR AS batch, b.timing,
       printf('%.0f', a.decisions_per_s) AS "decisions/s A", printf('%.0f', b.decisions_per_s) AS "decisions/s B",
       printf('%.1f%%', 100 * (1 - b.decisions_per_s / a.decisions_per_s)) AS drop
FROM a JOIN b USING (policy, dtype, device, n_cards, batch_size, mode, timing)
WHERE a.decisions_per_s > 0 AND b.decisions_per_s < a.decisions_per_s * (1 - $drop / 100)
ORDER BY b.mode, b.policy, {dtype_order("b.dtype")}, b.n_cards, b.batch_size, b.device
"""


def compare_runs(con: duckdb.DuckDBPyConnection, run_a: str, run_b: str, thresholds: Thresholds) -> RunDiff:
    runs = {"run_a": run_a, "run_b": run_b}

    def rows(sql: str, **extra: float) -> pa.Table:
        return con.sql(sql, params={**runs, **extra}).to_arrow_table()

    return RunDiff(
        run_a,
        run_b,
        thresholds,
        matched_checks=rows(MATCHED_SQL).column(0)[0].as_py(),
        newly_failed=rows(NEWLY_FAILED_SQL),
        errors_grew=rows(ERRORS_GREW_SQL, factor=thresholds.error_factor),
        throughput_dropped=rows(THROUGHPUT_SQL, drop=thresholds.drop_percent),
        records=(run_record(con, run_a), run_record(con, run_b)),
        checks=tuple(
            con.sql("SELECT * FROM checks WHERE run_id = $r", params={"r": r}).to_arrow_table() for r in (run_a, run_b)
        ),
    )


def print_differences(diff: RunDiff, out: TextIO) -> None:
    differences = diff.differences
    if not differences:
        print("  the two runs were made alike (configuration, policies, versions, devices)", file=out)
        return
    print(f"  the runs differ in {len(differences)} ways; checks are matched only where their units are the same:", file=out)
    width = max(len(d.what) for d in differences)
    for d in differences:
        print(f"    {d.what:<{width}}  A: {d.a}", file=out)
        print(f"    {'':<{width}}  B: {d.b}", file=out)


def print_diff(diff: RunDiff, out: TextIO) -> None:
    t = diff.thresholds
    print(f"compare {diff.run_a} (A) -> {diff.run_b} (B)", file=out)
    print_differences(diff, out)
    print(f"  {diff.matched_checks} checks matched (same unit, output, kind and devices)", file=out)
    print_sections(
        [
            Section("Checks that passed in A and fail in B", diff.newly_failed, "none"),
            Section(f"Errors (max_abs) that grew more than {t.error_factor:g}x", diff.errors_grew, "none"),
            Section(
                f"Throughput that dropped more than {t.drop_percent:g}%",
                diff.throughput_dropped,
                "none, or no bench rows common to both runs",
            ),
        ],
        out,
    )
    if diff.regressed:
        print(
            f"\nREGRESSED: {diff.newly_failed.num_rows} checks now fail, {diff.errors_grew.num_rows} errors grew, "
            f"{diff.throughput_dropped.num_rows} throughputs dropped",
            file=out,
        )
    else:
        print("\nno regression", file=out)
