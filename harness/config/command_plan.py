"""The typed plan of `harness sweep` and `harness bench`, made once at the edge (the command, the
Ray job, a diagnosis or repro step): a validated config is its plan (its fields hold the typed
values the run uses: faults, tolerances, ratio limits, the return margin, the layers kept in
float32); what does not fit the run (a fault on a card or dtype it has not) is refused where the
plan is resolved (harness/sweeps/resolve.py). The sweep, the bench, the memory budget, the closed loop and
diagnose read the plan and parse nothing; what the runs table records is the config's own JSON
(`CommonPlan.recorded`), what `--resume` reads back.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from harness.config.fields import Given, config_from, fields
from harness.config.options import BenchConfig, CommonOptions, SweepConfig, validate
from harness.errors import UsageError
from harness.inference.fault_specs import Strikes, kinds

# The plans are the validated configs; these are the names the run knows them by.
CommonPlan = CommonOptions
SweepPlan = SweepConfig
BenchPlan = BenchConfig


def sweep_plan(config: SweepConfig, given: Collection[str] = ()) -> SweepPlan:
    """The plan of a validated sweep config; with --resume, of the interrupted run's own config
    (so its units are planned again, identically), where to find the results and the cluster
    coming from this invocation. `given`: the options this invocation set (flags, its config
    file), each refused with --resume where it differs from the run's, but those in
    RESUME_APPLIES. UsageError for a spec that does not parse (what does not fit the run is
    refused where the plan is resolved: harness/sweeps/resolve.py)."""
    if config.resume is None:
        return config
    resumed = resume_config(config, config.resume, given)
    try:
        return validate(resumed)
    except UsageError as exc:
        raise UsageError(f"--resume {config.resume}: its stored configuration no longer validates: {exc}") from None


def bench_plan(config: BenchConfig) -> BenchPlan:
    """The plan of a validated bench config. UsageError for a fault a bench cannot inject (what
    does not fit the run is refused where the plan is resolved: harness/sweeps/resolve.py)."""
    for fault in config.faults:
        if fault.record.strikes is not Strikes.POLICY:
            raise UsageError(
                f"--inject-fault {fault}: a bench injects only into its timed path: "
                f"{', '.join(k.name for k in kinds(Strikes.POLICY))}, "
                "e.g. card0:perturb-weight"
            )
    return config


# What a resumed run takes from the invocation that resumes it: where its results, its cluster
# and its JUnit file are, always; and where given, what changes no unit's outcome (how long an
# actor may take, the memory guard, how many actors share the CPU reference's work).
RESUME_FROM_HERE = ("results", "address", "progress", "junit_xml")
RESUME_APPLIES = (*RESUME_FROM_HERE, "hang_timeout", "max_memory_gib", "reference_pool")
# The invocation's own: --resume RUN names the run, whatever --run-id says.
RESUME_OWN = ("resume", "run_id")


def resume_config(config: SweepConfig, run_id: str, given: Collection[str] = ()) -> SweepConfig:
    """The interrupted run `run_id`'s own configuration, its start time with it, not yet
    validated as a whole. RESUME_APPLIES come from this invocation (where it set them); any other
    option it set must be the run's own: a UsageError names it and both values, where the run
    would go on with its own while `runs.command` recorded the other."""
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
        values = json.loads(stored["config_json"])
        if not isinstance(values, dict):
            raise ValueError("not a JSON object")
        unknown = sorted(set(values) - set(SweepConfig.model_fields))
        if unknown:
            raise ValueError(f"unknown keys {', '.join(unknown)}")
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--resume {run_id}: its stored configuration is not one this harness reads ({exc})") from None
    try:
        resumed = config_from(SweepConfig, Given(values))
    except UsageError as exc:
        raise UsageError(f"--resume {run_id}: its stored configuration no longer validates: {exc}") from None
    ours, theirs = config.model_dump(mode="json"), resumed.model_dump(mode="json")  # each spec as its text
    for name, (_, meta) in fields(SweepConfig).items():
        if name in given and name not in (*RESUME_APPLIES, *RESUME_OWN) and ours[name] != theirs[name]:
            raise UsageError(
                f"--resume {run_id}: {meta.flag} {_shown(ours[name])}, but the run was made with {meta.flag} "
                f"{_shown(theirs[name])}; a resumed run goes on with its own options: leave {meta.flag} out, or start a "
                "new run"
            )
    here = {name: getattr(config, name) for name in RESUME_APPLIES if name in RESUME_FROM_HERE or name in given}
    resumed = resumed.model_copy(update={**here, "resume": run_id, "run_id": run_id})
    resumed._started_at = stored["started_at"]
    return resumed


def _shown(value: object) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(none)"
    return "(unset)" if value is None else str(value)
