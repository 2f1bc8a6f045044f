"""The audit of `harness bench`: the timed path against the sweep's."""

from __future__ import annotations

import ray

from harness.judge.verdicts import judge_bench_audit
from harness.outputs import Outputs
from harness.benches.rows import BenchResult
from harness.sweeps.dispatch import check_row
from harness.store.schema import CheckRow


def audit(results: list[BenchResult]) -> list[CheckRow]:
    """Every sampled output of the timed path against the same card's `sweep_path` (the sweep's
    path) on the same input, bit for bit: a `bench_audit` check per output."""
    reference: dict[tuple[str, str, str, str], Outputs] = {}
    rows = []
    for r in results:
        for a in r.audit:
            s, w = a.sampled, a.sampled.work
            key = (s.card.label, w.policy, w.dtype, w.batch.sha256)
            if key not in reference:
                reference[key] = ray.get(s.card.actor.sweep_path(w.policy, w.dtype, w.batch.obs, w.batch.noise))
            rows += [
                check_row(
                    check,
                    unit_id=a.row_id,
                    policy=w.policy,
                    dtype=w.dtype,
                    workload=w.batch.name,
                    input_sha256=w.batch.sha256,
                )
                for check in judge_bench_audit(s.card.label, s.outputs, reference[key])
            ]
    return rows
