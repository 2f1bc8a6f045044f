"""Warm cards between sweeps: `harness up` starts the private Ray cluster a sweep starts for itself,
places its card actors and CPU reference as detached actors named in NAMESPACE, says its address
and stays up until `harness down` or until it has been idle for its idle timeout. A sweep that
joins that address (`--address`, RAY_ADDRESS) finds them and sets them up for itself
(actors/warm.py) instead of placing its own: it saves the cluster's start, the processes', torch's
and the cards' runtime's, the part of a sweep that does not depend on what it checks. A bench
sets up the same cards as its own card actors (`place_for_bench`).

One run at a time: the keeper (harness/cluster/keeper.py) lends the cards to one driver and
takes them back when that driver is gone. Where `harness up` is running is recorded in a file
(harness/cluster/warm_record.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.warm import WarmCardActor, WarmReferenceActor
from harness.cluster.clients import BenchClient, KeeperClient, PolicyClient, WarmCardClient, WarmReferenceClient
from harness.cluster.keeper import Keeper, WarmCards
from harness.cluster.lifecycle import ray_cluster
from harness.cluster.phases import Phases
from harness.cluster.place import (
    BASE_ENV,
    BenchCard,
    Placed,
    Placement,
    card_options,
    connect,
    place_bench,
    place_sweep,
    refuse_other_bytes,
    reserve,
    unique_labels,
    wait_described,
    watched,
)
from harness.cluster.warm_record import Recorded, answers, recorded_file
from harness.devices import SIMULATED, Kind, accelerator
from harness.errors import UsageError, first_line
from harness.inference.fault_specs import Fault, Strikes, striking
from harness.inference.runner import Described
from harness.policies import PolicyNet, PolicySpec

NAMESPACE = "harness-warm"
KEEPER = "keeper"
REFERENCE = "reference"
# How often `harness up` asks its keeper whether to stop, and `harness down` whether it has.
POLL_S = 0.5
DOWN_TIMEOUT_S = 60.0


def card_name(position: int) -> str:
    return f"card{position}"


# harness up ------------------------------------------------------------------------------------


def up(kind: Kind, cards: int | None, idle_timeout_s: float) -> None:
    """Start a private Ray cluster with warm cards and serve it until `harness down`, its idle
    timeout, Ctrl-C or SIGTERM. Where warm cards are up already, a UsageError."""
    recorded = Recorded.read()
    if recorded is not None and recorded.alive():
        raise UsageError(
            f"warm cards are already up at {recorded.address} (process {recorded.pid}): use them "
            f"(harness sweep --address {recorded.address}) or stop them first (harness down)"
        )
    phases = Phases()
    with own_cluster(), ray_cluster(None, kind, cards, phases) as joined:
        address = ray.get_runtime_context().gcs_address
        with phases("actors"):
            keeper = place_warm_cards(kind, joined.n_cards, idle_timeout_s)
        # Ray 2.60 starts a local cluster with token authentication (the token in ~/.ray/auth_token),
        # and a client joins it only in token mode.
        mine = Recorded(address, os.getpid(), os.environ.get("RAY_AUTH_MODE", ""))
        mine.write()
        try:
            print(
                f"warm cards up at {address}: {joined.n_cards} {kind} card(s) and the CPU reference, in "
                f"{phases['ray'] + phases['actors']:.1f} s; they stop after {idle_timeout_s:g} s without a sweep",
                flush=True,
            )
            if mine.auth:  # harness commands take the mode from the record (warm_record.adopt_auth)
                print(f"other Ray clients join them with RAY_AUTH_MODE={mine.auth}", flush=True)
            print(f"use them: harness sweep --address {address}   (or export RAY_ADDRESS={address})", flush=True)
            print("stop them: harness down", flush=True)
            why = serve(keeper, idle_timeout_s)
        except KeyboardInterrupt:
            why = "interrupted"
        finally:
            mine.forget()
        print(f"warm cards down: {why}", flush=True)


@contextmanager
def own_cluster() -> Iterator[None]:
    """While inside, RAY_ADDRESS is unset: `harness up` starts a cluster of its own, never joins one."""
    joined = os.environ.pop("RAY_ADDRESS", None)
    try:
        yield
    finally:
        if joined is not None:
            os.environ["RAY_ADDRESS"] = joined


def place_warm_cards(kind: Kind, n_cards: int, idle_timeout_s: float) -> KeeperClient:
    """The warm actors, detached and named in NAMESPACE (one per card, the reference), and their keeper."""
    group = reserve(kind, n_cards, "PACK", cpu_bundles=1)
    named = {"namespace": NAMESPACE, "lifetime": "detached"}
    # No restarts: Ray restarts an actor from its constructor's arguments, which hold no sweep.
    cards = [
        WarmCardClient(
            watched(WarmCardActor)
            .options(**card_options(kind, group, position, {}), name=card_name(position), **named)
            .remote(kind, position)
        )
        for position in range(n_cards)
    ]
    reference = WarmReferenceClient(
        watched(WarmReferenceActor)
        .options(
            num_cpus=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=n_cards),
            runtime_env={"env_vars": dict(BASE_ENV)},
            name=REFERENCE,
            **named,
        )
        .remote()
    )
    warm = WarmCards(kind, n_cards, group, idle_timeout_s)
    keeper = ray.remote(Keeper).options(num_cpus=0, name=KEEPER, **named).remote(warm)
    ray.get([*(card.ready() for card in cards), reference.ready()])
    return KeeperClient(keeper)


def serve(keeper: KeeperClient, idle_timeout_s: float) -> str:
    """Wait until the keeper is asked to stop or the cards were idle for `idle_timeout_s`; says which."""
    while True:
        idle = ray.get(keeper.idle_s())
        if idle is None:
            return "stopped (harness down)"
        if idle >= idle_timeout_s:
            return f"idle for {idle_timeout_s:g} s"
        time.sleep(min(POLL_S, idle_timeout_s - idle))


# harness down ----------------------------------------------------------------------------------


def down(target: str | None, recorded: Recorded | None) -> str:
    """Stop the warm cards at `target` (`--address`, else the address of `recorded`, what
    `harness up` recorded); returns it once nothing answers there. Nothing up is a UsageError."""
    if target is None:
        raise UsageError(f"no warm cards are up (none recorded in {recorded_file()}): harness up starts them")
    if not answers(target):
        if recorded is not None and recorded.address == target:
            recorded.forget()  # left by a `harness up` that did not end cleanly
        raise UsageError(f"no warm cards are up at {target}: nothing answers there")
    connect(target, SIMULATED, None)
    try:
        keeper = find_keeper()
        if keeper is None:
            raise UsageError(f"the Ray cluster at {target} has no warm cards (harness up starts them)")
        ray.get(keeper.stop())
    finally:
        ray.shutdown()
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while answers(target) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return target


# a sweep on warm cards -------------------------------------------------------------------------


def find_keeper() -> KeeperClient | None:
    """The keeper of the cluster this process joined, where it has warm cards."""
    try:
        return KeeperClient(ray.get_actor(KEEPER, namespace=NAMESPACE))
    except ValueError:
        return None


def lease(
    keeper: KeeperClient, kind: Kind, n_cards: int, faults: Sequence[Fault], run_id: str, what: str
) -> tuple[WarmCards, list[WarmCardClient]]:
    """What `harness up` placed, and its first `n_cards` warm cards, lent to run `run_id` (a
    sweep's or a bench's: `what`) for as long as this driver lives; refused where they are other
    cards, where a fault acts on a card's process, or where another run holds them."""
    warm = ray.get(keeper.info())
    if warm.kind != kind:
        raise UsageError(f"the warm cards of this cluster are {warm.kind} cards, and the {what} asked for {kind}")
    for fault in faults:
        if fault.record.strikes is not Strikes.POLICY:
            raise UsageError(
                f"--inject-fault {fault}: it acts on a card's process, and warm cards keep theirs between runs; "
                "run it on a cluster of its own (without --address)"
            )
    holder = ray.get(keeper.lease(run_id, ray.get_runtime_context().get_job_id()))
    if holder is not None:
        raise UsageError(f"the warm cards are serving run {holder}: run this {what} when it ends, or without --address")
    return warm, [WarmCardClient(ray.get_actor(card_name(position), namespace=NAMESPACE)) for position in range(n_cards)]


def began(setups: list[ray.ObjectRef[Described]]) -> None:
    """Wait for the warm actors' set-up for a run; one that fails is a UsageError with its reason."""
    try:
        ray.get(setups)
    except ray.exceptions.RayTaskError as exc:
        raise UsageError(f"the warm cards could not be set up for this run: {first_line(exc.cause or exc)}") from None


def place(
    kind: Kind,
    n_cards: int,
    strategy: str,
    policies: list[PolicySpec],
    threads: int,
    precision: str,
    faults: Sequence[Fault],
    marker_dir: Path,
    loaded: dict[str, PolicyNet],
    pool: int | None,
    run_id: str,
) -> Placement:
    """The sweep's actors: the cluster's warm cards and its one CPU reference set up for run
    `run_id` where it has them, else actors placed for the run (`place_sweep`, the reference's
    pool of `pool` actors or as many as the cluster's spare CPUs)."""
    keeper = find_keeper()
    if keeper is None:
        return place_sweep(kind, n_cards, strategy, policies, threads, precision, faults, marker_dir, loaded, pool)
    warm, cards = lease(keeper, kind, n_cards, faults, run_id, "sweep")
    print(f"using the warm cards of harness up: {n_cards} of {warm.n_cards} card(s) and the CPU reference", flush=True)
    reference = WarmReferenceClient(ray.get_actor(REFERENCE, namespace=NAMESPACE))
    setups = [
        card.begin(run_id, policies, threads, precision, striking(faults, position), str(marker_dir / card_name(position)))
        for position, card in enumerate(cards)
    ]
    began([*setups, reference.begin(run_id, policies, threads)])
    *described, described_reference = wait_described([*cards, reference])
    refuse_other_bytes([*described, described_reference], loaded)
    placed: list[Placed[PolicyClient]] = [Placed(card, d) for card, d in zip(cards, unique_labels(described), strict=True)]
    return Placement(warm.group, placed, [Placed(reference, described_reference)], accelerator(kind).ray_resource)


def place_for_bench(
    kind: Kind,
    n_cards: int,
    policies: list[PolicySpec],
    threads: int,
    precision: str,
    faults: Sequence[Fault],
    loaded: dict[str, PolicyNet],
    run_id: str,
) -> list[BenchCard]:
    """The bench's cards: the cluster's warm cards set up for bench `run_id` where it has them
    (the CPU reference stays idle: a bench has none), else BenchActors placed for it."""
    keeper = find_keeper()
    if keeper is None:
        return place_bench(kind, n_cards, policies, loaded, threads, precision, faults)
    warm, cards = lease(keeper, kind, n_cards, faults, run_id, "bench")
    print(f"using the warm cards of harness up: {n_cards} of {warm.n_cards} card(s)", flush=True)
    began([card.begin_bench(run_id, policies, threads, precision, striking(faults, p)) for p, card in enumerate(cards)])
    benched = [BenchClient(card.handle) for card in cards]
    described = wait_described(benched)
    refuse_other_bytes(described, loaded)
    return [Placed(card, d) for card, d in zip(benched, unique_labels(described), strict=True)]
