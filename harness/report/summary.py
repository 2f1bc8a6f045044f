"""The tables printed at the end of a run: for a sweep, policy x dtype x check kind, pass or fail,
worst error; for a bench, one line per measurement."""

from __future__ import annotations

from typing import TextIO

import pyarrow as pa
import pyarrow.compute as pc

from harness.store.schema import BenchRow


def summarize(checks: pa.Table) -> list[dict[str, object]]:
    """One row per (policy, dtype, kind): checks run, failed, worst max_abs, first failing detail."""
    groups: dict[tuple[str, str, str], dict[str, object]] = {}
    for row in checks.to_pylist():
        key = (row["policy"], row["dtype"], row["kind"])
        g = groups.setdefault(key, {"policy": key[0], "dtype": key[1], "kind": key[2], "checks": 0, "failed": 0, "worst_max_abs": 0.0, "first_failure": ""})
        g["checks"] += 1
        if row["max_abs"] == row["max_abs"]:  # NaN on error rows
            g["worst_max_abs"] = max(g["worst_max_abs"], row["max_abs"])
        if not row["passed"]:
            g["failed"] += 1
            if not g["first_failure"]:
                g["first_failure"] = f"{row['workload']}/{row['output']} {row['device_a']} vs {row['device_b'] or '-'}: {row['detail']}"
    # Keep the order the sweep was asked in (policies, then dtypes); kinds in a fixed order.
    kinds = ["error", "cross_card", "cpu_reference", "onnx_reference"]
    order = {k: i for i, k in enumerate(dict.fromkeys(r["policy"] for r in checks.to_pylist()))}
    dtypes = ["float32", "float16", "bfloat16"]
    return sorted(groups.values(), key=lambda g: (order[g["policy"]], dtypes.index(g["dtype"]) if g["dtype"] in dtypes else 9, kinds.index(g["kind"])))


def short_name(policy: str) -> str:
    """A path's file name (the part that tells policies apart), cut to the column."""
    name = policy.rsplit("/", 1)[-1]
    return name if len(name) <= 24 else name[:23] + "~"


def print_summary(checks: pa.Table, run_id: str, status: str, out: TextIO) -> None:
    rows = summarize(checks)
    header = f"{'policy':<24} {'dtype':<9} {'check':<15} {'verdict':<8} {'checks':>6} {'worst max_abs':>14}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        verdict = "PASS" if r["failed"] == 0 else f"FAIL {r['failed']}"
        print(f"{short_name(str(r['policy'])):<24} {r['dtype']:<9} {r['kind']:<15} {verdict:<8} {r['checks']:>6} {r['worst_max_abs']:>14.3g}", file=out)
    failures = [r for r in rows if r["failed"]]
    for r in failures:
        print(f"  FAIL {r['policy']} {r['dtype']} {r['kind']}: {r['first_failure']}", file=out)
    n_failed = int(pc.sum(pc.invert(checks.column("passed"))).as_py() or 0) if checks.num_rows else 0
    print(f"run {run_id}: {status.upper()} ({checks.num_rows} checks, {n_failed} failed)", file=out)


def print_bench_summary(rows: list[BenchRow], run_id: str, out: TextIO) -> None:
    header = f"{'mode':<11} {'timing':<10} {'policy':<24} {'dtype':<8} {'device':<17} {'batch':>6} {'first ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'decisions/s':>13} {'scaling':>7}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        print(
            f"{r.mode:<11} {r.timing:<10} {short_name(r.policy):<24} {r.dtype:<8} {r.device[:17]:<17} {r.batch_size:>6} {_num(r.first_call_ms, 9, '.3f')} "
            f"{_num(r.p50_ms, 9, '.3f')} {_num(r.p99_ms, 9, '.3f')} {_num(r.decisions_per_s, 13, ',.0f')} {_num(r.scaling_efficiency, 7, '.2f')}",
            file=out,
        )
    print(f"run {run_id}: {len(rows)} bench rows", file=out)


def _num(value: float | None, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"
