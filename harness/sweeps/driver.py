"""The driver of `harness sweep`, in the order a sweep happens:

make the inputs -> join or start Ray -> place the actors -> name the units (each card's dtype
labels) -> fan out the same bytes to every actor -> gather and judge each unit -> stage its rows
-> write the run's Parquet -> print the summary.

Where the cluster loses or hangs a card and cannot recover (harness/sweeps/gather.py), the run ends
`incomplete` instead: the units staged so far stay, the runs row and the summary say what was
lost, and `--resume` runs the rest. So does a run whose Ray did not start or whose results could
not be written (`incomplete`, with the cause), and one interrupted by Ctrl-C (`interrupted`).
"""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from harness.dtypes import reduced_label
from harness.errors import InfrastructureError, UsageError
from harness.inference.capture import layer_modules
from harness.inference.forward import head_name
from harness.inference.runner import Described
from harness.judge.imports import import_ahead
from harness.judge.outcome import Gating, RunStatus, Verdict, finished_status, run_verdict
from harness.judge.verdicts import Rules, tolerance_of
from harness.policies import PolicyNet
from harness.report.summary import gating_of, print_summary
from harness.sweeps.dispatch import SharedRefs, check_row, judge, submit
from harness.sweeps.gather import RunIncomplete, Watch, actor_times, gather
from harness.sweeps.closed_loop import ClosedLoop
from harness.config.command_plan import SweepPlan
from harness.sweeps.localize import Searches
from harness.cluster.lifecycle import claim_run_id, finish_run_row, ray_cluster, said_at_the_end
from harness.cluster.phases import Phases
from harness.cluster import warm
from harness.cluster.place import Placement
from harness.sweeps.plan import BatchWork, EpisodeWork, Inputs, LocateWork, Unit, plan_inputs, plan_units
from harness.sweeps.resolve import Resolved, complete
from harness.cluster.provenance import new_run_row, now
from harness.store.paths import table_dir
from harness.store.schema import CheckRow, EpisodeRow, RunRow, RunSummary
from harness.store.writer import RunWriter


@dataclass
class SweepOutcome:
    run_id: str
    verdict: Verdict
    """As the command ends with it (harness/judge/outcome.py): its exit code is the command's."""
    status: RunStatus  # passed, failed, incomplete (a loss, Ray, the results disk: resumable), interrupted (resumable)
    checks_path: Path
    phases: Phases
    reference_s: dict[str, float]
    """Seconds the CPU reference (its pool summed) spent per dtype: the float64 golden, float32, each card's dtype."""
    resume_args: list[str] = field(default_factory=list)
    """Where the run stopped early and can be finished: the options that finish it (`--resume RUN_ID ...`)."""
    dashboard: str = ""
    """The cluster's dashboard (host:port) where it has one: where a job's resume is submitted."""
    reason: str = ""
    """Why a run stopped early, in one line, where no summary says it (Ray, the disk, an interrupt)."""

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASSED


def run_sweep(resolved: Resolved[SweepPlan], command: str = "", phases: Phases | None = None) -> SweepOutcome:
    """The sweep of a plan resolved before Ray starts (harness/sweeps/resolve.py); its run id is
    held by this process (harness/store/claim.py) from here to the end of the run. `phases` may
    already hold what came before it (the command's imports, the resolving)."""
    with ExitStack() as held:
        return _claimed(resolved, command, held, phases or Phases())


def _claimed(resolved: Resolved[SweepPlan], command: str, held: ExitStack, phases: Phases) -> SweepOutcome:
    plan, kind, policies = resolved.plan, resolved.kind, resolved.policies
    started = plan.started_at or now()
    results = plan.common.results
    with phases("plan"):
        faults = plan.common.faults
        inputs = {key: plan_inputs(plan, policy) for key, policy in policies.items()}
        writer = RunWriter(
            held.enter_context(claim_run_id(results, plan.resume or plan.common.run_id, bool(plan.resume), command))
        )
        run_row = new_run_row(
            started_at=started,
            status=RunStatus.RUNNING,
            accelerator=kind,
            n_cards=0,  # and no devices: both known once the actors are up
            devices=[],
            config_json=plan.common.recorded,
            policies=policies,
            command=command,
            faults=",".join(map(str, faults)),
        )
    try:
        return _sweep(resolved, inputs, writer, run_row, phases)
    except InfrastructureError as exc:
        return _stopped(plan, writer, run_row, phases, RunStatus.INCOMPLETE, str(exc))
    except KeyboardInterrupt:
        return _stopped(plan, writer, run_row, phases, RunStatus.INTERRUPTED, "")


def _sweep(
    resolved: Resolved[SweepPlan],
    inputs: dict[str, Inputs],
    writer: RunWriter,
    run_row: RunRow,
    phases: Phases,
) -> SweepOutcome:
    """From Ray's start to the summary; `run_row` is written once the actors are up."""
    plan, kind, specs, policies = resolved.plan, resolved.kind, resolved.specs, resolved.policies
    faults = plan.common.faults
    import_ahead()
    with ray_cluster(plan.common.address, kind, resolved.cards.asked, phases) as joined:
        n_cards = joined.n_cards
        complete(resolved, n_cards)
        with phases("actors"):
            marker_dir = writer.staging / "faults"
            placement = warm.place(
                kind,
                n_cards,
                plan.placement,
                specs,
                plan.common.threads,
                plan.common.precision,
                faults,
                marker_dir,
                policies,
                plan.reference_pool,
                writer.run_id,
            )
            devices = [placed.described.record() for placed in placement.actors]
        with phases("plan"):
            units = plan_units(
                plan, policies, inputs, dtype_labels(plan.common.dtypes, [c.described for c in placement.cards])
            )
            done = writer.done_units()
            todo = [u for u in units if u.unit_id not in done]
            closed = ClosedLoop(plan, policies)
            _add_staged(closed, writer, [u for u in units if u.unit_id in done])
        run_row.n_cards, run_row.devices = n_cards, json.dumps(devices)
        writer.begin(run_row)
        watch = Watch(placement, plan.hang_timeout, phases["actors"])
        n_units, n_resumed = len(units), len(units) - len(todo)
        summary = RunSummary(units=n_units, resumed_units=n_resumed)
        dropped = Lost()
        try:
            _fan_out_and_judge(plan, placement, watch, policies, todo, writer, phases, closed, dropped)
            while rounds := closed.next_round():
                # --episodes auto: a further round of each undecided mode; one a resumed run staged is not run again.
                _add_staged(closed, writer, [u for u in rounds if u.unit_id in done])
                more = [u for u in rounds if u.unit_id not in done]
                n_units, n_resumed = n_units + len(rounds), n_resumed + len(rounds) - len(more)
                summary.units, summary.resumed_units = n_units, n_resumed
                _fan_out_and_judge(plan, placement, watch, policies, more, writer, phases, closed, dropped)
            with phases("judge"):
                _stage_verdicts(closed, writer, done)
            summary.dead_cards, summary.resent_units = sorted(dropped.dead), dropped.resent
            summary.closed_loop = closed.describe()
            times = actor_times(placement, watch)
            reference_s = times.reference_s
            replacements = watch.replacements()
        except RunIncomplete as exc:
            lost = [str(loss) for loss in exc.losses]
            summary.done_units, summary.events, summary.lost = len(writer.done_units()), watch.events, lost
            writer.end(finish_run_row(run_row, RunStatus.INCOMPLETE, summary, phases))
            notes = [*watch.events, *(f"LOST {line}" for line in lost)]
            return _incomplete(plan, writer, phases, notes, n_units, joined.dashboard)

    with phases("write"):
        checks, episodes = writer.staged()
        gating = gating_of(checks)
        status = finished_status(gating)
        verdict = run_verdict(status, gating, ending=True)
        unplayed = without_episodes(plan, policies)
        renames = env_renames(policies)
        played = env_notes(plan, policies)
        summary.reference_s = {dtype: round(s, 3) for dtype, s in reference_s.items()}
        summary.reference_pool = len(placement.references)
        summary.busy_s = {actor: round(busy.wall_s, 3) for actor, busy in times.busy.items()}
        summary.busy_cpu_s = {actor: round(busy.cpu_s, 3) for actor, busy in times.busy.items()}
        summary.without_episodes, summary.env_renames, summary.env_notes = unplayed, renames, played
        summary.replaced, summary.events = watch.replaced(), watch.events
        run_row.devices = json.dumps([*devices, *replacements])
        writer.publish({"checks": checks, "episodes": episodes}, finish_run_row(run_row, status, summary, phases))
    notes = [*played, *watch.events, *([closed.describe()] if closed.auto else [])]
    print_summary(checks, writer.run_id, verdict, sys.stdout, unplayed, renames, notes)
    said_at_the_end(writer.run_id, plan.common.results, phases)
    return SweepOutcome(
        writer.run_id, verdict, status, table_dir(writer.results, "checks", writer.run_id), phases, reference_s
    )


def _incomplete(
    plan: SweepPlan, writer: RunWriter, phases: Phases, notes: list[str], units: int, dashboard: str
) -> SweepOutcome:
    """The run ended early: what it finished stays staged for `--resume`; the summary shows it,
    says what was lost, and the outcome carries the options that finish the run and the
    cluster's dashboard (where a job's resume is submitted)."""
    checks, _ = writer.staged()
    run_id, status = writer.run_id, RunStatus.INCOMPLETE
    verdict = run_verdict(status, gating_of(checks), ending=True)
    print_summary(checks, run_id, verdict, sys.stdout, notes=notes, units_done=(len(writer.done_units()), units))
    said_at_the_end(run_id, plan.common.results, phases)
    return SweepOutcome(run_id, verdict, status, writer.staging, phases, {}, resume_args(plan, run_id), dashboard)


def _stopped(
    plan: SweepPlan, writer: RunWriter, run_row: RunRow, phases: Phases, status: RunStatus, reason: str
) -> SweepOutcome:
    """The run stopped where no summary can be printed: Ray did not start, the results could not
    be written, or it was interrupted. Its row says so, and the outcome carries the options that
    finish it, where there is a run to finish; where even the row cannot be written, the reason
    says that too."""
    summary = RunSummary(done_units=len(writer.done_units()), stopped=reason or status)
    try:
        writer.end(finish_run_row(run_row, status, summary, phases))
    except InfrastructureError as exc:
        reason = f"{reason}; and its status could not be recorded: {exc}" if reason else str(exc)
    resumable = writer.staging.is_dir() and (table_dir(writer.results, "runs", writer.run_id) / "part-0.parquet").is_file()
    resume = resume_args(plan, writer.run_id) if resumable else []
    # A run stopped short ends by how it stopped, whatever its finished units found (harness/judge/outcome.py).
    verdict = run_verdict(status, Gating(), ending=True)
    return SweepOutcome(writer.run_id, verdict, status, writer.staging, phases, {}, resume, "", reason)


def resume_args(plan: SweepPlan, run_id: str) -> list[str]:
    """The options that finish run `run_id`: its stored configuration does the rest."""
    address = plan.common.address
    return ["--resume", run_id, "--results", str(plan.common.results), *(["--address", address] if address else [])]


def dtype_labels(dtypes: Sequence[str], cards: list[Described]) -> dict[str, str]:
    """Each asked dtype's label on these cards: float32 whose matmuls the cards reduce (TF32,
    HF32: recorded in their settings) is `float32-tf32` / `float32-hf32`, judged against a CPU
    that reduces them the same way. Cards that differ in that are refused: their float32 would
    not be one dtype."""
    from harness.devices import reduced_float32_matmul

    modes = {c.label: reduced_float32_matmul(c.device.settings) for c in cards}
    if len(set(modes.values())) > 1:
        raise UsageError(f"the cards run float32 matmuls in different modes ({modes}); use --precision strict")
    mode = next(iter(modes.values()), None)
    return {d: reduced_label(d, mode) for d in dtypes}


def env_notes(plan: SweepPlan, policies: dict[str, PolicyNet]) -> list[str]:
    """For each policy that plays another environment than --env, which one and why: --env gives
    an environment only to the policies that name none."""
    if plan.common.env is None or plan.episodes == 0:
        return []
    return [
        f"{key} plays {p.info.env_id} ({p.info.env_source}), not --env {plan.common.env}: --env gives an environment to the "
        "policies that name none; [envs] in a --config file sets one per policy"
        for key, p in policies.items()
        if p.info.env_id is not None and plan.common.env not in (p.info.env_id, p.info.env_renamed_from)
    ]


def without_episodes(plan: SweepPlan, policies: dict[str, PolicyNet]) -> dict[str, str]:
    """Policies that got no episodes for want of an environment, and the flag that gives them one."""
    if plan.episodes == 0:
        return {}
    return {key: "--env ENV_ID" for key, p in policies.items() if p.info.env_id is None}


def env_renames(policies: dict[str, PolicyNet]) -> dict[str, str]:
    """Each policy whose environment gymnasium renamed: the rename, as its env_source says it."""
    return {key: p.info.env_source for key, p in policies.items() if p.info.env_renamed_from}


def _add_staged(closed: ClosedLoop, writer: RunWriter, done: list[Unit]) -> None:
    """Episode units a resumed run staged before: their rows, as the closed loop had them."""
    for unit in done:
        if isinstance(unit.work, EpisodeWork):
            closed.add(unit, writer.staged_episodes(unit.unit_id))


def _stage_verdicts(closed: ClosedLoop, writer: Stager, done: set[str]) -> None:
    """The closed-loop verdicts, judged on every round of each mode; the cards' checks of a mode
    are staged together, as one unit."""
    units: dict[str, list[CheckRow]] = {}
    for verdict in closed.verdicts():
        row = check_row(
            verdict.check,
            unit_id=verdict.unit_id,
            policy=verdict.policy,
            dtype=verdict.dtype,
            workload=verdict.workload,
            input_sha256=verdict.input_sha256,
        )
        units.setdefault(verdict.unit_id, []).append(row)
    for unit_id, rows in units.items():
        if unit_id not in done:
            writer.stage_unit(unit_id, rows, [])


def unit_rules(plan: SweepPlan, unit: Unit, policy: PolicyNet) -> Rules:
    """What a unit of `policy` is judged by: its dtype's limits and tolerance, the policy's outputs."""
    tolerance, user_set = tolerance_of(unit.dtype, plan.tolerances)
    return Rules(
        unit.dtype,
        plan.limits,
        tolerance,
        user_set,
        policy.bounded_outputs(),
        scores=head_name(policy),
        masked=policy.info.masked,
        branches=policy.info.branches,
        layers=layer_modules(policy),
    )


class Stager(Protocol):
    """Where judged units go: the run's writer, or the rows a diagnosis step keeps in memory."""

    def stage_unit(self, unit_id: str, checks: list[CheckRow], episodes: list[EpisodeRow]) -> None: ...


@dataclass
class Kept:
    """A `Stager` that keeps every row in memory (a diagnosis step's units, never written)."""

    checks: list[CheckRow] = field(default_factory=list)

    def stage_unit(self, unit_id: str, checks: list[CheckRow], episodes: list[EpisodeRow]) -> None:
        self.checks += checks


def judge_units(
    plan: SweepPlan, placement: Placement, watch: Watch, policies: dict[str, PolicyNet], units: list[Unit], phases: Phases
) -> list[CheckRow]:
    """`units` run on actors already placed and judged as a sweep judges them, closed-loop
    verdicts included; the rows, kept in memory (harness/diagnose/search.py: a step of its search)."""
    kept, closed = Kept(), ClosedLoop(plan, policies)
    _fan_out_and_judge(plan, placement, watch, policies, units, kept, phases, closed, Lost())
    while rounds := closed.next_round():
        _fan_out_and_judge(plan, placement, watch, policies, rounds, kept, phases, closed, Lost())
    _stage_verdicts(closed, kept, set())
    return kept.checks


@dataclass
class Lost:
    """What fanning out lost, over every round: the cards that produced nothing, the units sent again."""

    dead: set[str] = field(default_factory=set)
    resent: int = 0


def _fan_out_and_judge(
    plan: SweepPlan,
    placement: Placement,
    watch: Watch,
    policies: dict[str, PolicyNet],
    units: list[Unit],
    writer: Stager,
    phases: Phases,
    closed: ClosedLoop,
    lost: Lost,
) -> None:
    """Send every unit to every actor at once, then judge units in order as results arrive; a
    unit's ObjectRefs are let go once it is gathered. A unit whose results came from two nodes
    (an actor Ray restarted elsewhere meanwhile) is sent again, behind the rest. A batch unit
    that failed is followed by the layer searches its rows name (harness/sweeps/localize.py),
    sent behind the rest too, and staged once they are judged. What the runs summary says of it
    goes into `lost`; each episode unit's rows into `closed`."""
    shared = SharedRefs()
    with phases("fanout"):
        pending = deque(watch.track(submit(placement, unit, shared)) for unit in units)
    searches = Searches(policies, watch.lane_of)
    bar = tqdm(total=len(units), desc="sweep", unit="unit", disable=not plan.common.progress, file=sys.stderr)
    try:
        while pending:
            job = pending.popleft()
            unit = job.unit
            with phases("compute"):
                gathered = gather(job, watch)
            shared.release(job.shared)
            if gathered is None:
                pending.append(watch.track(submit(placement, unit, None)))
                lost.resent += 1
                continue
            got, errors = gathered
            if isinstance(unit.work, LocateWork):
                errors = []  # a search whose actor produced nothing says so in its note; no card is lost for it
            lost.dead.update(error.device_a for error in errors)
            with phases("judge"):
                judged = judge(unit, unit_rules(plan, unit, policies[unit.policy]), plan.require_batch_invariance, got)
                rows = [
                    check_row(
                        c,
                        unit_id=unit.unit_id,
                        policy=unit.policy,
                        dtype=unit.dtype,
                        workload=unit.workload,
                        input_sha256=unit.work.input_sha256,
                    )
                    for c in errors + judged.checks
                ]
            if judged.located is not None:  # a layer search: what it found goes to the rows of the batches that asked
                searches.judged(unit, judged.located)
            elif isinstance(unit.work, BatchWork):
                with phases("fanout"):
                    asked = searches.follow(unit, unit.work.batch, rows)
                    pending += [watch.track(submit(placement, search, None)) for search in asked]
            staged = searches.ready() if isinstance(unit.work, BatchWork | LocateWork) else [(unit, rows)]
            for done, checks in staged:
                episodes = judged.episodes if done is unit else []
                with phases("write"):
                    writer.stage_unit(done.unit_id, checks, episodes)
                if isinstance(done.work, EpisodeWork):
                    closed.add(done, episodes)
                bar.update(1)
    finally:
        bar.close()
