"""The driver of `harness sweep`, in the order a sweep happens:

plan units -> join or start Ray -> place the actors -> fan out the same bytes to every actor ->
gather and judge each unit -> stage its rows -> write the run's Parquet -> print the summary.
"""

from __future__ import annotations

import harness.devices  # noqa: F401  (sets TORCH_DEVICE_BACKEND_AUTOLOAD before torch loads)

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import ray

from harness.cluster import Placement, card_count, connect, describe_actors, place
from harness.config import SweepConfig
from harness.devices import resolve_accelerator
from harness.errors import UsageError, first_line
from harness.compare import TOLERANCES
from harness.faults import parse_faults
from harness.localize import first_divergent_layer, layer_modules
from harness.plan import BatchWork, Unit, plan_units
from harness.policies import PolicyNet, load_policy
from harness.provenance import new_run_row, now
from harness.results import STAGING, CheckRow, EpisodeRow, RunWriter, new_run_id, read_run, table_dir
from harness.summary import print_summary
from harness.verdicts import error_row, judge_batch, judge_episodes


@dataclass
class Timings:
    """Where the wall time went; the benchmark reports these."""

    startup_s: float = 0.0  # Ray start and actors ready
    fanout_s: float = 0.0  # submitting every unit to every actor
    compute_s: float = 0.0  # waiting for actors' results (gather)
    judge_s: float = 0.0  # comparison functions
    write_s: float = 0.0  # Parquet
    plan_s: float = 0.0  # loading policies, making batches


@dataclass
class SweepOutcome:
    run_id: str
    passed: bool
    status: str
    checks_path: Path
    timings: Timings


def run_sweep(config: SweepConfig, command: str = "") -> SweepOutcome:
    timings = Timings()
    started = now()
    if config.resume:
        config, started = resume_config(config)
    t = time.perf_counter()
    results = Path(config.results)
    faults = parse_faults(config.inject_fault)
    kind = resolve_accelerator(config.accelerator)
    policies = {name: load_policy(name) for name in config.policies}
    units = plan_units(config, policies)
    run_id, writer, todo = _open_run(config, results, units)
    timings.plan_s = time.perf_counter() - t

    t = time.perf_counter()
    connect(config.address, kind, config.cards)
    try:
        n_cards = card_count(kind, config.cards)
        placement = place(config, kind, n_cards, policies, faults, writer.staging / "faults")
        cards, reference = describe_actors(placement, policies)
        timings.startup_s = time.perf_counter() - t
        run_row = new_run_row(
            started_at=started, status="running", accelerator=kind, n_cards=n_cards, devices=cards + [reference],
            config_json=config.to_json(), policies=policies, command=command, faults=",".join(map(str, faults)),
        )
        writer.begin(run_row)
        labels = [str(c["label"]) for c in cards]
        dead = _fan_out_and_judge(placement, labels, policies, todo, writer, timings, config.progress)
    finally:
        ray.shutdown()

    t = time.perf_counter()
    checks, _ = writer.finish()
    passed = bool(checks.num_rows) and all(checks.column("passed").to_pylist())
    status = "passed" if passed else "failed"
    run_row.finished_at, run_row.status = now(), status
    run_row.summary = json.dumps({"units": len(units), "resumed_units": len(units) - len(todo), "dead_cards": dead,
                                  "timings_s": {k: round(v, 3) for k, v in vars(timings).items() if isinstance(v, float)}})
    writer.write_run(run_row)
    timings.write_s += time.perf_counter() - t
    print_summary(checks, run_id, status, sys.stdout)
    return SweepOutcome(run_id, passed, status, table_dir(results, "checks", run_id), timings)


def resume_config(config: SweepConfig) -> tuple[SweepConfig, str]:
    """The interrupted run's own configuration (so its units are planned again, identically) and
    its start time. Where to find the results and the cluster come from this invocation."""
    results = Path(config.results)
    try:
        [stored] = read_run(results, config.resume)
    except (FileNotFoundError, ValueError):
        raise UsageError(f"--resume {config.resume}: no such run in {results}") from None
    if not (results / STAGING / config.resume).is_dir():
        raise UsageError(f"--resume {config.resume}: that run finished ({stored['status']}); nothing to resume")
    resumed = SweepConfig(**json.loads(stored["config_json"]))
    resumed.results, resumed.address, resumed.progress = config.results, config.address, config.progress
    resumed.resume, resumed.run_id = config.resume, config.resume
    return resumed, stored["started_at"]


def _open_run(config: SweepConfig, results: Path, units: list[Unit]) -> tuple[str, RunWriter, list[Unit]]:
    if config.resume:
        writer = RunWriter(results, config.resume)
        done = writer.done_units()
        return config.resume, writer, [u for u in units if u.unit_id not in done]
    run_id = config.run_id or new_run_id()
    if table_dir(results, "runs", run_id).exists():
        raise UsageError(f"--run-id {run_id}: a run of that name exists in {results}; pick another or --resume it")
    return run_id, RunWriter(results, run_id), units


def _fan_out_and_judge(
    placement: Placement,
    labels: list[str],
    policies: dict[str, PolicyNet],
    units: list[Unit],
    writer: RunWriter,
    timings: Timings,
    progress: bool,
) -> list[str]:
    """Send every unit to every actor at once, then judge units in order as results arrive."""
    from tqdm import tqdm

    t = time.perf_counter()
    reference_refs: dict[tuple[str, str], tuple[ray.ObjectRef, ray.ObjectRef | None]] = {}
    pending = [(unit, _submit(placement, unit), _submit_reference(placement, unit, policies, reference_refs)) for unit in units]
    timings.fanout_s = time.perf_counter() - t
    dead: set[str] = set()
    bar = tqdm(total=len(units), desc="sweep", unit="unit", disable=not progress, file=sys.stderr)
    for unit, card_refs, (ref_ref, onnx_ref) in pending:
        t = time.perf_counter()
        reference = ray.get(ref_ref)
        onnx = ray.get(onnx_ref) if onnx_ref is not None else None
        outputs, errors = {}, []
        for label, ref in zip(labels, card_refs):
            try:
                outputs[label] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                dead.add(label)
                errors.append(error_row(unit, label, f"{label} produced nothing: {first_line(exc)}"))
        timings.compute_s += time.perf_counter() - t

        t = time.perf_counter()
        checks, episodes = _judge(unit, outputs, reference, onnx)
        if isinstance(unit.work, BatchWork):
            _localize_failures(placement, labels, policies[unit.policy], unit, checks)
        timings.judge_s += time.perf_counter() - t
        t = time.perf_counter()
        writer.stage_unit(unit.unit_id, errors + checks, episodes)
        timings.write_s += time.perf_counter() - t
        bar.update(1)
    bar.close()
    return sorted(dead)


def _submit(placement: Placement, unit: Unit) -> list[ray.ObjectRef]:
    if isinstance(unit.work, BatchWork):
        batch = unit.work.batch
        return [c.run_batch.remote(unit.policy, unit.dtype, batch.obs, batch.noise) for c in placement.cards]
    w = unit.work
    return [c.run_episodes.remote(unit.policy, unit.dtype, w.env_id, list(w.seeds), w.stochastic) for c in placement.cards]


def _submit_reference(
    placement: Placement, unit: Unit, policies: dict[str, PolicyNet], submitted: dict[tuple[str, str], tuple[ray.ObjectRef, ray.ObjectRef | None]]
) -> tuple[ray.ObjectRef, ray.ObjectRef | None]:
    """The reference is float32 whatever the unit's dtype: run it once per (policy, workload)."""
    key = (unit.policy, unit.workload)
    if key not in submitted:
        ref = placement.reference
        if isinstance(unit.work, BatchWork):
            batch = unit.work.batch
            torch_ref = ref.run_batch.remote(unit.policy, "float32", batch.obs, batch.noise)
            onnx_ref = ref.run_onnx.remote(unit.policy, batch.obs) if policies[unit.policy].info.onnx_path else None
        else:
            w = unit.work
            torch_ref, onnx_ref = ref.run_episodes.remote(unit.policy, "float32", w.env_id, list(w.seeds), w.stochastic), None
        submitted[key] = (torch_ref, onnx_ref)
    return submitted[key]


def _judge(unit: Unit, outputs: dict, reference: object, onnx: dict | None) -> tuple[list[CheckRow], list[EpisodeRow]]:
    if isinstance(unit.work, BatchWork):
        return judge_batch(unit, outputs, reference, onnx), []
    return judge_episodes(unit, outputs, reference)


def _localize_failures(placement: Placement, labels: list[str], policy: PolicyNet, unit: Unit, checks: list[CheckRow]) -> None:
    """For each card that failed a check on this batch, name the first layer where it parts from
    what it was compared with (card 0, or the CPU), on the same input; appended to `detail`."""
    assert isinstance(unit.work, BatchWork)
    obs = unit.work.batch.obs
    failing = {(r.kind, r.device_a) for r in checks if not r.passed and r.kind in ("cross_card", "cpu_reference")}
    for kind, label in sorted(failing):
        card = placement.cards[labels.index(label)]
        if kind == "cross_card":
            other, tol = placement.cards[0].capture.remote(unit.policy, unit.dtype, obs), None
        else:
            other, tol = placement.reference.capture.remote(unit.policy, "float32", obs), TOLERANCES[unit.dtype]
        try:
            mine, theirs = ray.get([card.capture.remote(unit.policy, unit.dtype, obs), other])
        except ray.exceptions.RayError as exc:
            note = f"layer search failed: {first_line(exc)}"
        else:
            divergence = first_divergent_layer(mine, theirs, tol, modules=layer_modules(policy))
            note = divergence.describe() if divergence else "no layer differs on a second run: the mismatch did not repeat"
        for row in checks:
            if (row.kind, row.device_a) == (kind, label) and not row.passed:
                row.detail = f"{row.detail}; {note}" if row.detail else note

