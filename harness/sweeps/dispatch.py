"""Each kind of work, from what it sends the actors to the checks it is judged by.

`submit` sends a unit to the cards and the CPU reference and returns its ObjectRefs; `judge`
turns what came back into checks and episode rows. Both match on the unit's kind of work and end
in `assert_never`, so a kind added to `harness.sweeps.plan.Work` and forgotten here fails mypy
instead of falling through to another kind's branch.

Some results serve several units: the reference's golden and float32 run of a batch serve the
batch's unit in every dtype (and its loader unit), and a card's run of a large batch serves the
batch-invariance units of its first rows. `SharedRefs` computes each once and lets it go when
the last unit that reads it has been judged, so the object store holds what is still to judge,
not the whole sweep. A unit sent again (its results came from two places: an actor that moved)
shares nothing, so all of it is computed anew where the actors are now.

A batch unit the judge failed is followed by layer searches (`LocateWork`, named by
harness/sweeps/localize.py): each asks only the actors it compares for every layer's output on
the same batch, and its judge says where the failure began (`Located`).

The reference's results are shared out over its pool (harness/cluster/place.py): each result
goes, once, to the member with the least of its kind of work so far (batches by rows, episode sets
by episodes, a replay as an honest card counted at its cost), and a unit's roles may be computed by
several members.
Every member is the same CPU runner, so who computed a result changes none of its bytes.

What comes back from an actor is `Produced`: the value and where it was computed. Gathering
(harness/sweeps/gather.py) unwraps it; `judge` sees the values.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar, assert_never

import numpy as np
import ray

from harness.dtypes import base_dtype
from harness.envs.spec import EnvSpec
from harness.judge.localize import (
    FirstNonFinite,
    first_divergent_layer,
    first_layer_off_golden,
    first_nonfinite_layer,
    first_overflow_layer,
)
from harness.judge.verdicts import (
    HONEST,
    REFERENCE,
    Check,
    Rules,
    judge_batch,
    judge_batch_invariance,
    judge_episodes,
    judge_onnx,
)
from harness.outputs import EpisodeOutput, Outputs
from harness.policies import GOLDEN_DTYPE
from harness.policies.base import ACTION_MASK, EPISODE_START
from harness.cluster.clients import ReferenceClient
from harness.cluster.place import Placement
from harness.sweeps.plan import BatchWork, EpisodeWork, InvarianceWork, LoaderWork, LocateWork, Search, Unit
from harness.store.schema import CheckRow, EpisodeRow
from harness.workloads import ObsBatch

T = TypeVar("T")
# What an honest-card replay costs the reference beside playing the same episodes: its forward hooks
# nudge every layer's output (harness/inference/faults.py); measured about twice (two RL Zoo landers,
# 8 episodes a mode: the reference's plain sets and their replays took 12.0 CPU seconds, where a
# card's same plain sets took 4.0).
HONEST_REPLAY_COST = 2.0


class Role(StrEnum):
    """What a unit is judged against, computed by the CPU reference."""

    GOLDEN = "golden"  # the whole policy in float64
    FLOAT32 = "float32"  # CPU float32: the tolerance table's reference, and the episodes'
    SAME = "same"  # the CPU in the card's dtype: the port rule's yardstick
    ONNX = "onnx"  # onnxruntime on the original file
    HONEST = "honest"  # the CPU float32's episodes replayed under the honest-card model


class SharedRefs:
    """ObjectRefs that several units read, each submitted once and dropped after its last reader."""

    def __init__(self) -> None:
        self._refs: dict[Hashable, Any] = {}
        self._readers: Counter[Hashable] = Counter()

    def take(self, key: Hashable, submit: Callable[[], T]) -> T:
        if key not in self._refs:
            self._refs[key] = submit()
        self._readers[key] += 1
        value: T = self._refs[key]
        return value

    def release(self, keys: list[Hashable]) -> None:
        for key in keys:
            self._readers[key] -= 1
            if self._readers[key] == 0:
                del self._refs[key], self._readers[key]

    def __len__(self) -> int:
        return len(self._refs)


@dataclass
class Submitted:
    """A unit in flight: one ref per card by its place in the card order (none for a loader unit;
    only the cards it compares for a layer search), each card's run of the whole batch for a
    batch-invariance unit, the references by role, and the pool member that computes each role."""

    unit: Unit
    cards: dict[int, ray.ObjectRef]
    references: dict[Role, ray.ObjectRef]
    inside: list[ray.ObjectRef] = field(default_factory=list)
    shared: list[Hashable] = field(default_factory=list)
    members: dict[Role, int] = field(default_factory=dict)


@dataclass
class Gathered:
    """What came back for a unit: each card's result by label (those that produced one), the
    invariance unit's whole-batch outputs by label, the references by role; the label each card
    asked answered under, by its place in the card order, and why each that produced nothing did
    (a layer search's CPU reference among them)."""

    cards: dict[str, Any]
    inside: dict[str, Outputs]
    references: dict[Role, Any]
    lanes: dict[int, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Located:
    """What a layer search found: the note its batch's failing rows take, or where a card's first
    NaN or inf appeared (a finding row of its own)."""

    note: str = ""
    nonfinite: FirstNonFinite | None = None


@dataclass(frozen=True)
class Judged:
    """A unit's checks and episode rows; a layer search's finding instead."""

    checks: list[Check] = field(default_factory=list)
    episodes: list[EpisodeRow] = field(default_factory=list)
    located: Located | None = None


def submit(placement: Placement, unit: Unit, shared: SharedRefs | None) -> Submitted:
    """Send `unit` to every card and to the CPU reference's pool; with `shared` None, reuse nothing."""
    work, dtype, cards = unit.work, base_dtype(unit.dtype), [card.actor for card in placement.cards]
    job = Submitted(unit, {}, {})
    asked: dict[Role, tuple[int, ray.ObjectRef]] = {}  # the reference's roles: (pool member, ref)

    def once(key: Hashable, make: Callable[[], T]) -> T:
        if shared is None:
            return make()
        job.shared.append(key)
        return shared.take(key, make)

    def on_reference(
        key: Hashable, kind: str, cost: float, call: Callable[[ReferenceClient], ray.ObjectRef]
    ) -> tuple[int, ray.ObjectRef]:
        def make() -> tuple[int, ray.ObjectRef]:
            member = placement.next_reference(kind, cost)
            return member, call(placement.references[member].actor)

        return once(key, make)

    def reference_batch(batch: ObsBatch, as_dtype: str) -> tuple[int, ray.ObjectRef]:
        # Keyed by the input's bytes: a batch unit and the loader unit of the same batch share them.
        key = ("reference", unit.policy, batch.sha256, as_dtype)
        rows = len(batch.noise)
        return on_reference(key, "batches", rows, lambda r: r.run_batch(unit.policy, as_dtype, batch.obs, batch.noise))

    def reference_episodes(episodes: EpisodeWork, honest: bool) -> tuple[int, ray.ObjectRef]:
        # Keyed by the episodes: the unit of every dtype shares them.
        key = ("reference", unit.policy, episodes.input_sha256, "float32", honest)
        args = episode_args(episodes)
        cost = len(episodes.seeds) * (HONEST_REPLAY_COST if honest else 1.0)
        return on_reference(key, "episodes", cost, lambda r: r.run_episodes(unit.policy, "float32", *args, honest))

    def whole_batch(batch_work: BatchWork | InvarianceWork) -> list[ray.ObjectRef]:
        obs, noise = batch_work.batch.obs, batch_work.batch.noise
        key = ("cards", unit.policy, unit.dtype, batch_work.batch.sha256)
        return once(key, lambda: [c.run_batch(unit.policy, dtype, obs, noise) for c in cards])

    match work:
        case BatchWork():
            job.cards = dict(enumerate(whole_batch(work)))
            asked = {
                Role.GOLDEN: reference_batch(work.batch, GOLDEN_DTYPE),
                Role.FLOAT32: reference_batch(work.batch, "float32"),
                Role.SAME: reference_batch(work.batch, unit.dtype),
            }
        case InvarianceWork():
            obs, noise = tuple(o[: work.rows] for o in work.batch.obs), work.batch.noise[: work.rows]
            job.cards = {i: c.run_batch(unit.policy, dtype, obs, noise) for i, c in enumerate(cards)}
            job.inside = whole_batch(work)
        case LoaderWork():
            onnx_key = ("reference", unit.policy, work.input_sha256, "onnx")
            asked = {
                Role.GOLDEN: reference_batch(work.batch, GOLDEN_DTYPE),
                Role.FLOAT32: reference_batch(work.batch, "float32"),
                Role.ONNX: on_reference(
                    onnx_key, "batches", len(work.batch.noise), lambda r: r.run_onnx(unit.policy, work.batch.obs)
                ),
            }
        case EpisodeWork():
            job.cards = {i: c.run_episodes(unit.policy, dtype, *episode_args(work)) for i, c in enumerate(cards)}
            # The costlier replay first, so the cheaper set goes where the least is left.
            asked = {Role.HONEST: reference_episodes(work, True), Role.FLOAT32: reference_episodes(work, False)}
        case LocateWork():
            job.cards = {i: cards[i].capture(unit.policy, dtype, work.batch.obs) for i in compared_cards(work)}
            as_dtype = {Role.SAME: unit.dtype, Role.GOLDEN: GOLDEN_DTYPE}
            for role in HELD_TO[work.search]:  # asked once per search: no other unit shares them
                member = placement.next_reference("batches", len(work.batch.noise))
                asked[role] = member, placement.references[member].actor.capture(unit.policy, as_dtype[role], work.batch.obs)
        case _:
            assert_never(work)
    job.references = {role: ref for role, (_, ref) in asked.items()}
    job.members = {role: member for role, (member, _) in asked.items()}
    return job


# What a layer search holds its card (or, for an overflow, the CPU in the dtype) to, from the CPU reference.
HELD_TO = {
    Search.CROSS_CARD: (),  # card 0
    Search.PORT: (Role.SAME, Role.GOLDEN),
    Search.OVERFLOW: (Role.SAME, Role.GOLDEN),
    Search.NONFINITE: (Role.GOLDEN,),
}


def compared_cards(work: LocateWork) -> tuple[int, ...]:
    """The cards a layer search captures, by their place in the card order: the searched one first."""
    if work.card is None:
        return ()
    return (work.card, 0) if work.search == Search.CROSS_CARD else (work.card,)


def episode_args(work: EpisodeWork) -> tuple[EnvSpec, list[int], bool, str]:
    """What an actor's run_episodes takes after the policy and dtype."""
    return work.env, list(work.seeds), work.stochastic, work.batching


def judge(unit: Unit, rules: Rules, require_batch_invariance: bool, got: Gathered) -> Judged:
    """The checks of one unit from what its actors returned, and its episode rows; a layer
    search's finding."""
    work, refs = unit.work, got.references
    match work:
        case BatchWork():
            step_inputs = work.batch.step_input(ACTION_MASK), work.batch.step_input(EPISODE_START)
            return Judged(
                judge_batch(
                    rules, work.batch.noise, got.cards, refs[Role.GOLDEN], refs[Role.SAME], refs[Role.FLOAT32], *step_inputs
                )
            )
        case InvarianceWork():
            rows = {
                label: (alone, {name: value[: work.rows] for name, value in got.inside[label].items()})
                for label, alone in got.cards.items()
                if label in got.inside
            }
            return Judged(judge_batch_invariance(rows, require_batch_invariance))
        case LoaderWork():
            return Judged(judge_onnx(rules, refs[Role.ONNX], refs[Role.FLOAT32], refs[Role.GOLDEN]))
        case EpisodeWork():
            checks, steps = judge_episodes(got.cards, refs[Role.FLOAT32], refs[Role.HONEST], rules.masked)
            return Judged(checks, episode_rows(unit, work, got.cards, refs[Role.FLOAT32], refs[Role.HONEST], steps))
        case LocateWork():
            return Judged(located=locate(work, rules, got))
        case _:
            assert_never(work)


# What a layer search's note says where one of its actors produced nothing.
FAILED_SEARCH = {
    Search.CROSS_CARD: "layer search failed",
    Search.PORT: "layer search failed",
    Search.OVERFLOW: "overflow search failed",
    Search.NONFINITE: "first-NaN search failed",
}


def locate(work: LocateWork, rules: Rules, got: Gathered) -> Located:
    """Where a batch's failure began, from every layer's output on the same batch: the first layer
    where the card parts from card 0, or leaves the golden by the port rule; where the CPU in the
    dtype first overflows (named with the batch it was found on); where the card's first NaN or
    inf appeared."""
    if got.failed:
        return Located(f"{FAILED_SEARCH[work.search]}: {next(iter(got.failed.values()))}")
    refs, modules = got.references, rules.layers
    mine = got.cards[got.lanes[work.card]] if work.card is not None else {}
    match work.search:
        case Search.CROSS_CARD:
            divergence = first_divergent_layer(mine, got.cards[got.lanes[0]], modules=modules)
        case Search.PORT:
            same, golden = refs[Role.SAME], refs[Role.GOLDEN]
            divergence = first_layer_off_golden(mine, same, golden, rules.dtype, rules.limits, modules=modules)
        case Search.OVERFLOW:
            overflow = first_overflow_layer(refs[Role.SAME], refs[Role.GOLDEN], modules=modules)
            note = overflow.describe(rules.dtype) if overflow else "no layer overflows on a second run"
            return Located(f"{note} (as found on {work.batch.name})")
        case Search.NONFINITE:
            # The normalizer's input, or the first input where a policy takes several: the batch as it went in.
            observations = np.concatenate([o.reshape(len(o), -1) for o in work.batch.obs], axis=1).astype(np.float64)
            finding = first_nonfinite_layer(mine, refs[Role.GOLDEN], observations, modules=modules)
            if finding is None:
                return Located("no layer is NaN or inf on a second run: the non-finite output did not repeat")
            return Located(nonfinite=finding)
        case _:
            assert_never(work.search)
    return Located(divergence.describe() if divergence else "no layer differs on a second run: the mismatch did not repeat")


def check_row(check: Check, *, unit_id: str, policy: str, dtype: str, workload: str, input_sha256: str) -> CheckRow:
    """Where the comparison was made (unit, output, devices: a sweep's unit or a bench's row)
    beside the judge's result, which fills its own columns."""
    return CheckRow(
        unit_id=unit_id,
        policy=policy,
        dtype=dtype,
        workload=workload,
        output=check.output,
        kind=check.kind,
        device_a=check.device_a,
        device_b=check.device_b,
        input_sha256=input_sha256,
        gating=check.gating,
        result=check.result,
    )


def episode_rows(
    unit: Unit,
    work: EpisodeWork,
    cards: dict[str, list[EpisodeOutput]],
    reference: list[EpisodeOutput],
    honest: list[EpisodeOutput],
    steps: dict[str, list[int | None]],
) -> list[EpisodeRow]:
    """One row per device and episode: the CPU reference, its honest-card replay, each card."""
    rows = []
    for label, episodes in {REFERENCE: reference, HONEST: honest, **cards}.items():
        for i, episode in enumerate(episodes):
            rows.append(
                EpisodeRow(
                    unit_id=unit.unit_id,
                    policy=unit.policy,
                    dtype=unit.dtype,
                    device=label,
                    env_id=work.env.env_id,
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
