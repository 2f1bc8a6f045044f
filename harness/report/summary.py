"""The tables printed at the end of a run: for a sweep, policy x dtype x check kind, pass or fail,
worst error; for a bench, one line per measurement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TextIO, assert_never

import pyarrow as pa
import pyarrow.compute as pc

from harness.dtypes import LABEL_ORDER
from harness.judge.kinds import CheckKind
from harness.store.schema import BenchRow


def measured_over_limit(row: dict[str, Any]) -> float | None:
    """How close a row came to its limit, unitless: 1 is the limit, above it fails. None for
    checks with no scale (bit for bit, errors) or no limit recorded."""
    kind = CheckKind(row["kind"])
    match kind:
        case CheckKind.CPU_REFERENCE | CheckKind.ONNX_REFERENCE:
            if not row.get("ratio_limit"):
                return None
            return float(max(row["error_ratio"], row["max_ratio"]) / row["ratio_limit"])
        case CheckKind.TOLERANCE:
            if row.get("atol") is None:
                return None
            bound = row["atol"] + row["rtol"] * row["ref_max_abs"]
            by_abs = row["max_abs"] / bound if bound > 0 else (0.0 if row["max_abs"] == 0 else float("inf"))
            slack = 1.0 - row["min_cos"]
            by_cos = (1.0 - row["cosine"]) / slack if slack > 0 else 0.0
            return float(max(by_abs, by_cos))
        case CheckKind.DECISIONS:
            if not row.get("n_flips"):
                return 0.0
            limit = row["flip_margin_limit"]
            return float(row["max_flip_margin"] / limit) if limit else float("inf")
        case CheckKind.EPISODE_RETURN:
            return float(row["return_rel_diff"] / row["return_rtol"]) if row.get("return_rtol") else None
        case CheckKind.ERROR | CheckKind.CROSS_CARD | CheckKind.BATCH_INVARIANCE | CheckKind.BENCH_AUDIT:
            return None
        case _:
            assert_never(kind)


@dataclass
class Group:
    """The checks of one (policy, dtype, kind): how many, how many failed (gating) or were found
    (not gating), the worst measured/limit (or ULPs, for bit-for-bit checks), the first failure."""

    policy: str
    dtype: str
    kind: str
    checks: int = 0
    failed: int = 0
    findings: int = 0
    gating: bool = False
    worst: float | None = None
    max_ulp: int = 0
    first_failure: str = ""

    def add(self, row: dict[str, Any]) -> None:
        self.checks += 1
        self.gating = self.gating or row["gating"]
        score = measured_over_limit(row)
        if score is not None and (self.worst is None or not score <= self.worst):
            self.worst = score
        if row.get("max_ulp") is not None:
            self.max_ulp = max(self.max_ulp, row["max_ulp"])
        if not row["passed"]:
            if row["gating"]:
                self.failed += 1
            else:
                self.findings += 1
            if not self.first_failure:
                self.first_failure = (
                    f"{row['workload']}/{row['output']} {row['device_a']} vs {row['device_b'] or '-'}: {row['detail']}"
                )

    @property
    def verdict(self) -> str:
        if self.failed:
            return f"FAIL {self.failed}"
        if self.findings:
            return f"finding {self.findings}"
        return "PASS" if self.gating else "pass"

    @property
    def worst_text(self) -> str:
        if self.worst is not None:
            return f"{self.worst:.3g}"
        if self.kind == CheckKind.ERROR:
            return "-"
        return "equal" if self.max_ulp == 0 else f"{self.max_ulp} ulp"


def summarize(checks: pa.Table) -> list[Group]:
    """One group per (policy, dtype, kind), in the order the sweep was asked in (policies, then
    dtypes), kinds in a fixed order."""
    groups: dict[tuple[str, str, str], Group] = {}
    rows = checks.to_pylist()
    for row in rows:
        key = (row["policy"], row["dtype"], row["kind"])
        groups.setdefault(key, Group(*key)).add(row)
    order = {k: i for i, k in enumerate(dict.fromkeys(r["policy"] for r in rows))}
    return sorted(
        groups.values(), key=lambda g: (order[g.policy], _position(LABEL_ORDER, g.dtype), _position(tuple(CheckKind), g.kind))
    )


def _position(order: tuple[str, ...], value: str) -> int:
    return order.index(value) if value in order else len(order)


def short_name(policy: str) -> str:
    """A path's file name (the part that tells policies apart), cut to the column."""
    name = policy.rsplit("/", 1)[-1]
    return name if len(name) <= 24 else name[:23] + "~"


def print_summary(
    checks: pa.Table, run_id: str, status: str, out: TextIO, without_episodes: dict[str, str] | None = None
) -> None:
    """The verdict table: PASS/FAIL count only gating rows; lower-case "pass" and "finding" mark
    checks that do not gate (the tolerance table off bounded outputs, batch invariance)."""
    groups = summarize(checks)
    header = f"{'policy':<24} {'dtype':<13} {'check':<17} {'verdict':<11} {'checks':>6} {'worst/limit':>12}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for g in groups:
        print(
            f"{short_name(g.policy):<24} {g.dtype:<13} {g.kind:<17} {g.verdict:<11} {g.checks:>6} {g.worst_text:>12}",
            file=out,
        )
    for g in groups:
        # Batch invariance is the card's property: said once per card below.
        if (g.failed or g.findings) and not (g.kind == CheckKind.BATCH_INVARIANCE and not g.failed):
            label = "FAIL" if g.failed else "finding (not gating)"
            print(f"  {label} {g.policy} {g.dtype} {g.kind}: {g.first_failure}", file=out)
    for line in batch_invariance_lines(checks):
        print(f"  {line}", file=out)
    for policy, flag in (without_episodes or {}).items():
        print(f"  no episodes for {policy}: it names no environment ({flag} gives it episodes)", file=out)
    gating = checks.filter(checks.column("gating")) if checks.num_rows else checks
    n_failed = int(pc.sum(pc.invert(gating.column("passed"))).as_py() or 0) if gating.num_rows else 0
    print(f"run {run_id}: {status.upper()} ({checks.num_rows} checks, {gating.num_rows} gating, {n_failed} failed)", file=out)


def batch_invariance_lines(checks: pa.Table) -> list[str]:
    """Batch invariance as a property of each card: does a row computed alone equal the same row
    inside a large batch, bit for bit?"""
    rows = [r for r in checks.to_pylist() if r["kind"] == CheckKind.BATCH_INVARIANCE]
    lines = []
    for device in dict.fromkeys(r["device_a"] for r in rows):
        differ = [r for r in rows if r["device_a"] == device and not r["bitwise_equal"]]
        if not differ:
            lines.append(
                f"batch invariance: {device} gives the same bits alone and inside a batch "
                f"({sum(r['device_a'] == device for r in rows)} checks)"
            )
            continue
        where = sorted({(r["policy"].rsplit("/", 1)[-1], r["dtype"]) for r in differ})
        worst = max(r["max_ulp"] for r in differ)
        shown = ", ".join(f"{p} {d}" for p, d in where[:4]) + (", ..." if len(where) > 4 else "")
        lines.append(
            f"batch invariance: {device} gives other bits for rows alone than inside a batch ({shown}; max {worst} ulp)"
        )
    return lines


def print_bench_summary(rows: list[BenchRow], run_id: str, out: TextIO) -> None:
    header = (
        f"{'mode':<11} {'timing':<10} {'policy':<24} {'dtype':<8} {'device':<17} {'batch':>6} {'first ms':>9} "
        f"{'p50 ms':>9} {'p99 ms':>9} {'decisions/s':>13} {'scaling':>7}"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        print(
            f"{r.mode:<11} {r.timing:<10} {short_name(r.policy):<24} {r.dtype:<8} {r.device[:17]:<17} "
            f"{r.batch_size:>6} {_num(r.first_call_ms, 9, '.3f')} "
            f"{_num(r.p50_ms, 9, '.3f')} {_num(r.p99_ms, 9, '.3f')} {_num(r.decisions_per_s, 13, ',.0f')} "
            f"{_num(r.scaling_efficiency, 7, '.2f')}",
            file=out,
        )
    print(f"run {run_id}: {len(rows)} bench rows", file=out)


def _num(value: float | None, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"
