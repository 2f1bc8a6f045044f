"""Where a card parts from the others or from the golden: the first layer, found by capturing
every layer's output on both sides for the same input (the judge says which layer; this asks
the actors to capture). Run once per failing card, dtype and kind of check; later batches that
fail the same way name that batch's answer instead of searching again. The captures queue behind
the actors' other work and are waited for as any result is (harness/run/gather.py)."""

from __future__ import annotations

import ray

from harness.dtypes import base_dtype
from harness.errors import first_line
from harness.inference.capture import layer_modules
from harness.judge.kinds import CheckKind
from harness.judge.localize import first_divergent_layer, first_layer_off_golden
from harness.judge.verdicts import Rules
from harness.policies import GOLDEN, PolicyNet
from harness.run.gather import Watch
from harness.run.place import Placement
from harness.run.plan import BatchWork, Unit
from harness.store.schema import CheckRow

SEARCHED = (CheckKind.CROSS_CARD, CheckKind.CPU_REFERENCE)


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
        card = watch.follow(position, [placement.cards[position].capture.remote(unit.policy, dtype, obs)], what)
        if kind == CheckKind.CROSS_CARD:
            others = watch.follow(0, [placement.cards[0].capture.remote(unit.policy, dtype, obs)], what)
        else:
            asked = [placement.reference.capture.remote(unit.policy, d, obs) for d in (unit.dtype, GOLDEN)]
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


def append_detail(rows: list[CheckRow], kind: CheckKind, label: str, note: str) -> None:
    for row in rows:
        if (row.kind, row.device_a) == (kind, label) and not row.passed:
            row.detail = f"{row.detail}; {note}" if row.detail else note
