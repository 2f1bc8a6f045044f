"""Gathering a sweep's results while watching the actors that compute them.

Ray recovers what it can. A sweep's actors restart when they die (ACTOR_MAX_RESTARTS) and their
tasks are retried on the new process; when a node dies, its placement-group bundles are placed
again where the cluster has room, and their actors restart there. The driver ends the run, within
a bound and naming what was lost (`RunIncomplete`), where Ray cannot recover:

- a bundle of a lost node not placed again within PLACEMENT_TIMEOUT_S (no spare card or CPU);
- an actor not back, once it went away (killed, restarting, moved), within the longest of
  PLACEMENT_TIMEOUT_S, RESTART_MARGIN times the longest start seen (the sweep's actors' first,
  or a restart since) and --hang-timeout: a restart starts a process, imports torch and loads
  the policies again (a CUDA build of torch on a busy 2-core machine: over 40 s);
- an actor that hangs twice: no progress for longer than its bound (harness/sweeps/pace.py), the
  second time after the driver killed it and Ray restarted it;
- an actor of the CPU reference's pool failing for good: nothing is judged without it (a layer
  search that fails there is noted on the rows it would have named, as one that fails on a card is).

The driver sees each actor as a lane: its shares of the units, in the order it runs them (Ray runs
an actor's tasks in submission order). The first share is the one running; it started when the
share before it came back. What the lane shows of its progress (a result back, its episode steps
moving, asked every PROGRESS_POLL_S on a thread of the actor's own) is all that tells a slow
actor from a hung one (harness/sweeps/pace.py): no unit has a deadline, and no other actor's pace
counts.

A card that Ray restarted on another node is another card: each result says where it was computed
(`Produced`), a card's results are labelled by the node that computed them, and a unit whose
results from one actor came from two nodes is sent again, whole, rather than judged across them.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import placement_group_table

from harness.errors import first_line
from harness.inference.runner import Described
from harness.judge.verdicts import Check, error_check
from harness.outputs import Busy, Produced
from harness.cluster import place, ray_internals
from harness.cluster.clients import SweepClient
from harness.sweeps.dispatch import Gathered, Submitted
from harness.sweeps.pace import Pace, restart_bound_s
from harness.cluster.place import Placement
from harness.sweeps.plan import LocateWork, Unit

# How often a waiting driver looks at its actors; the placement group is a GCS call, read less
# often, and so is an actor's progress (a call into it), only while it has work.
POLL_S = 0.2
PLACEMENT_POLL_S = 1.0
PROGRESS_POLL_S = 1.0
REFERENCE_ROLE = "the CPU reference"


@dataclass(frozen=True)
class Loss:
    """One line of a run that ended early: who was lost, what happened, what it was running."""

    who: str
    what: str
    running: str

    def __str__(self) -> str:
        return f"{self.who}: {self.what}; it was running {self.running}"


class RunIncomplete(Exception):
    """The cluster cannot give the sweep what it still needs now. The units staged so far stay;
    `harness sweep --resume` runs the others."""

    def __init__(self, losses: list[Loss]) -> None:
        super().__init__("; ".join(map(str, losses)))
        self.losses = losses


class Resend(Exception):
    """A unit's results cannot be judged as they came: it is sent again, whole."""


@dataclass
class Share:
    """One actor's part of one unit (or of a layer search): the refs it computes for it."""

    what: str  # as a user reads it: "cartpole float32 normal-64"
    refs: list[Any]


@dataclass
class Lane:
    """One actor as the driver sees it: its shares in the order it runs them, its progress, its
    node, and the label of its results by the node that computed them."""

    role: str  # "card1", or REFERENCE_ROLE (with its place in the pool, where the pool has several)
    actor: SweepClient
    node_id: str
    labels: dict[str, str]  # node id -> the label of this actor's results computed there
    label: str
    pace: Pace
    shares: deque[Share] = field(default_factory=deque)
    came_back: int = 0  # results of the first share seen back
    steps: int | None = None  # its process's episode steps, as last answered (None: not since it started)
    asked: Any = None  # a progress question not answered yet
    next_ask: float = 0.0
    restarts: int = 0  # Ray's count, as last seen
    hung: int = 0
    placed: bool = True  # False while its bundle has no node (its node died)
    away: str = ""  # why it is gone, while Ray restarts it
    left_at: float = 0.0  # while away: when it went
    back_by: float = 0.0  # while away: when it must be back
    bound_s: float = 0.0  # while away: the seconds it was given

    @property
    def name(self) -> str:
        return self.role if self.role.startswith(REFERENCE_ROLE) else f"{self.role} ({self.label})"

    def running(self) -> str:
        if not self.shares:
            return "nothing"
        more = len(self.shares) - 1
        return self.shares[0].what + (f" (and {more} more queued)" if more else "")


@dataclass(frozen=True)
class ActorState:
    state: str  # Ray's: ALIVE, RESTARTING, PENDING_CREATION, DEAD, ...
    restarts: int


def actor_state(actor: Any) -> ActorState | None:
    """Ray's record of an actor; None where the GCS did not answer (a busy one times out), to be
    asked again at the next look."""
    state = ray_internals.actor_state(actor)
    return ActorState(*state) if state else None


def node_name(node_id: str) -> str:
    address = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), "?")
    return f"node {address} ({node_id[:6]})"


def node_alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


class Watch:
    """Waits for a sweep's results while watching its actors (cards, then the CPU reference's pool)."""

    def __init__(self, placement: Placement, hang_timeout_s: float, started_s: float = 0.0) -> None:
        """`started_s`: how long the actors took to start, which bounds a restart's wait until a
        restart takes longer."""
        self.group = placement.group
        self.hang_timeout_s = hang_timeout_s
        self.started_s = started_s
        # The pool's lanes, as its bundles, come after the cards'; `reference` is its first member's.
        self.reference = len(placement.cards)
        self.references = range(self.reference, self.reference + len(placement.references))
        now = time.monotonic()
        roles = [f"card{i}" for i in range(len(placement.cards))] + reference_roles(len(placement.references))
        self.lanes = [
            Lane(role, p.actor, p.described.node_id, {p.described.node_id: p.label}, p.label, Pace(now))
            for role, p in zip(roles, placement.actors, strict=True)
        ]
        self.next_placement_check = now
        self.events: list[str] = []  # what Ray recovered from, as the summary says it

    def track(self, job: Submitted) -> Submitted:
        """Follow what `job` asked of each actor, in the order it was asked."""
        what = f"{job.unit.policy} {job.unit.dtype} {job.unit.workload}"
        for lane, refs in shares_of(job, self.reference).items():
            self.follow(lane, refs, what)
        return job

    def follow(self, lane: int, refs: list[Any], what: str) -> list[Any]:
        """Follow refs just asked of one actor; every task sent to a watched actor must be followed,
        or the lane would take the next task's start for this one's."""
        watched = self.lanes[lane]
        if not watched.shares:  # idle until now: its silence starts with this work
            watched.pace.start(time.monotonic())
        watched.shares.append(Share(what, list(dict.fromkeys(refs))))
        return refs

    def get(self, refs: list[Any]) -> list[Any]:
        self.wait(refs)
        return list(ray.get(refs))

    def wait(self, refs: list[Any]) -> None:
        """Until every ref is ready, watching every actor meanwhile; RunIncomplete where the
        cluster cannot give them."""
        pending = list(dict.fromkeys(refs))
        while True:
            self.check()
            if not pending:
                return
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)

    def result(self, lane: int, ref: Any, unit: Unit) -> Produced[Any]:
        """What a ready ref holds. A card's failure on a node that lives is raised for the caller
        to record, and so is a CPU reference's in a layer search; the run ends where the actor's
        node is gone (Ray could not bring it back) or a member of the CPU reference's pool failed
        other work; a result lost with its node is Resend."""
        try:
            produced: Produced[Any] = ray.get(ref)
        except ray.exceptions.ObjectLostError:  # computed, then lost with its node: compute it again
            raise Resend from None
        except ray.exceptions.RayError as exc:
            watched = self.lanes[lane]
            running = f"{unit.policy} {unit.dtype} {unit.workload}"
            if not node_alive(watched.node_id):
                raise RunIncomplete([Loss(watched.name, f"its {node_name(watched.node_id)} is gone", running)]) from None
            if lane in self.references and not isinstance(unit.work, LocateWork):
                raise RunIncomplete([Loss(watched.name, f"failed for good ({first_line(exc)})", running)]) from None
            raise
        return produced

    def label(self, lane: int, produced: Produced[Any]) -> str:
        """The label of an actor's result: its own while it stays on its node; a card that Ray
        restarted on another node is another card, labelled with that node."""
        watched = self.lanes[lane]
        if produced.node_id not in watched.labels:
            watched.labels[produced.node_id] = f"{produced.device}@{produced.node_id[:6]}"
            self.events.append(
                f"{watched.role} restarted on {node_name(produced.node_id)}: {watched.labels[produced.node_id]} "
                f"replaces {watched.label}"
            )
        watched.label = watched.labels[produced.node_id]
        return watched.label

    def lane_of(self, label: str) -> int:
        return next(i for i, lane in enumerate(self.lanes) if label in lane.labels.values())

    def replaced(self) -> dict[str, list[str]]:
        """Each actor whose results came from more than one node: its label now -> its labels before."""
        moved = [lane for lane in self.lanes if len(lane.labels) > 1]
        return {lane.label: [label for label in lane.labels.values() if label != lane.label] for lane in moved}

    def replacements(self) -> list[dict[str, object]]:
        """Each actor that Ray restarted on another node, described as it is now (the card, or the
        CPU, that replaced the one before), with the labels it replaces, as `runs.devices` holds it."""
        moved = [(i, lane) for i, lane in enumerate(self.lanes) if len(lane.labels) > 1]
        asked = [self.follow(i, [lane.actor.describe()], "its description")[0] for i, lane in moved]
        replaced = self.replaced()
        described: list[Described] = self.get(asked)
        return [
            d.relabelled(lane.label).record() | {"replaces": replaced[lane.label]}
            for d, (_, lane) in zip(described, moved, strict=True)
        ]

    def check(self) -> None:
        """Note what came back; follow lost nodes and restarts; kill a hung actor once; end the run
        where the cluster cannot recover."""
        now = time.monotonic()
        for lane in self.lanes:
            self._advance(lane, now)
        if now >= self.next_placement_check:
            self.next_placement_check = now + PLACEMENT_POLL_S
            self._follow_placement(now)
        losses = [loss for lane in self.lanes if (loss := self._check(lane, now))]
        if losses:
            raise RunIncomplete(losses)

    def _advance(self, lane: Lane, now: float) -> None:
        """Each result back is progress; a share whose results are all back is done, and the next runs."""
        while lane.shares:
            refs = lane.shares[0].refs
            back, pending = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
            if len(back) > lane.came_back:
                lane.pace.progressed(now)
                lane.came_back = len(back)
            if pending:
                return
            lane.shares.popleft()
            lane.came_back = 0

    def _ask_progress(self, lane: Lane, now: float) -> None:
        """Its episode steps, asked while it works: a count that moved is progress. A question
        it does not answer (a process stuck with Python's lock held) stays asked: no progress."""
        if lane.asked is not None:
            if not ray.wait([lane.asked], timeout=0)[0]:
                return
            try:
                steps: int | None = ray.get(lane.asked)
            except ray.exceptions.RayError:  # its process went: what Ray does next is read from its state
                steps = lane.steps
            lane.asked = None
            if lane.steps is not None and steps != lane.steps:
                lane.pace.progressed(now)
            lane.steps = steps
        if now >= lane.next_ask:
            lane.asked, lane.next_ask = lane.actor.progress(), now + PROGRESS_POLL_S

    def _follow_placement(self, now: float) -> None:
        """A bundle whose node died has no node until Ray places it again; its actor restarts there."""
        table = placement_group_table(self.group)
        if not table:  # the GCS did not answer: ask again at the next look
            return
        bundles = table["bundles_to_node_id"]
        for index, lane in enumerate(self.lanes):
            node = bundles.get(index) or ""
            if not node and lane.placed:
                lane.placed = False
                why = f"its {node_name(lane.node_id)} is gone, and no other node took its place"
                self._leave(lane, now, why, place.PLACEMENT_TIMEOUT_S)
            elif node and node != lane.node_id:
                lane.node_id, lane.placed = node, True
                self._leave(
                    lane, now, f"restarted on {node_name(node)} after its node was lost, and not up there", self.restart_s()
                )

    def _check(self, lane: Lane, now: float) -> Loss | None:
        if not lane.shares:
            return None
        if lane.away:
            return self._check_away(lane, now)
        self._ask_progress(lane, now)
        if not lane.pace.hung(now, self.hang_timeout_s):
            return None
        state = actor_state(lane.actor.handle)
        if state is None:
            return None
        if state.state != "ALIVE" or state.restarts > lane.restarts:  # it died and Ray restarts it: no hang
            self._leave(lane, now, "restarting after its process died, and not back", self.restart_s())
            return self._check_away(lane, now)
        silence = f"no progress for {lane.pace.quiet_s(now):.3g} s, allowed {lane.pace.bound_s(self.hang_timeout_s):.3g} s"
        lane.hung += 1
        if lane.hung > 1:
            return Loss(lane.name, f"hung again after its restart ({silence})", lane.running())
        ray.kill(lane.actor.handle, no_restart=False)
        self._leave(lane, now, f"killed after it hung ({silence}), and not back", self.restart_s())
        self.events.append(f"{lane.name} hung on {lane.shares[0].what} ({silence}): restarted")
        return None

    def _check_away(self, lane: Lane, now: float) -> Loss | None:
        state = actor_state(lane.actor.handle)  # None: unknown this time, and only the bound below counts
        if state is not None and state.state == "DEAD":  # out of restarts: its tasks fail, gathered as failures
            lane.away = ""
            lane.pace.start(now)
        elif state is not None and state.state == "ALIVE" and state.restarts > lane.restarts and lane.placed:
            lane.away, lane.restarts = "", state.restarts
            lane.pace.start(now)
            self.started_s = max(self.started_s, now - lane.left_at)  # a slow restart: the next is given longer
        elif now > lane.back_by:
            return Loss(lane.name, f"{lane.away} within {lane.bound_s:.0f} s", lane.running())
        return None

    def restart_s(self) -> float:
        """How long an actor that restarts may take to be back (harness/sweeps/pace.py)."""
        return restart_bound_s(place.PLACEMENT_TIMEOUT_S, self.started_s, self.hang_timeout_s)

    def _leave(self, lane: Lane, now: float, why: str, bound_s: float) -> None:
        """It went away: its process starts anew, its step count with it, and its progress question is moot."""
        lane.away, lane.left_at, lane.back_by, lane.bound_s = why, now, now + bound_s, bound_s
        lane.steps = lane.asked = None


@dataclass(frozen=True)
class ActorTimes:
    """What a sweep's actors spent computing, as its runs row records it."""

    reference_s: dict[str, float]  # the CPU reference's seconds per kind of work, its pool's summed
    busy: dict[str, Busy]  # what each actor spent computing, by its name


def actor_times(placement: Placement, watch: Watch) -> ActorTimes:
    """Asked of every actor once its work is done (it answers after the work sent before); a card
    that died for good (recorded dead) has no busy time to give."""
    busy = [watch.follow(i, [lane.actor.busy_time()], "its busy time")[0] for i, lane in enumerate(watch.lanes)]
    pool = zip(watch.references, placement.references, strict=True)
    kinds = [watch.follow(lane, [member.actor.compute_seconds()], "its compute times")[0] for lane, member in pool]
    watch.wait([*busy, *kinds])
    reference_s: dict[str, float] = {}
    for seconds in ray.get(kinds):
        for what, s in seconds.items():
            reference_s[what] = reference_s.get(what, 0.0) + s
    alive: dict[str, Busy] = {}
    for lane, ref in zip(watch.lanes, busy, strict=True):
        try:
            alive[lane.name] = ray.get(ref)
        except ray.exceptions.RayError:
            continue
    return ActorTimes(reference_s, alive)


def reference_roles(pool: int) -> list[str]:
    """The CPU reference's pool as a run names it: one actor is the reference; several are numbered."""
    return [REFERENCE_ROLE] if pool == 1 else [f"{REFERENCE_ROLE} {member}" for member in range(pool)]


def shares_of(job: Submitted, reference: int) -> dict[int, list[Any]]:
    """What `job` asked of each actor, by lane: each card its run and (invariance) its whole batch,
    each member of the reference's pool (lanes from `reference` on) the roles it computes."""
    shares = {position: [ref, *job.inside[position : position + 1]] for position, ref in job.cards.items()}
    for role, ref in job.references.items():
        shares.setdefault(reference + job.members[role], []).append(ref)
    return shares


def gather(job: Submitted, watch: Watch) -> tuple[Gathered, list[Check]] | None:
    """The unit's results, each card's under the label of the card that computed it, and an error
    check for each card that produced nothing. None where the unit must be sent again: one actor's
    results for it came from two nodes (Ray restarted the actor elsewhere in between), or a result
    was lost with its node before the driver fetched it."""
    shares = shares_of(job, watch.reference)
    watch.wait([ref for refs in shares.values() for ref in refs])
    try:
        return _gathered(job, watch, shares)
    except Resend:
        return None


def _gathered(job: Submitted, watch: Watch, shares: dict[int, list[Any]]) -> tuple[Gathered, list[Check]]:
    got = Gathered({}, {}, {})
    lanes = {role: watch.reference + member for role, member in job.members.items()}
    for lane in watch.references:
        if shares.pop(lane, None) is None:
            continue
        roles = [role for role in job.references if lanes[role] == lane]
        try:  # only a layer search's reference fails here: for other work, Watch.result ends the run
            produced = _one_node([watch.result(lane, job.references[role], job.unit) for role in roles])
        except ray.exceptions.RayError as exc:
            got.failed[watch.lanes[lane].label] = first_line(exc)
            continue
        watch.label(lane, produced[0])
        got.references |= {role: r.value for role, r in zip(roles, produced, strict=True)}
    for position, refs in shares.items():
        try:
            alone, *whole = _one_node([watch.result(position, ref, job.unit) for ref in refs])
        except ray.exceptions.RayError as exc:
            got.lanes[position] = watch.lanes[position].label
            got.failed[got.lanes[position]] = first_line(exc)
            continue
        label = got.lanes[position] = watch.label(position, alone)
        got.cards[label] = alone.value
        if whole:
            got.inside[label] = whole[0].value
    errors = [error_check(label, f"{label} produced nothing: {why}") for label, why in got.failed.items()]
    return got, errors


def _one_node(results: list[Produced[Any]]) -> list[Produced[Any]]:
    if len({r.node_id for r in results}) > 1:
        raise Resend
    return results
