"""`harness repro RUN_ID`: a failing check of a sweep as a folder its card's vendor can run
without the harness, as Polygraphy's `--save-outputs` and `--gen-script` hand over a failure.

The check's batch is made again from the run's configuration and must have the sha256 the run
recorded (the bytes that went in); its unit is run again on the run's cards, with the run's
faults, and judged as the sweep judged it; the card then traces its own copy of the policy
(harness/inference/torchscript.py). The folder holds the batch, the card's, the golden's and the
CPU's outputs, the traced model (or, with `copy_weights` False, only its weights' sha256 and
where they came from), a manifest of what the run recorded (the check, the card, the dtype, the
versions and precision settings) and the script (harness/repro/script.py) that reruns the
model on a device and prints the mismatch.
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import ray

from harness.dtypes import MANTISSA_BITS, base_dtype, precision_of
from harness.errors import InfrastructureError, UsageError, first_line
from harness.inference.fault_specs import striking
from harness.inference.torchscript import output_names
from harness.judge.kinds import CheckKind
from harness.judge.outcome import fails_the_run
from harness.diagnose.search import rerun_actors, rerun_plan, stored_config
from harness.sweeps.dispatch import Role, judge, submit
from harness.sweeps.gather import gather
from harness.cluster.phases import Phases
from harness.sweeps.plan import BatchWork, Unit, load_policies, plan_inputs
from harness.repro.script import weights_sha256
from harness.sweeps.driver import unit_rules
from harness.store.paths import inside, table_dir
from harness.store.writer import read_run

# The checks a batch and a model can show again: the port rule, cards bit for bit, decisions.
REPRODUCIBLE = (CheckKind.CPU_REFERENCE, CheckKind.CROSS_CARD, CheckKind.DECISIONS)
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class Wanted:
    """Which failing check: the first gating one of the run that matches every field given."""

    kind: str | None = None
    card: str | None = None
    policy: str | None = None
    dtype: str | None = None
    workload: str | None = None
    output: str | None = None

    def matches(self, row: dict[str, Any]) -> bool:
        given = {"kind": self.kind, "device_a": self.card, "policy": self.policy, "dtype": self.dtype}
        given |= {"workload": self.workload, "output": self.output}
        return all(value is None or row[column] == value for column, value in given.items())


def pick(rows: list[dict[str, Any]], wanted: Wanted) -> dict[str, Any]:
    """The first failing gating check of a batch that matches `wanted`; a UsageError naming the
    failing checks there are where none does."""
    failing = [r for r in rows if fails_the_run(r["gating"], r["passed"])]
    batch = [r for r in failing if r["kind"] in REPRODUCIBLE and r["device_a"]]
    found = [r for r in batch if wanted.matches(r)]
    if found:
        return found[0]
    listed = "; ".join(
        f"{r['kind']} {r['device_a']} {r['policy']} {r['dtype']} {r['workload']} {r['output']}" for r in batch[:5]
    )
    raise UsageError(
        f"no failing {'/'.join(REPRODUCIBLE)} check of a batch matches"
        + (f"; the run's: {listed}" if listed else "; the run has none (episodes and invariance are not reproduced)")
    )


def repro(results: Path, run_id: str, wanted: Wanted, address: str | None, copy_weights: bool) -> Path:
    """The repro folder of the check `wanted` picks in run `run_id`; its path."""
    config = stored_config(results, run_id)
    [run] = read_run(results, run_id)
    row = pick(pq.read_table(table_dir(results, "checks", run_id)).to_pylist(), wanted)
    step = rerun_plan(config, results, address, [row["policy"]], keep_plan=True)
    specs, policies = load_policies(step.common)
    policy = policies[row["policy"]]
    batch = next((b for b in plan_inputs(step, policy).batches if b.name == row["workload"]), None)
    if batch is None or batch.sha256 != row["input_sha256"]:
        raise UsageError(
            f"{run_id}: the batch {row['workload']} made again is not the one the run judged (sha256 "
            f"{row['input_sha256'][:12]}): the policy's files or the harness changed since"
        )
    unit = Unit(row["unit_id"], row["policy"], row["dtype"], BatchWork(batch))
    folder = inside(results, results / "repro" / run_id / _slug(row))
    with rerun_actors(step, specs, policies, folder, Phases()) as (placement, watch):
        labels = [c.label for c in placement.cards]
        if row["device_a"] not in labels:
            raise UsageError(f"{run_id}: its card {row['device_a']} is not among this cluster's ({', '.join(labels)})")
        gathered = gather(watch.track(submit(placement, unit, None)), watch)
        position = watch.lane_of(row["device_a"])
        what = f"the repro of {unit.policy} {unit.dtype} {unit.workload}"
        exported = placement.cards[position].actor.export(unit.policy, base_dtype(unit.dtype), batch.obs, batch.noise)
        try:
            [model] = watch.get(watch.follow(position, [exported], what))
        except ray.exceptions.RayError as exc:
            raise InfrastructureError(
                f"{row['device_a']} could not trace its copy of {unit.policy}: {first_line(exc)}"
            ) from None
    if gathered is None or row["device_a"] not in gathered[0].cards:
        raise InfrastructureError(f"{row['device_a']} did not compute {unit.workload} again")
    got = gathered[0]
    checks = judge(unit, unit_rules(step, unit, policy), step.require_batch_invariance, got).checks
    rerun = next(
        c
        for c in checks
        if (c.kind, c.output, c.device_a, c.device_b) == (row["kind"], row["output"], row["device_a"], row["device_b"])
    )
    import torch

    digest = weights_sha256(torch.jit.load(io.BytesIO(model), map_location="cpu"))  # type: ignore[no-untyped-call]
    [origin] = [p for p in json.loads(run["policies"]) if p.get("name") == row["policy"]] or [{"name": row["policy"]}]
    outputs: dict[str, Any] = {f"card/{k}": v for k, v in got.cards[row["device_a"]].items()}
    outputs |= {f"{name}/{k}": v for name, role in _SAVED.items() for k, v in got.references[role].items()}
    if row["kind"] == CheckKind.CROSS_CARD:
        outputs |= {f"other/{k}": v for k, v in got.cards[row["device_b"]].items()}
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    arrays: dict[str, Any] = {f"obs{i}": o for i, o in enumerate(batch.obs)} | {"noise": batch.noise}
    np.savez(folder / "inputs.npz", **arrays)
    np.savez(folder / "outputs.npz", **outputs)
    if copy_weights:
        (folder / "model.pt").write_bytes(model)
    manifest = {
        "version": MANIFEST_VERSION,
        "run_id": run_id,
        "check": {k: _plain(v) for k, v in row.items()},
        "rerun": {"passed": rerun.passed, "detail": rerun.result.detail},
        "card": {
            **placement.cards[position].described.record(),
            "position": position,
            "faults": [str(f) for f in striking(step.common.faults, position)],
        },
        "dtype": {
            "label": row["dtype"],
            "computes_in": base_dtype(row["dtype"]),
            "mantissa_bits": MANTISSA_BITS[precision_of(row["dtype"])],
            "precision": step.common.precision,
            "threads": step.common.threads,
        },
        "versions": {k: run[k] for k in ("harness_version", "torch_version", "ray_version", "git_revision", "hostname")},
        "devices": json.loads(run["devices"]),
        "input": {"workload": batch.name, "sha256": batch.sha256, "n_obs": len(batch.obs), "rows": batch.size},
        "outputs": output_names(policy),
        "weights": {"sha256": digest, "file": "model.pt" if copy_weights else None, "origin": origin},
        "command": run["command"],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    shutil.copyfile(Path(__file__).with_name("script.py"), folder / "repro.py")
    print(
        f"{row['kind']} {row['device_a']} {row['policy']} {row['dtype']} {row['workload']} {row['output']}: "
        f"{'FAIL again' if not rerun.passed else 'PASS, unlike the run'} on this rerun"
    )
    return folder


# The references a repro keeps, by the name the script reads them under.
_SAVED = {"golden": Role.GOLDEN, "cpu_same": Role.SAME}


def _slug(row: dict[str, Any]) -> str:
    """A folder name of the check: kind, card, dtype, workload and output, in safe characters."""
    parts = (row["kind"], row["device_a"], row["policy"], row["dtype"], row["workload"], row["output"])
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(str(p) for p in parts)).strip("_")[-180:]


def _plain(value: Any) -> Any:
    """A column's value as JSON holds it: NaN and inf as strings."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value
