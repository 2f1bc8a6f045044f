"""`harness diagnose RUN_ID`: for each (policy, dtype) whose port or closed-loop verdict failed,
the smallest set of layers to compute in float32 for which the dtype passes every check of the
run, as Polygraphy's `debug precision` searches it: bisect over the layers in forward order (the
shortest leading run of layers that passes, in log N steps), then refine linearly (drop each
layer of that run that is not needed). Each step runs the affected units again on the run's own
cards (the failing one among them, with the run's faults) and judges them as the sweep does;
the actors are placed once for the whole search. The plan is a file `harness sweep
--keep-float32 PLAN` verifies with one more sweep (harness/config/precision_plan.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from harness.devices import resolve_accelerator
from harness.dtypes import kept_label
from harness.errors import RunUnfinished, UsageError
from harness.judge.kinds import CheckKind
from harness.judge.outcome import Gating, fails_the_run, unfinished
from harness.policies import PolicyNet, PolicySpec
from harness.policies.keep_float32 import precision_layers
from harness.sweeps.gather import Watch
from harness.cluster.lifecycle import ray_cluster
from harness.config.command_plan import SweepPlan, sweep_plan
from harness.config.options import SweepConfig, validate
from harness.cluster.phases import Phases
from harness.cluster.place import Placement, place_sweep
from harness.sweeps.plan import Inputs, load_policies, plan_inputs, plan_units
from harness.config.precision_plan import KeptLayers, Plan, Step, write_plan
from harness.sweeps.driver import judge_units
from harness.report.run_report import next_step, record_of
from harness.store.paths import inside, table_dir
from harness.store.writer import read_run

# The verdicts a plan must mend: the port (bit for bit across cards, the golden), the decisions
# and the closed loop. A layer kept in float32 cannot mend a card that dies.
MENDED = (CheckKind.CROSS_CARD, CheckKind.CPU_REFERENCE, CheckKind.DECISIONS, CheckKind.EPISODE_RETURN)
# The dtypes a plan keeps layers of in float32.
NARROW = ("float16", "bfloat16")


@dataclass(frozen=True)
class Failing:
    policy: str
    dtype: str
    card: str
    """The first card that failed (a device label of the run)."""


def failing(rows: list[dict[str, object]]) -> list[Failing]:
    """Each (policy, float16 or bfloat16) with a failed gating check a plan can mend, in the run's
    order, with the first card that failed it."""
    found: dict[tuple[str, str], Failing] = {}
    for row in rows:
        policy, dtype, kind = str(row["policy"]), str(row["dtype"]), str(row["kind"])
        if fails_the_run(bool(row["gating"]), bool(row["passed"])) and kind in MENDED and dtype in NARROW:
            found.setdefault((policy, dtype), Failing(policy, dtype, str(row["device_a"])))
    return list(found.values())


def smallest_float32_set(layers: list[str], passes: Callable[[tuple[str, ...]], bool]) -> tuple[str, ...] | None:
    """The fewest of `layers` (in forward order) to keep in float32 for `passes`, or None where
    keeping all of them does not pass. Bisection finds the shortest leading run that passes (the
    dtype with none kept is known to fail), then each layer of it but the last is dropped where
    the rest still passes. `passes` is called about log2(N) + N times at most."""
    everything = tuple(layers)
    if not passes(everything):
        return None
    failing_count, passing_count = 0, len(layers)
    while passing_count - failing_count > 1:
        middle = (failing_count + passing_count) // 2
        if passes(everything[:middle]):
            passing_count = middle
        else:
            failing_count = middle
    kept = list(everything[:passing_count])
    for name in kept[:-1]:
        trial = tuple(n for n in kept if n != name)
        if passes(trial):
            kept = list(trial)
    return tuple(kept)


def stored_config(results: Path, run_id: str) -> SweepConfig:
    """The configuration run `run_id` swept with; a UsageError where there is none to read,
    RunUnfinished where the run has not finished (it has no checks to read yet)."""
    try:
        [stored] = read_run(results, run_id)
        config = SweepConfig(**json.loads(stored["config_json"]))
    except (FileNotFoundError, ValueError, TypeError):
        raise UsageError(f"{run_id}: no sweep by that id in {results}") from None
    record = record_of(stored)
    if unfinished(record.status):
        raise RunUnfinished(f"run {run_id} has not finished (status {record.status}): {next_step(run_id, results, record)}")
    return config


def rerun_plan(config: SweepConfig, results: Path, address: str | None, policies: list[str], *, keep_plan: bool) -> SweepPlan:
    """The run's configuration, planned for running some of its units again (a diagnosis step, a
    repro) on `policies`: the run's dtypes and faults (each unit says its own dtype), its precision
    plan where `keep_plan`, nothing written under the run's id, on `address` where given, else the run's."""
    step = config.model_copy(
        update={
            "policies": policies,
            "run_id": None,
            "progress": False,
            "results": results,
            "resume": None,
            "keep_float32": config.keep_float32 if keep_plan else None,
            "address": address if address is not None else config.address,
        }
    )
    return sweep_plan(validate(step))


@contextmanager
def rerun_actors(
    step: SweepPlan, specs: list[PolicySpec], policies: dict[str, PolicyNet], folder: Path, phases: Phases
) -> Iterator[tuple[Placement, Watch]]:
    """The run's cards, with their faults (marker files under `folder`), and its CPU reference,
    placed again for a rerun (`step`), and the watch over them; Ray's for the length of the `with`."""
    kind = resolve_accelerator(step.common.accelerator)
    with ray_cluster(step.common.address, kind, step.common.cards, phases) as joined:
        with phases("actors"):
            placement = place_sweep(
                kind,
                joined.n_cards,
                step.placement,
                specs,
                step.common.threads,
                step.common.precision,
                step.common.faults,
                folder / "faults",
                policies,
                step.reference_pool,
            )
        yield placement, Watch(placement, step.hang_timeout, phases["actors"])


def diagnose(results: Path, run_id: str, address: str | None) -> Path | None:
    """Search a plan for every failing (policy, dtype) of run `run_id`; write it and return its
    path (None where nothing a plan can mend failed)."""
    config = stored_config(results, run_id)
    rows = pq.read_table(table_dir(results, "checks", run_id)).to_pylist()
    todo = failing(rows)
    if not todo:
        print(f"{run_id}: no float16 or bfloat16 port or closed-loop verdict failed; nothing to keep in float32")
        return None
    folder = inside(results, results / "diagnose" / run_id)
    plans = _search_all(
        rerun_plan(config, results, address, list(dict.fromkeys(f.policy for f in todo)), keep_plan=False), folder, todo
    )
    path = write_plan(folder / "plan.json", Plan(run_id, tuple(plans)))
    for plan in plans:
        print(
            f"plan for {plan.policy} {plan.dtype}: "
            + (f"{plan.label} ({len(plan.steps)} steps)" if plan.verified else "none: every layer in float32 still fails")
        )
    return path


def _search_all(step: SweepPlan, folder: Path, todo: list[Failing]) -> list[KeptLayers]:
    """Each failing (policy, dtype)'s plan, searched in turn on actors placed once for all."""
    specs, policies = load_policies(step.common)
    inputs = {key: plan_inputs(step, policy) for key, policy in policies.items()}
    phases = Phases()
    with rerun_actors(step, specs, policies, folder, phases) as (placement, watch):
        return [_search(step, placement, watch, policies, inputs, failed, phases) for failed in todo]


def _search(
    step: SweepPlan,
    placement: Placement,
    watch: Watch,
    policies: dict[str, PolicyNet],
    inputs: dict[str, Inputs],
    failed: Failing,
    phases: Phases,
) -> KeptLayers:
    """One failing (policy, dtype)'s plan: each step runs its units again and judges them."""
    layers = precision_layers(policies[failed.policy])
    print(f"{failed.policy} {failed.dtype} failed on {failed.card}: searching which of {', '.join(layers)} to keep in float32")
    steps: list[Step] = []
    only = {failed.policy: policies[failed.policy]}

    def passes(kept: tuple[str, ...]) -> bool:
        label = kept_label(failed.dtype, kept)
        start = time.perf_counter()
        units = plan_units(step, only, inputs, {failed.dtype: label})
        checks = judge_units(step, placement, watch, only, units, phases)
        passed = Gating.count((r.gating, r.passed) for r in checks).passed
        steps.append(Step(kept, passed, round(time.perf_counter() - start, 3), len(units)))
        print(
            f"  step {len(steps)}: {label}: {'PASS' if passed else 'FAIL'} ({len(units)} units, {steps[-1].seconds:.1f} s)",
            flush=True,
        )
        return passed

    found = smallest_float32_set(layers, passes)
    return KeptLayers(failed.policy, failed.dtype, found or tuple(layers), failed.card, tuple(steps), found is not None)
