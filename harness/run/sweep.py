"""The driver of `harness sweep`, in the order a sweep happens:

make the inputs -> join or start Ray -> place the actors -> name the units (each card's dtype
labels) -> fan out the same bytes to every actor -> gather and judge each unit -> stage its rows
-> write the run's Parquet -> print the summary.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import ray

from harness.devices import resolve_accelerator
from harness.dtypes import base_dtype, reduced_label
from harness.errors import UsageError, first_line
from harness.inference.capture import layer_modules
from harness.inference.faults import parse_faults
from harness.judge.localize import first_divergent_layer, first_layer_off_golden
from harness.judge.verdicts import (
    REFERENCE,
    Check,
    Rules,
    error_check,
    judge_batch,
    judge_batch_invariance,
    judge_episodes,
    judge_onnx,
    tolerance_of,
)
from harness.policies import GOLDEN, PolicyNet
from harness.report.summary import print_summary
from harness.run.lifecycle import Phases, claim_run_id, finish_run_row, ray_cluster
from harness.run.options import SweepConfig, parse_tolerances, ratio_limits
from harness.run.place import Placement, describe_actors, place_sweep
from harness.run.plan import BatchWork, EpisodeWork, InvarianceWork, LoaderWork, Unit, load_policies, plan_inputs, plan_units
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
    reference_s: dict[str, float]
    """Seconds the CPU reference spent per dtype: the float64 golden, float32, each card's dtype."""


def run_sweep(config: SweepConfig, command: str = "") -> SweepOutcome:
    phases = Phases()
    started = now()
    if config.resume:
        config, started = resume_config(config)
    results = Path(config.results)
    with phases("plan"):
        faults = parse_faults(config.inject_fault)
        kind = resolve_accelerator(config.accelerator)
        specs, policies = load_policies(config)
        inputs = {key: plan_inputs(config, policy) for key, policy in policies.items()}
        run_id = config.resume or claim_run_id(results, config.run_id)
        writer = RunWriter(results, run_id)

    with ray_cluster(config.address, kind, config.cards, phases) as n_cards:
        with phases("startup"):
            placement = place_sweep(
                kind, n_cards, config.placement, specs, config.threads, config.precision, faults, writer.staging / "faults"
            )
            cards, reference = describe_actors(placement, policies)
        with phases("plan"):
            units = plan_units(config, policies, inputs, dtype_labels(config.dtypes, cards))
            done = writer.done_units()
            todo = [u for u in units if u.unit_id not in done]
        run_row = new_run_row(
            started_at=started,
            status="running",
            accelerator=kind,
            n_cards=n_cards,
            devices=[*cards, reference],
            config_json=config.to_json(),
            policies=policies,
            command=command,
            faults=",".join(map(str, faults)),
        )
        writer.begin(run_row)
        labels = [str(c["label"]) for c in cards]
        dead = _fan_out_and_judge(config, placement, labels, policies, todo, writer, phases)
        reference_s = ray.get(placement.reference.compute_seconds.remote())

    with phases("write"):
        checks, _ = writer.finish()
        gating = checks.filter(checks.column("gating"))
        passed = bool(gating.num_rows) and all(gating.column("passed").to_pylist())
        status = "passed" if passed else "failed"
        unplayed = without_episodes(config, policies)
        summary = {
            "units": len(units),
            "resumed_units": len(units) - len(todo),
            "dead_cards": dead,
            "reference_s": {dtype: round(s, 3) for dtype, s in reference_s.items()},
            "without_episodes": unplayed,
        }
        writer.write_run(finish_run_row(run_row, status, summary, phases))
    print_summary(checks, run_id, status, sys.stdout, unplayed)
    return SweepOutcome(run_id, passed, status, table_dir(results, "checks", run_id), phases, reference_s)


def dtype_labels(dtypes: list[str], cards: list[dict[str, object]]) -> dict[str, str]:
    """Each asked dtype's label on these cards: float32 whose matmuls the cards reduce (TF32,
    HF32: recorded in their settings) is `float32-tf32` / `float32-hf32`, judged against a CPU
    that reduces them the same way. Cards that differ in that are refused: their float32 would
    not be one dtype."""
    from harness.devices import reduced_float32_matmul

    modes = {str(c["label"]): reduced_float32_matmul(c.get("settings") or {}) for c in cards}
    if len(set(modes.values())) > 1:
        raise UsageError(f"the cards run float32 matmuls in different modes ({modes}); use --precision strict")
    mode = next(iter(modes.values()), None)
    return {d: reduced_label(d, mode) for d in dtypes}


def without_episodes(config: SweepConfig, policies: dict[str, PolicyNet]) -> dict[str, str]:
    """Policies that got no episodes for want of an environment, and the flag that gives them one."""
    if config.episodes == 0:
        return {}
    return {key: "--env ENV_ID" for key, p in policies.items() if p.info.env_id is None}


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


@dataclass
class _Submitted:
    unit: Unit
    cards: list[ray.ObjectRef]
    references: dict[str, ray.ObjectRef]  # what the unit is judged against, by role
    inside: list[ray.ObjectRef]  # batch invariance: each card's outputs of the whole batch


def _fan_out_and_judge(
    config: SweepConfig,
    placement: Placement,
    labels: list[str],
    policies: dict[str, PolicyNet],
    units: list[Unit],
    writer: RunWriter,
    phases: Phases,
) -> list[str]:
    """Send every unit to every actor at once, then judge units in order as results arrive."""
    from tqdm import tqdm

    limits, user_tolerances = ratio_limits(config), parse_tolerances(config.tolerance)
    with phases("fanout"):
        cache: dict[tuple[str, str, str], ray.ObjectRef] = {}
        batches: dict[tuple[str, str, str], list[ray.ObjectRef]] = {}
        pending = [
            _Submitted(
                u,
                _submit_cards(placement, u, batches),
                _submit_references(placement, u, cache),
                _inside(placement, u, batches),
            )
            for u in units
        ]
    dead: set[str] = set()
    layers: dict[tuple[str, str, str, str], str] = {}  # (policy, dtype, kind, card) -> where it broke, once
    bar = tqdm(total=len(units), desc="sweep", unit="unit", disable=not config.progress, file=sys.stderr)
    for job in pending:
        unit = job.unit
        with phases("compute"):
            references = {role: ray.get(ref) for role, ref in job.references.items()}
            outputs, errors = {}, []
            for position, (label, ref) in enumerate(zip(labels, job.cards, strict=True)):
                try:
                    outputs[label] = ray.get(ref) if not job.inside else (ray.get(ref), ray.get(job.inside[position]))
                except ray.exceptions.RayError as exc:
                    dead.add(label)
                    errors.append(error_check(label, f"{label} produced nothing: {first_line(exc)}"))
        with phases("judge"):
            tolerance, user_set = tolerance_of(unit.dtype, user_tolerances)
            rules = Rules(unit.dtype, limits, tolerance, user_set, policies[unit.policy].bounded_outputs())
            checks, episodes = _judge(config, rules, unit, outputs, references)
            rows = [check_row(unit, c) for c in errors + checks]
            if isinstance(unit.work, BatchWork):
                _localize_failures(placement, labels, policies[unit.policy], unit, rows, rules, layers)
        with phases("write"):
            writer.stage_unit(unit.unit_id, rows, episodes)
        bar.update(1)
    bar.close()
    return sorted(dead)


def _submit_cards(
    placement: Placement, unit: Unit, batches: dict[tuple[str, str, str], list[ray.ObjectRef]]
) -> list[ray.ObjectRef]:
    work, dtype = unit.work, base_dtype(unit.dtype)
    if isinstance(work, BatchWork):
        refs = [c.run_batch.remote(unit.policy, dtype, work.batch.obs, work.batch.noise) for c in placement.cards]
        batches[unit.policy, unit.dtype, work.batch.name] = refs
        return refs
    if isinstance(work, InvarianceWork):
        obs, noise = tuple(o[: work.rows] for o in work.batch.obs), work.batch.noise[: work.rows]
        return [c.run_batch.remote(unit.policy, dtype, obs, noise) for c in placement.cards]
    if isinstance(work, EpisodeWork):
        return [
            c.run_episodes.remote(unit.policy, dtype, work.env_id, list(work.seeds), work.stochastic, work.batching)
            for c in placement.cards
        ]
    return []  # LoaderWork: the loader is checked on the CPU alone


def _inside(placement: Placement, unit: Unit, batches: dict[tuple[str, str, str], list[ray.ObjectRef]]) -> list[ray.ObjectRef]:
    """For a batch-invariance unit, each card's outputs of the whole batch: the same call its
    batch unit made (planned before it), or, where a resumed run did that unit before, made again."""
    work = unit.work
    if not isinstance(work, InvarianceWork):
        return []
    key = (unit.policy, unit.dtype, work.batch.name)
    if key not in batches:
        obs, noise = work.batch.obs, work.batch.noise
        batches[key] = [c.run_batch.remote(unit.policy, base_dtype(unit.dtype), obs, noise) for c in placement.cards]
    return batches[key]


def _submit_references(
    placement: Placement, unit: Unit, cache: dict[tuple[str, str, str], ray.ObjectRef]
) -> dict[str, ray.ObjectRef]:
    """What the CPU computes for a unit, each once per (policy, workload, dtype) whatever the
    units that need it: the float64 golden, float32 and the card's dtype for a batch; onnxruntime
    for the loader; float32 episodes."""
    ref, work = placement.reference, unit.work

    def once(dtype: str, submit) -> ray.ObjectRef:
        # Keyed by the input's bytes: a batch unit and the loader unit of the same batch share them.
        key = (unit.policy, work.input_sha256, dtype)
        if key not in cache:
            cache[key] = submit()
        return cache[key]

    if isinstance(work, (BatchWork, LoaderWork)):
        obs, noise = work.batch.obs, work.batch.noise
        batch = {
            "golden": once(GOLDEN, lambda: ref.run_batch.remote(unit.policy, GOLDEN, obs, noise)),
            "float32": once("float32", lambda: ref.run_batch.remote(unit.policy, "float32", obs, noise)),
        }
        if isinstance(work, LoaderWork):
            return batch | {"onnx": once("onnx", lambda: ref.run_onnx.remote(unit.policy, obs))}
        return batch | {"same": once(unit.dtype, lambda: ref.run_batch.remote(unit.policy, unit.dtype, obs, noise))}
    if isinstance(work, EpisodeWork):

        def episodes() -> ray.ObjectRef:
            return ref.run_episodes.remote(
                unit.policy, "float32", work.env_id, list(work.seeds), work.stochastic, work.batching
            )

        return {"float32": once("float32", episodes)}
    return {}  # InvarianceWork: a card against itself


def _judge(config: SweepConfig, rules: Rules, unit: Unit, outputs: dict, refs: dict) -> tuple[list[Check], list[EpisodeRow]]:
    work = unit.work
    if isinstance(work, BatchWork):
        return judge_batch(rules, work.batch.noise, outputs, refs["golden"], refs["same"], refs["float32"]), []
    if isinstance(work, InvarianceWork):
        rows = {
            label: (alone, {name: value[: work.rows] for name, value in inside.items()})
            for label, (alone, inside) in outputs.items()
        }
        return judge_batch_invariance(rows, config.require_batch_invariance), []
    if isinstance(work, LoaderWork):
        return judge_onnx(rules, refs["onnx"], refs["float32"], refs["golden"]), []
    checks, steps = judge_episodes(outputs, refs["float32"])
    return checks, episode_rows(unit, outputs, refs["float32"], steps)


def check_row(unit: Unit, check: Check) -> CheckRow:
    """Where the comparison was made (unit, output, devices) beside what it measured and judged,
    the measured fields taken by name from the judge's record."""
    return CheckRow(
        unit_id=unit.unit_id,
        policy=unit.policy,
        dtype=unit.dtype,
        workload=unit.workload,
        output=check.output,
        kind=check.kind,
        device_a=check.device_a,
        device_b=check.device_b,
        input_sha256=unit.work.input_sha256,
        gating=check.gating,
        **asdict(check.result),
    )


def episode_rows(unit: Unit, cards: dict, reference: list, steps: dict[str, list[int | None]]) -> list[EpisodeRow]:
    """One row per device and episode, the CPU reference first."""
    work = unit.work
    assert isinstance(work, EpisodeWork)
    rows = []
    for label, episodes in {REFERENCE: reference, **cards}.items():
        for i, episode in enumerate(episodes):
            rows.append(
                EpisodeRow(
                    unit_id=unit.unit_id,
                    policy=unit.policy,
                    dtype=unit.dtype,
                    device=label,
                    env_id=work.env_id,
                    mode=work.mode,
                    batching=work.batching,
                    batch_size=work.batch_size,
                    episode_seed=episode.episode_seed,
                    episode_return=episode.episode_return,
                    length=episode.length,
                    actions_sha256=episode.actions_sha256,
                    first_divergent_step=None if label == REFERENCE else steps[label][i],
                )
            )
    return rows


def _localize_failures(
    placement: Placement,
    labels: list[str],
    policy: PolicyNet,
    unit: Unit,
    rows: list[CheckRow],
    rules: Rules,
    found: dict[tuple[str, str, str, str], str],
) -> None:
    """For each card that failed the port on this batch, name the first layer where it parts:
    from card 0 bit for bit, or from the golden by the port rule, on the same input; appended
    to the failing rows' `detail`. Searched on the first batch that fails for a card and dtype
    (a search reruns the forward on both sides); later batches name that batch's answer."""
    work = unit.work
    assert isinstance(work, BatchWork)
    obs, dtype = work.batch.obs, base_dtype(unit.dtype)
    modules = layer_modules(policy)
    failing = sorted({(r.kind, r.device_a) for r in rows if not r.passed and r.kind in ("cross_card", "cpu_reference")})
    for kind, label in failing:
        key = (unit.policy, unit.dtype, kind, label)
        if key in found:
            _append_detail(rows, kind, label, found[key])
            continue
        card = placement.cards[labels.index(label)].capture.remote(unit.policy, dtype, obs)
        if kind == "cross_card":
            others = [placement.cards[0].capture.remote(unit.policy, dtype, obs)]
        else:
            others = [placement.reference.capture.remote(unit.policy, d, obs) for d in (unit.dtype, GOLDEN)]
        try:
            mine, *theirs = ray.get([card, *others])
        except ray.exceptions.RayError as exc:
            note = f"layer search failed: {first_line(exc)}"
        else:
            if kind == "cross_card":
                divergence = first_divergent_layer(mine, theirs[0], modules=modules)
            else:
                divergence = first_layer_off_golden(mine, theirs[0], theirs[1], unit.dtype, rules.limits, modules=modules)
            note = divergence.describe() if divergence else "no layer differs on a second run: the mismatch did not repeat"
        found[key] = f"as found on {unit.workload}: {note}"
        _append_detail(rows, kind, label, note)


def _append_detail(rows: list[CheckRow], kind: str, label: str, note: str) -> None:
    for row in rows:
        if (row.kind, row.device_a) == (kind, label) and not row.passed:
            row.detail = f"{row.detail}; {note}" if row.detail else note
