"""Where a card parts from the others or from the golden: the first layer, found by capturing
every layer's output on both sides for the same input (the judge says which layer; this asks
the actors to capture). Run once per failing card, dtype and kind of check; later batches that
fail the same way name that batch's answer instead of searching again. Where the dtype itself
overflows (the CPU in the card's dtype too), the layer where that begins, from the CPU
reference's captures, once per policy and dtype. The captures queue behind the actors' other
work and are waited for as any result is (harness/sweeps/gather.py)."""

from __future__ import annotations

import math

import numpy as np
import ray

from harness.dtypes import base_dtype
from harness.errors import first_line
from harness.inference.capture import layer_modules
from harness.judge.golden import GoldenComparison
from harness.judge.kinds import CheckKind
from harness.judge.localize import first_divergent_layer, first_layer_off_golden, first_nonfinite_layer, first_overflow_layer
from harness.judge.verdicts import Check, Rules
from harness.policies import GOLDEN_DTYPE, PolicyNet
from harness.sweeps.dispatch import check_row
from harness.sweeps.gather import Watch
from harness.cluster.place import Placement
from harness.sweeps.plan import BatchWork, Unit
from harness.store.schema import CheckRow

SEARCHED = (CheckKind.CROSS_CARD, CheckKind.CPU_REFERENCE)
# The dtype's own checks that fail on values it cannot hold: each names where the overflow began.
OVERFLOWED = (CheckKind.TOLERANCE, CheckKind.DECISIONS)


def localize_failures(
    placement: Placement,
    watch: Watch,
    policy: PolicyNet,
    unit: Unit,
    rows: list[CheckRow],
    rules: Rules,
    found: dict[tuple[str, str, CheckKind, str], str],
) -> None:
    """For each card that failed the port on this batch, name the first layer where it parts:
    from card 0 bit for bit, or from the golden by the port rule, on the same input; appended
    to the failing rows' `detail`. Searched on the first batch that fails for a card and dtype
    (a search reruns the forward on both sides); later batches name that batch's answer."""
    work = unit.work
    assert isinstance(work, BatchWork)
    obs, dtype = work.batch.obs, base_dtype(unit.dtype)
    modules = layer_modules(policy)
    failing = sorted({(CheckKind(r.kind), r.device_a) for r in rows if not r.passed and r.kind in SEARCHED})
    for kind, label in failing:
        key = (unit.policy, unit.dtype, kind, label)
        if key in found:
            append_detail(rows, kind, label, found[key])
            continue
        what = f"the layer search of {unit.policy} {unit.dtype} {unit.workload}"
        position = watch.lane_of(label)
        card = watch.follow(position, [placement.cards[position].actor.capture(unit.policy, dtype, obs)], what)
        if kind == CheckKind.CROSS_CARD:
            others = watch.follow(0, [placement.cards[0].actor.capture(unit.policy, dtype, obs)], what)
        else:
            asked = [placement.reference.actor.capture(unit.policy, d, obs) for d in (unit.dtype, GOLDEN_DTYPE)]
            others = watch.follow(watch.reference, asked, what)
        try:
            mine, *theirs = watch.get([*card, *others])
        except ray.exceptions.RayError as exc:
            note = f"layer search failed: {first_line(exc)}"
        else:
            if kind == CheckKind.CROSS_CARD:
                divergence = first_divergent_layer(mine, theirs[0], modules=modules)
            else:
                divergence = first_layer_off_golden(mine, theirs[0], theirs[1], unit.dtype, rules.limits, modules=modules)
            note = divergence.describe() if divergence else "no layer differs on a second run: the mismatch did not repeat"
        found[key] = f"as found on {unit.workload}: {note}"
        append_detail(rows, kind, label, note)


def localize_overflow(
    placement: Placement, watch: Watch, policy: PolicyNet, unit: Unit, rows: list[CheckRow], found: dict[tuple[str, str], str]
) -> None:
    """Where a batch overflows the dtype (a port row forgave it: `n_overflow`), the layer where
    the CPU in that dtype first computes a value that is not finite, named on the forgiving port
    rows and on the dtype's failing rows of those cards. Searched once per policy and dtype."""
    work = unit.work
    assert isinstance(work, BatchWork)
    cards = {r.device_a for r in rows if _forgave_overflow(r)}
    if not cards:
        return
    key = (unit.policy, unit.dtype)
    if key not in found:
        what = f"the overflow search of {unit.policy} {unit.dtype} {unit.workload}"
        asked = [placement.reference.actor.capture(unit.policy, d, work.batch.obs) for d in (unit.dtype, GOLDEN_DTYPE)]
        try:
            acts, golden = watch.get(watch.follow(watch.reference, asked, what))
        except ray.exceptions.RayError as exc:
            found[key] = f"overflow search failed: {first_line(exc)}"
        else:
            overflow = first_overflow_layer(acts, golden, modules=layer_modules(policy))
            note = overflow.describe(unit.dtype) if overflow else "no layer overflows on a second run"
            found[key] = f"{note} (as found on {unit.workload})"
    for row in rows:
        named = _forgave_overflow(row)
        failed = row.kind in OVERFLOWED and not row.passed
        if row.device_a in cards and (named or failed):
            row.note(found[key])


def localize_nonfinite(
    placement: Placement, watch: Watch, policy: PolicyNet, unit: Unit, rows: list[CheckRow], found: set[tuple[str, str, str]]
) -> None:
    """For each card whose output on this batch holds NaN or inf where the golden's does not, a
    `first_nonfinite` finding: the first layer, in forward order, where it appeared on that card
    (captured there again), the input row and the layer's largest finite input. Once per card,
    policy and dtype, on the first batch that shows it."""
    work = unit.work
    assert isinstance(work, BatchWork)
    for row in [r for r in rows if _not_finite_on_card(r)]:
        key = (unit.policy, unit.dtype, row.device_a)
        if key in found:
            continue
        found.add(key)
        what = f"the first-NaN search of {unit.policy} {unit.dtype} {unit.workload}"
        position = watch.lane_of(row.device_a)
        card = watch.follow(
            position, [placement.cards[position].actor.capture(unit.policy, base_dtype(unit.dtype), work.batch.obs)], what
        )
        gold = watch.follow(
            watch.reference, [placement.reference.actor.capture(unit.policy, GOLDEN_DTYPE, work.batch.obs)], what
        )
        try:
            acts, golden = watch.get([*card, *gold])
        except ray.exceptions.RayError as exc:
            row.note(f"first-NaN search failed: {first_line(exc)}")
            continue
        # The normalizer's input, or the first input where a policy takes several: the batch as it went in.
        observations = np.concatenate([o.reshape(len(o), -1) for o in work.batch.obs], axis=1).astype(np.float64)
        finding = first_nonfinite_layer(acts, golden, observations, modules=layer_modules(policy))
        if finding is None:
            row.note("no layer is NaN or inf on a second run: the non-finite output did not repeat")
            continue
        check = Check(row.output, CheckKind.FIRST_NONFINITE, row.device_a, row.device_b, False, finding)
        rows.append(
            check_row(
                check,
                unit_id=unit.unit_id,
                policy=unit.policy,
                dtype=unit.dtype,
                workload=unit.workload,
                input_sha256=work.input_sha256,
            )
        )


def _not_finite_on_card(row: CheckRow) -> bool:
    """A port row whose card computed NaN or inf where the golden did not (forgiven or not)."""
    result = row.result
    return (
        row.kind == CheckKind.CPU_REFERENCE
        and isinstance(result, GoldenComparison)
        and (result.n_overflow > 0 or not math.isfinite(result.max_abs))
    )


def _forgave_overflow(row: CheckRow) -> bool:
    """A port row that judged the card where both computed finite values: the dtype overflowed."""
    return row.kind == CheckKind.CPU_REFERENCE and isinstance(row.result, GoldenComparison) and row.result.n_overflow > 0


def append_detail(rows: list[CheckRow], kind: CheckKind, label: str, note: str) -> None:
    for row in rows:
        if (row.kind, row.device_a) == (kind, label) and not row.passed:
            row.note(note)
