"""The tables printed at the end of a run: for a sweep, policy x dtype x check kind, pass or fail,
worst error; for a bench, one line per measurement with its interval and validity."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.compute as pc

from harness.dtypes import LABEL_ORDER
from harness.judge.bench_stats import QUICK_LOOK, round_trip_dominates
from harness.judge.compare import Comparison
from harness.judge.kinds import CheckKind
from harness.judge.outcome import Gating, Verdict, fails_the_run
from harness.judge.results import read_result
from harness.judge.returns import Outcome, ReturnComparison
from harness.report.names import PolicyNames
from harness.store.schema import BenchRow, CheckRow

# Undecided closed-loop verdicts listed one by one in the summary; `harness report` lists them all.
MAX_SHOWN = 5


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
    inconclusive: int = 0
    gating: bool = False
    worst: float | None = None
    max_ulp: int = 0
    first_failure: str = ""

    def add(self, row: dict[str, Any]) -> None:
        """One stored row, read back as its result: the result's own rule says how near its limit it came."""
        result = read_result(row)
        self.checks += 1
        self.gating = self.gating or row["gating"]
        score = None if result is None else result.over_limit()
        if score is not None and (self.worst is None or not score <= self.worst):
            self.worst = score
        if isinstance(result, Comparison):
            self.max_ulp = max(self.max_ulp, result.max_ulp)
        if not row["passed"]:
            if isinstance(result, ReturnComparison) and result.outcome == Outcome.INCONCLUSIVE and not row["gating"]:
                self.inconclusive += 1
            elif fails_the_run(row["gating"], row["passed"]):
                self.failed += 1
            else:
                self.findings += 1
            if not self.first_failure:
                self.first_failure = (
                    f"{row['workload']}/{row['output']} {row['device_a']} vs {row['device_b'] or '-'}: {row['detail']}"
                )

    @property
    def verdict(self) -> str:
        """FAIL (gating), then INCONCLUSIVE (never a pass), then finding (not gating), then PASS."""
        if self.failed:
            return f"FAIL {self.failed}"
        if self.inconclusive:
            return f"INCONCLUSIVE {self.inconclusive}"
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


def names_of(checks: pa.Table) -> PolicyNames:
    """The labels of the policies these checks are of."""
    return PolicyNames.of(checks.column("policy").to_pylist() if checks.num_rows else [])


def gating_of(checks: pa.Table) -> Gating:
    """The gating checks of `checks`, counted."""
    if not checks.num_rows:
        return Gating()
    return Gating.count(zip(checks.column("gating").to_pylist(), checks.column("passed").to_pylist(), strict=True))


def print_summary(
    checks: pa.Table,
    run_id: str,
    verdict: Verdict,
    out: TextIO,
    without_episodes: dict[str, str] | None = None,
    env_renames: dict[str, str] | None = None,
    notes: list[str] | None = None,
    units_done: tuple[int, int] | None = None,
) -> None:
    """The verdict table: PASS/FAIL count only gating rows; lower-case "pass" and "finding" mark
    checks that do not gate (the tolerance table off bounded outputs, batch invariance, the
    published score); then each environment id gymnasium renamed, once per policy. `notes` are
    said before the verdict (a card that was replaced, one that was lost); a run that ended early
    says how many of its units it finished (`units_done`: done, all)."""
    groups = summarize(checks)
    names = names_of(checks)
    width = max(24, names.width)
    header = f"{'policy':<{width}} {'dtype':<13} {'check':<17} {'verdict':<14} {'checks':>6} {'worst/limit':>12}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for g in groups:
        print(
            f"{names(g.policy):<{width}} {g.dtype:<13} {g.kind:<17} {g.verdict:<14} {g.checks:>6} {g.worst_text:>12}",
            file=out,
        )
    for g in groups:
        # Batch invariance is the card's property: said once per card below; INCONCLUSIVE all at once.
        if (g.failed or g.findings) and not (g.kind == CheckKind.BATCH_INVARIANCE and not g.failed):
            label = "FAIL" if g.failed else "finding (not gating)"
            print(f"  {label} {g.policy} {g.dtype} {g.kind}: {g.first_failure}", file=out)
    for line in inconclusive_lines(checks):
        print(f"  {line}", file=out)
    for line in batch_invariance_lines(checks):
        print(f"  {line}", file=out)
    for policy, flag in (without_episodes or {}).items():
        print(f"  no episodes for {policy}: it names no environment ({flag} gives it episodes)", file=out)
    for policy, rename in (env_renames or {}).items():
        print(f"  renamed environment for {policy}: {rename}", file=out)
    gating = gating_of(checks)
    for note in notes or []:
        print(f"  {note}", file=out)
    counts = f"{checks.num_rows} checks, {gating.checks} gating, {gating.failed} failed"
    n_inconclusive = len(undecided(checks))
    if n_inconclusive:
        counts += f", {n_inconclusive} inconclusive"
    if units_done:
        counts = f"{units_done[0]} of {units_done[1]} units done and kept; {counts}"
    print(f"run {run_id}: {verdict} ({counts})", file=out)


def undecided(checks: pa.Table) -> list[dict[str, Any]]:
    """The closed-loop verdicts their episodes could not decide (INCONCLUSIVE)."""
    if "outcome" not in checks.column_names:
        return []
    return [r for r in checks.filter(pc.equal(checks.column("outcome"), str(Outcome.INCONCLUSIVE))).to_pylist()]


def inconclusive_lines(checks: pa.Table) -> list[str]:
    """Closed-loop verdicts their episodes cannot decide, said loudly: how many, which, whether
    they gate, and how to decide them."""
    rows = undecided(checks)
    if not rows:
        return []
    gating = sum(r["gating"] for r in rows)
    needed = [r["episodes_needed"] for r in rows if r["episodes_needed"] is not None]
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(Counter(r["kind"] for r in rows).items()))
    how = f"--episodes {max(needed)} (the most any says would decide) or " if needed else ""
    gate = (
        f"{gating} of them gate (--require-conclusive)"
        if gating
        else "not gating and never a pass (--require-conclusive makes them gate)"
    )
    lines = [
        f"INCONCLUSIVE: {len(rows)} closed-loop verdicts ({kinds}) cannot tell from their episodes whether the "
        f"card loses more return than the margin; {gate}; decide them with {how}--episodes auto"
    ]
    names = names_of(checks)
    for r in rows[:MAX_SHOWN]:
        lines.append(f"  {names(r['policy'])} {r['dtype']} {r['workload']} {r['device_a']}: {r['detail']}")
    if len(rows) > MAX_SHOWN:
        lines.append(f"  ... and {len(rows) - MAX_SHOWN} more (harness report shows them all)")
    return lines


def batch_invariance_lines(checks: pa.Table) -> list[str]:
    """Batch invariance as a property of each card: does a row computed alone equal the same row
    inside a large batch, bit for bit?"""
    rows = [
        (r, result)
        for r in checks.to_pylist()
        if r["kind"] == CheckKind.BATCH_INVARIANCE and isinstance(result := read_result(r), Comparison)
    ]
    names = names_of(checks)
    lines = []
    for device in dict.fromkeys(r["device_a"] for r, _ in rows):
        mine = [(r, result) for r, result in rows if r["device_a"] == device]
        differ = [(r, result) for r, result in mine if not result.passed]
        if not differ:
            lines.append(f"batch invariance: {device} gives the same bits alone and inside a batch ({len(mine)} checks)")
            continue
        where = sorted({(names(r["policy"]), r["dtype"]) for r, _ in differ})
        worst = max(result.max_ulp for _, result in differ)
        shown = ", ".join(f"{p} {d}" for p, d in where[:4]) + (", ..." if len(where) > 4 else "")
        lines.append(
            f"batch invariance: {device} gives other bits for rows alone than inside a batch ({shown}; max {worst} ulp)"
        )
    return lines


def print_bench_summary(rows: list[BenchRow], checks: list[CheckRow], run_id: str, verdict: Verdict, out: TextIO) -> None:
    """One line per row: its figures, the 95% interval of its headline figure (`ci_of`) and of
    its scaling efficiency, and whether it is valid; figures of an invalid row are in
    parentheses, never shown as a result. Then why rows are invalid, where the Ray round trip
    dominates, and the audit."""
    names = PolicyNames.of([*(r.policy for r in rows), *(c.policy for c in checks)])
    width = max(20, names.width)
    header = (
        f"{'mode':<11} {'timing':<10} {'policy':<{width}} {'dtype':<8} {'device':<17} {'batch':>5} {'first ms':>8} "
        f"{'p50 ms':>9} {'p99 ms':>9} {'decisions/s':>13} {'max qps':>9}  {'95% interval':<24} {'scaling (95%)':<21} valid"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        shown = _num if r.valid else _invalid
        print(
            f"{r.mode:<11} {r.timing:<10} {names(r.policy):<{width}} {r.dtype:<8} {r.device[:17]:<17} "
            f"{r.batch_size:>5} {_num(r.first_call_ms, 8, '.3f')} "
            f"{shown(r.p50_ms, 9, '.3f')} {shown(r.p99_ms, 9, '.3f')} {shown(r.decisions_per_s, 13, ',.0f')} "
            f"{shown(r.max_qps, 9, ',.0f')}  {_interval(r):<24} {_scaling(r):<21} {'yes' if r.valid else 'NO'}",
            file=out,
        )
    for line in invalid_lines(rows):
        print(f"  {line}", file=out)
    for line in host_bound_lines(rows, names):
        print(f"  {line}", file=out)
    print(f"  {audit_line(checks, names)}", file=out)
    n_valid = sum(r.valid for r in rows)
    audit = "FAILED" if verdict is Verdict.FAILED else "passed"
    print(f"run {run_id}: {len(rows)} bench rows ({n_valid} valid); audit {audit}", file=out)


def _interval(r: BenchRow) -> str:
    if r.ci_low is None or r.ci_high is None:
        return "-"
    what = {"decisions_per_s": "dec/s"}.get(r.ci_of, r.ci_of.removesuffix("_ms"))
    text = f"{what} {_short(r.ci_low)} to {_short(r.ci_high)}"
    return text if r.valid else f"({text})"


def _short(value: float) -> str:
    """Three significant digits, thousands and millions as k and M."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _scaling(r: BenchRow) -> str:
    if r.scaling_efficiency is None:
        return "-"
    text = f"{r.scaling_efficiency:.3f}"
    if r.scaling_ci_low is not None and r.scaling_ci_high is not None:
        text += f" [{r.scaling_ci_low:.2f}, {r.scaling_ci_high:.2f}]"
    return text if r.valid else f"({text})"


def invalid_lines(rows: list[BenchRow]) -> list[str]:
    """Why each invalid row is not a result; a quick look's rows all said in one line."""
    quick = [r for r in rows if QUICK_LOOK in r.invalid_reason]
    lines = [f"invalid: {len(quick)} rows are a {_quick_look_of(quick[0])}"] if quick else []
    return lines + [f"invalid: {r.row_id}: {r.invalid_reason}" for r in rows if not r.valid and r not in quick]


def _quick_look_of(row: BenchRow) -> str:
    return next(reason for reason in row.invalid_reason.split("; ") if QUICK_LOOK in reason)


def host_bound_lines(rows: list[BenchRow], names: PolicyNames) -> list[str]:
    """Where a card's device time is under half of its end-to-end time, the Ray round trip, not
    the card, sets the latency a caller sees."""
    device = {(r.policy, r.dtype, r.batch_size, r.device): r for r in rows if r.mode == "latency" and r.timing == "device"}
    lines = []
    for r in rows:
        mine = device.get((r.policy, r.dtype, r.batch_size, r.device))
        if r.mode != "latency" or r.timing != "end_to_end" or mine is None or mine.p50_ms is None or r.p50_ms is None:
            continue
        if round_trip_dominates(mine.p50_ms, r.p50_ms):
            lines.append(
                f"host-bound: {names(r.policy)} {r.dtype} batch {r.batch_size} on {r.device}: the Ray round trip "
                f"dominates (device p50 {mine.p50_ms:.3g} ms of {r.p50_ms:.3g} ms end to end)"
            )
    return lines


def audit_line(checks: list[CheckRow], names: PolicyNames) -> str:
    failed = [c for c in checks if not c.passed]
    if not checks:
        return "audit: nothing sampled"
    if not failed:
        return f"audit: {len(checks)} outputs sampled from the timed path equal the sweep's run_batch bit for bit"
    first = failed[0]
    return (
        f"FAIL audit: {len(failed)} of {len(checks)} sampled outputs differ from the sweep's run_batch; first: "
        f"{first.device_a} {names(first.policy)} {first.dtype} {first.workload}/{first.output}: {first.detail}"
    )


def _num(value: float | None, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def _invalid(value: float | None, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{f'({value:{spec}})':>{width}}"
