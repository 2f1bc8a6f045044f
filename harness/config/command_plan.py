"""The typed plan of `harness sweep` and `harness bench`, built once at the edge (the command, the
Ray job, a diagnosis or repro step) from a validated config: every spec parsed into the value the
run uses (faults, tolerances, ratio limits, the return margin, the layers kept in float32), every
list a tuple, every kind its literal. The sweep, the bench, the memory budget, the closed loop and
diagnose read the plan and parse nothing; the config stays what the user wrote: what the runs
table records (`CommonPlan.recorded`, byte for byte), what `--resume` reads back, what `--help` shows.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from harness.devices.precision import Precision
from harness.errors import UsageError, first_line
from harness.inference.fault_specs import MODEL_KINDS, Fault, parse_faults, refuse_absent_cards, refuse_absent_dtypes
from harness.judge.compare import TOLERANCES, Tolerance
from harness.judge.golden import RatioLimits
from harness.judge.returns import Margin
from harness.config.fields import meta_of
from harness.config.options import (
    BenchConfig,
    CommonOptions,
    EpisodeBatching,
    Strategy,
    SweepConfig,
    csv,
    validate,
)

if TYPE_CHECKING:
    from harness.policies.base import ActionKind


@dataclass(frozen=True)
class CommonPlan:
    """What a sweep and a bench both run with."""

    policies: tuple[str, ...]
    accelerator: str
    cards: int | None
    dtypes: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    seed: int
    threads: int
    results: Path
    run_id: str | None
    address: str | None
    progress: bool
    max_memory_gib: float | None
    precision: Precision
    env: str | None
    envs: Mapping[str, str]
    action_kind: ActionKind | None
    onnx_output: str | None
    faults: tuple[Fault, ...]
    recorded: str
    """The config as the user wrote it (JSON): the runs table's config_json, what --resume reads back."""


@dataclass(frozen=True)
class SweepPlan:
    """`harness sweep`, planned."""

    common: CommonPlan
    episodes: int | Literal["auto"]
    margin: Margin
    require_conclusive: bool
    auto_max_episodes: int
    auto_max_seconds: float
    episode_batching: EpisodeBatching
    tolerances: Mapping[str, Tolerance]
    """The user's tolerance table by dtype (--tolerance DTYPE=ATOL,RTOL)."""
    limits: RatioLimits
    require_batch_invariance: bool
    published_gates: bool
    """A published score falling short fails the run (--published-return gate)."""
    hang_timeout: float
    placement: Strategy
    reference_pool: int | None
    """--reference-pool: the CPU reference's actors; None: as many as the cluster's spare CPUs."""
    kept: Mapping[tuple[str, str], tuple[str, ...]]
    """--keep-float32: (policy, dtype) -> the layers computed in float32."""
    resume: str | None
    started_at: str | None
    """A resumed run's start, as its runs row has it; None for a new run (it starts now)."""


@dataclass(frozen=True)
class BenchPlan:
    """`harness bench`, planned."""

    common: CommonPlan
    card_counts: tuple[int, ...] | None
    windows: int
    window: float
    min_iterations: int
    max_spread: float
    duration: float | None
    latency_bound_ms: float
    min_queries: int
    env_impl: str


def common_plan(config: CommonOptions, faults: list[Fault]) -> CommonPlan:
    return CommonPlan(
        policies=tuple(config.policies),
        accelerator=config.accelerator,
        cards=config.cards,
        dtypes=tuple(config.dtypes),
        batch_sizes=tuple(config.batch_sizes),
        seed=config.seed,
        threads=config.threads,
        results=Path(config.results),
        run_id=config.run_id,
        address=config.address,
        progress=config.progress,
        max_memory_gib=config.max_memory_gib,
        precision=config.precision,
        env=config.env,
        envs=dict(config.envs),
        action_kind=config.action_kind,
        onnx_output=config.onnx_output,
        faults=tuple(faults),
        recorded=config.to_json(),
    )


def sweep_plan(config: SweepConfig, given: Collection[str] = ()) -> SweepPlan:
    """The plan of a validated sweep config; with --resume, of the interrupted run's own config
    (so its units are planned again, identically), where to find the results and the cluster
    coming from this invocation. `given`: the options this invocation set (flags, its config
    file), each refused with --resume where it differs from the run's, but those in
    RESUME_APPLIES. UsageError for a spec that does not parse or does not fit."""
    if config.resume is None:
        return _sweep_plan(config, None)
    resumed, started_at = resume_config(config, config.resume, given)
    try:
        return _sweep_plan(validate(resumed), started_at)
    except UsageError as exc:
        raise UsageError(f"--resume {config.resume}: its stored configuration no longer validates: {exc}") from None


def _sweep_plan(config: SweepConfig, started_at: str | None) -> SweepPlan:
    faults = parse_faults(config.inject_fault)
    kept = _kept(config)
    refuse_absent_cards(faults, config.cards, f"--cards {config.cards}")
    # A precision plan computes its kept layers in float32, whatever the dtype it plans.
    refuse_absent_dtypes(faults, [*config.dtypes, *(["float32"] if kept else [])])
    return SweepPlan(
        common=common_plan(config, faults),
        episodes=config.episodes,
        margin=Margin.parse(config.return_margin),
        require_conclusive=config.require_conclusive,
        auto_max_episodes=config.auto_max_episodes,
        auto_max_seconds=config.auto_max_seconds,
        episode_batching=config.episode_batching,
        tolerances=parse_tolerances(config.tolerance),
        limits=ratio_limits(config.ratio_limits),
        require_batch_invariance=config.require_batch_invariance,
        published_gates=config.published_return == "gate",
        hang_timeout=config.hang_timeout,
        placement=config.placement,
        reference_pool=config.reference_pool,
        kept=kept,
        resume=config.resume,
        started_at=started_at,
    )


def _kept(config: SweepConfig) -> dict[tuple[str, str], tuple[str, ...]]:
    """--keep-float32's plan, each (policy, dtype) of it one this sweep runs."""
    if config.keep_float32 is None:
        return {}
    from harness.config.precision_plan import read_plan

    try:
        kept = read_plan(Path(config.keep_float32)).kept()
    except ValueError as exc:
        raise UsageError(f"--keep-float32 {config.keep_float32}: {exc}; a plan that applies nothing never passes") from None
    for policy, dtype in kept:
        if policy not in config.policies or dtype not in config.dtypes:
            raise UsageError(
                f"--keep-float32 {config.keep_float32}: its plan for {policy} {dtype} does not apply to this sweep "
                f"(--policy {' '.join(config.policies)}, --dtypes {','.join(config.dtypes)}); a plan never applied "
                "never passes"
            )
    return kept


def bench_plan(config: BenchConfig) -> BenchPlan:
    """The plan of a validated bench config. UsageError for a fault that does not parse or fit."""
    faults = parse_faults(config.inject_fault)
    refuse_absent_cards(faults, config.cards, f"--cards {config.cards}")
    refuse_absent_dtypes(faults, config.dtypes)
    for fault in faults:
        if fault.kind not in MODEL_KINDS:
            raise UsageError(
                f"--inject-fault {fault}: a bench injects only into its timed path: {', '.join(MODEL_KINDS)}, "
                "e.g. card0:perturb-weight"
            )
    return BenchPlan(
        common=common_plan(config, faults),
        card_counts=tuple(config.card_counts) if config.card_counts is not None else None,
        windows=config.windows,
        window=config.window,
        min_iterations=config.min_iterations,
        max_spread=config.max_spread,
        duration=config.duration,
        latency_bound_ms=config.latency_bound_ms,
        min_queries=config.min_queries,
        env_impl=config.env_impl,
    )


def parse_tolerances(specs: list[str]) -> dict[str, Tolerance]:
    """`--tolerance DTYPE=ATOL,RTOL`, repeatable: the user's tolerance table by dtype."""
    from harness.dtypes import REDUCED_FLOAT32

    tables = {}
    for spec in specs:
        dtype, _, numbers = spec.partition("=")
        parts = numbers.split(",")
        try:
            if len(parts) != 2 or dtype not in (*TOLERANCES, *REDUCED_FLOAT32):
                raise ValueError
            atol, rtol = (float(p) for p in parts)
            tables[dtype] = Tolerance(atol, rtol, TOLERANCES[dtype.split("-")[0]].min_cos)
        except (ValueError, TypeError):
            known = ", ".join((*TOLERANCES, *REDUCED_FLOAT32))
            raise UsageError(
                f"--tolerance {spec!r}: expected DTYPE=ATOL,RTOL with DTYPE one of {known}, e.g. float16=0.05,0.002"
            ) from None
    return tables


def ratio_limits(limits: list[float]) -> RatioLimits:
    """`--ratio-limits L,M,S`: the port rule's limits for >= 1000, >= 100 and fewer elements."""
    try:
        return RatioLimits(*limits)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"--ratio-limits {csv(limits)!r}: three limits, for >= 1000, >= 100 and fewer elements, e.g. 3,5,10 ({exc})"
        ) from None


# What a resumed run takes from the invocation that resumes it: where its results, its cluster
# and its JUnit file are, always; and where given, what changes no unit's outcome (how long an
# actor may take, the memory guard, how many actors share the CPU reference's work).
RESUME_FROM_HERE = ("results", "address", "progress", "junit_xml")
RESUME_APPLIES = (*RESUME_FROM_HERE, "hang_timeout", "max_memory_gib", "reference_pool")
# The invocation's own: --resume RUN names the run, whatever --run-id says.
RESUME_OWN = ("resume", "run_id")


def resume_config(config: SweepConfig, run_id: str, given: Collection[str] = ()) -> tuple[SweepConfig, str]:
    """The interrupted run `run_id`'s own configuration, not yet validated, and its start time.
    RESUME_APPLIES come from this invocation (where it set them); any other option it set must be the
    run's own: a UsageError names it and both values, where the run would go on with its own
    while `runs.command` recorded the other."""
    from harness.store.claim import refuse_held
    from harness.store.paths import STAGING
    from harness.store.writer import read_run

    results = Path(config.results)
    try:
        [stored] = read_run(results, run_id)
    except (FileNotFoundError, ValueError):
        refuse_held(results, run_id)  # claimed and starting: its row comes once its actors are up
        raise UsageError(f"--resume {run_id}: no such run in {results}") from None
    if not (results / STAGING / run_id).is_dir():
        raise UsageError(f"--resume {run_id}: that run finished ({stored['status']}); nothing to resume")
    try:
        resumed = SweepConfig(**json.loads(stored["config_json"]))
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"--resume {run_id}: its stored configuration is not one this harness reads ({first_line(exc)})"
        ) from None
    for f in dataclasses.fields(config):
        ours, theirs = getattr(config, f.name), getattr(resumed, f.name)
        if f.name in given and f.name not in (*RESUME_APPLIES, *RESUME_OWN) and ours != theirs:
            flag = meta_of(f).flag
            raise UsageError(
                f"--resume {run_id}: {flag} {_shown(ours)}, but the run was made with {flag} {_shown(theirs)}; "
                f"a resumed run goes on with its own options: leave {flag} out, or start a new run"
            )
    for name in RESUME_APPLIES:
        if name in RESUME_FROM_HERE or name in given:
            setattr(resumed, name, getattr(config, name))
    resumed.resume, resumed.run_id = run_id, run_id
    return resumed, stored["started_at"]


def _shown(value: object) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(none)"
    return "(unset)" if value is None else str(value)
