"""The driver of `harness sweep`, in the order a sweep happens:

plan units -> join or start Ray -> place the actors -> fan out the same bytes to every actor ->
gather and judge each unit -> stage its rows -> write the run's Parquet -> print the summary.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import ray

from harness.devices import resolve_accelerator
from harness.errors import UsageError, first_line
from harness.inference.capture import layer_modules
from harness.inference.faults import parse_faults
from harness.judge.compare import TOLERANCES
from harness.judge.localize import first_divergent_layer
from harness.judge.verdicts import REFERENCE, Check, error_check, judge_batch, judge_episodes
from harness.policies import PolicyNet, load_policy
from harness.report.summary import print_summary
from harness.run.lifecycle import Phases, claim_run_id, finish_run_row, ray_cluster
from harness.run.options import SweepConfig
from harness.run.place import Placement, describe_actors, place_sweep
from harness.run.plan import BatchWork, EpisodeWork, Unit, plan_units
from harness.run.provenance import new_run_row, now
from harness.store.schema import CheckRow, EpisodeRow
from harness.store.writer import STAGING, RunWriter, read_run, table_dir


@dataclass
class SweepOutcome:
    run_id: str
    passed: bool
    status: str
    checks_path: Path
    phases: Phases


def run_sweep(config: SweepConfig, command: str = "") -> SweepOutcome:
    phases = Phases()
    started = now()
    if config.resume:
        config, started = resume_config(config)
    results = Path(config.results)
    with phases("plan"):
        faults = parse_faults(config.inject_fault)
        kind = resolve_accelerator(config.accelerator)
        policies = {name: load_policy(name) for name in config.policies}
        units = plan_units(config, policies)
        run_id, writer, todo = _open_run(config, results, units)

    with ray_cluster(config.address, kind, config.cards, phases) as n_cards:
        with phases("startup"):
            placement = place_sweep(kind, n_cards, config.placement, list(policies), config.threads, faults, writer.staging / "faults")
            cards, reference = describe_actors(placement, policies)
        run_row = new_run_row(
            started_at=started, status="running", accelerator=kind, n_cards=n_cards, devices=cards + [reference],
            config_json=config.to_json(), policies=policies, command=command, faults=",".join(map(str, faults)),
        )
        writer.begin(run_row)
        labels = [str(c["label"]) for c in cards]
        dead = _fan_out_and_judge(placement, labels, policies, todo, writer, phases, config.progress)

    with phases("write"):
        checks, _ = writer.finish()
        passed = bool(checks.num_rows) and all(checks.column("passed").to_pylist())
        status = "passed" if passed else "failed"
        summary = {"units": len(units), "resumed_units": len(units) - len(todo), "dead_cards": dead}
        writer.write_run(finish_run_row(run_row, status, summary, phases))
    print_summary(checks, run_id, status, sys.stdout)
    return SweepOutcome(run_id, passed, status, table_dir(results, "checks", run_id), phases)


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
    """The run's writer and the units still to do: all of them, or those a resumed run lacks."""
    if config.resume:
        writer = RunWriter(results, config.resume)
        done = writer.done_units()
        return config.resume, writer, [u for u in units if u.unit_id not in done]
    run_id = claim_run_id(results, config.run_id)
    return run_id, RunWriter(results, run_id), units


def _fan_out_and_judge(
    placement: Placement,
    labels: list[str],
    policies: dict[str, PolicyNet],
    units: list[Unit],
    writer: RunWriter,
    phases: Phases,
    progress: bool,
) -> list[str]:
    """Send every unit to every actor at once, then judge units in order as results arrive."""
    from tqdm import tqdm

    with phases("fanout"):
        reference_refs: dict[tuple[str, str], tuple[ray.ObjectRef, ray.ObjectRef | None]] = {}
        pending = [(unit, _submit(placement, unit), _submit_reference(placement, unit, policies, reference_refs)) for unit in units]
    dead: set[str] = set()
    bar = tqdm(total=len(units), desc="sweep", unit="unit", disable=not progress, file=sys.stderr)
    for unit, card_refs, (ref_ref, onnx_ref) in pending:
        with phases("compute"):
            reference = ray.get(ref_ref)
            onnx = ray.get(onnx_ref) if onnx_ref is not None else None
            outputs, errors = {}, []
            for label, ref in zip(labels, card_refs):
                try:
                    outputs[label] = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    dead.add(label)
                    errors.append(error_check(label, f"{label} produced nothing: {first_line(exc)}"))
        with phases("judge"):
            checks, episodes = _judge(unit, outputs, reference, onnx)
            rows = [check_row(unit, c) for c in errors + checks]
            if isinstance(unit.work, BatchWork):
                _localize_failures(placement, labels, policies[unit.policy], unit, rows)
        with phases("write"):
            writer.stage_unit(unit.unit_id, rows, episodes)
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


def _judge(unit: Unit, outputs: dict, reference: object, onnx: dict | None) -> tuple[list[Check], list[EpisodeRow]]:
    if isinstance(unit.work, BatchWork):
        return judge_batch(unit.dtype, unit.work.batch.noise, outputs, reference, onnx), []
    checks, steps = judge_episodes(outputs, reference)
    return checks, episode_rows(unit, outputs, reference, steps)


def check_row(unit: Unit, check: Check) -> CheckRow:
    """Where the comparison was made (unit, output, devices) beside what it measured and judged."""
    return CheckRow(
        unit_id=unit.unit_id, policy=unit.policy, dtype=unit.dtype, workload=unit.workload, output=check.output,
        kind=check.kind, device_a=check.device_a, device_b=check.device_b, input_sha256=unit.work.input_sha256,
        **asdict(check.result),
    )


def episode_rows(unit: Unit, cards: dict, reference: list, steps: dict[str, list[int | None]]) -> list[EpisodeRow]:
    """One row per device and episode, the CPU reference first."""
    assert isinstance(unit.work, EpisodeWork)
    mode = "stochastic" if unit.work.stochastic else "deterministic"
    rows = []
    for label, episodes in {REFERENCE: reference, **cards}.items():
        for i, episode in enumerate(episodes):
            rows.append(EpisodeRow(
                unit_id=unit.unit_id, policy=unit.policy, dtype=unit.dtype, device=label, env_id=unit.work.env_id, mode=mode,
                episode_seed=episode.episode_seed, episode_return=episode.episode_return, length=episode.length,
                actions_sha256=episode.actions_sha256, first_divergent_step=None if label == REFERENCE else steps[label][i],
            ))
    return rows


def _localize_failures(placement: Placement, labels: list[str], policy: PolicyNet, unit: Unit, rows: list[CheckRow]) -> None:
    """For each card that failed a check on this batch, name the first layer where it parts from
    what it was compared with (card 0, or the CPU), on the same input; appended to `detail`."""
    assert isinstance(unit.work, BatchWork)
    obs = unit.work.batch.obs
    failing = {(r.kind, r.device_a) for r in rows if not r.passed and r.kind in ("cross_card", "cpu_reference")}
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
        for row in rows:
            if (row.kind, row.device_a) == (kind, label) and not row.passed:
                row.detail = f"{row.detail}; {note}" if row.detail else note
