"""Ray: join or start a cluster, and place one actor per card (plus, for a sweep, the CPU reference).

Placement is one placement group: a card bundle per card and one CPU bundle for the reference.
If the cluster cannot hold it the run fails within PLACEMENT_TIMEOUT_S with what the cluster
has, instead of waiting forever for resources that will not come.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.bench_actor import BenchActor
from actors.policy_actor import PolicyActor
from actors.reference_actor import ReferenceActor
from harness.devices import RAY_RESOURCE, Kind
from harness.errors import UsageError, first_line
from harness.inference.faults import Fault, env_vars
from harness.policies import PolicyNet, PolicySpec

PLACEMENT_TIMEOUT_S = 30.0
DEFAULT_SIMULATED_CARDS = 2
# Restarted card processes get their unit retried; a card that dies more often is recorded dead.
CARD_MAX_RESTARTS = 2
# Every worker must import torch with device autoload off (see harness/__init__.py), even
# before it has imported the harness package.
BASE_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}


@dataclass
class Placement:
    """A sweep's actors: one per card, in card order, and the CPU reference."""

    group: PlacementGroup
    cards: list[ray.actor.ActorHandle]
    reference: ray.actor.ActorHandle
    resource: str


@dataclass(frozen=True)
class BenchCard:
    """A bench's card: its label in result rows, its actor, and what the actor said of its card."""

    label: str
    actor: ray.actor.ActorHandle
    description: dict[str, object]

    @property
    def simulated(self) -> bool:
        return bool(self.description.get("simulated"))

    @property
    def one_core(self) -> bool:
        """A simulated card on one torch thread wants exactly one core: less in a window is starvation.
        (With more threads, what a card can use depends on what its kernels parallelize.)"""
        return self.simulated and self.description.get("threads") == 1


def cluster_address(address: str | None) -> str | None:
    """The cluster a run joins: `--address`, else RAY_ADDRESS; None for a private local Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def connect(address: str | None, kind: Kind, cards: int | None) -> str:
    """Join `address` (or RAY_ADDRESS); else start a private local Ray, declaring `cards`
    simulated cards when `kind` is cpu. Returns the address used."""
    address = cluster_address(address)
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
    if kind == "cpu":
        # Ray asks AscendCL for the card model of a node that declares NPUs; simulated cards
        # have none, and the traceback it logs for that says nothing about the sweep.
        logging.getLogger("ray._private.accelerators.npu").setLevel(logging.CRITICAL)
    if address:
        probe_address(address)
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UsageError(f"cannot join the Ray cluster at {address}: {first_line(exc)}") from None
        return address
    # "local" always starts a new cluster: a ray_current_cluster file left by a killed head
    # would otherwise make ray.init() join a cluster that is gone.
    resources = {"NPU": float(cards or DEFAULT_SIMULATED_CARDS)} if kind == "cpu" else None
    ray.init(address="local", resources=resources, include_dashboard=False, **quiet)
    return "local"


def probe_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds when nothing listens at a host:port address. Ray itself retries a dead
    GCS for a minute or more before it gives up."""
    host_port = address.removeprefix("ray://")
    if address == "auto" or ":" not in host_port:
        return
    host, _, port = host_port.rpartition(":")
    if not port.isdigit():
        raise UsageError(f"--address {address!r}: expected host:port, e.g. 127.0.0.1:6379")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except OSError as exc:
        raise UsageError(f"cannot join the Ray cluster at {address}: nothing answers there ({exc.strerror or exc})") from None


def card_count(kind: Kind, cards: int | None) -> int:
    """`cards` if the cluster has that many, else all it has; too few is a UsageError."""
    resource = RAY_RESOURCE[kind]
    have = int(ray.cluster_resources().get(resource, 0))
    wanted = cards or have
    if wanted == 0 or have < wanted:
        raise UsageError(f"the sweep needs {wanted or 1} {resource} card(s) but the cluster has {have}; {describe_cluster()}")
    return wanted


def describe_cluster() -> str:
    total = {k: v for k, v in sorted(ray.cluster_resources().items()) if not k.startswith(("node:", "memory", "object_store"))}
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    return f"cluster resources: {total} on {nodes} node(s)"


def reserve(kind: Kind, n_cards: int, strategy: str, cpu_bundle: bool) -> PlacementGroup:
    """A placement group with one bundle per card (and one CPU bundle for the reference), or a
    UsageError within PLACEMENT_TIMEOUT_S that lists what the cluster has."""
    resource = RAY_RESOURCE[kind]
    bundles = [{resource: 1.0} for _ in range(n_cards)] + ([{"CPU": 1.0}] if cpu_bundle else [])
    group = placement_group(bundles, strategy=strategy)
    if not ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)[0]:
        remove_placement_group(group)
        what = f"{n_cards} {resource} card(s)" + (" and 1 CPU" if cpu_bundle else "")
        raise UsageError(f"could not place {what} ({strategy}) within {PLACEMENT_TIMEOUT_S:.0f} s; {describe_cluster()}")
    return group


def card_options(
    kind: Kind, group: PlacementGroup, position: int, env: dict[str, str], restarts: int = 0
) -> dict[str, object]:
    """Ray options of the actor for card `position`: the card's resource and no CPU of its own
    (else the reference never schedules on small machines), pinned to its bundle."""
    card = {"num_gpus": 1} if kind == "cuda" else {"resources": {RAY_RESOURCE[kind]: 1}}
    return {
        "num_cpus": 0,
        **card,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=position),
        "max_restarts": restarts,
        "max_task_retries": restarts,
        "runtime_env": {"env_vars": BASE_ENV | env},
    }


def place_sweep(
    kind: Kind,
    n_cards: int,
    strategy: str,
    policies: list[PolicySpec],
    threads: int,
    precision: str,
    faults: list[Fault],
    crash_dir: Path,
) -> Placement:
    """A PolicyActor per card, each with its own faults, and the CPU ReferenceActor."""
    group = reserve(kind, n_cards, strategy, cpu_bundle=True)
    cards = []
    for position in range(n_cards):
        mine = [f for f in faults if f.applies_to(position)]
        actor = ray.remote(PolicyActor).options(**card_options(kind, group, position, env_vars(mine), CARD_MAX_RESTARTS))
        cards.append(
            actor.remote(kind, position, policies, threads, precision, mine, str(crash_dir / f"card{position}.crashed"))
        )
    reference = (
        ray.remote(ReferenceActor)
        .options(
            num_cpus=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=n_cards),
            runtime_env={"env_vars": dict(BASE_ENV)},
        )
        .remote(policies, threads)
    )
    return Placement(group, cards, reference, RAY_RESOURCE[kind])


def place_bench(
    kind: Kind,
    n_cards: int,
    specs: list[PolicySpec],
    policies: dict[str, PolicyNet],
    threads: int,
    precision: str,
    faults: list[Fault],
) -> list[BenchCard]:
    """A BenchActor per card, one bundle each (a bench has no CPU reference), each with its own
    timed-path faults. The placement group lives until Ray shuts down."""
    group = reserve(kind, n_cards, "PACK", cpu_bundle=False)
    actors = [
        ray.remote(BenchActor)
        .options(**card_options(kind, group, position, {}))
        .remote(kind, position, specs, threads, precision, [f for f in faults if f.applies_to(position)])
        for position in range(n_cards)
    ]
    descriptions = wait_described(actors)
    refuse_other_bytes(descriptions, policies)
    return [BenchCard(str(d["label"]), a, d) for d, a in zip(unique_labels(descriptions), actors, strict=True)]


def wait_described(actors: list[ray.actor.ActorHandle]) -> list[dict[str, object]]:
    """Wait for actors to start; one that cannot open its card is a UsageError with its reason."""
    try:
        return ray.get([a.describe.remote() for a in actors])
    except ray.exceptions.RayActorError as exc:
        cause = str(getattr(exc, "cause", None) or exc).strip()
        raise UsageError(f"a card actor failed to start: {cause.splitlines()[-1] if cause else type(exc).__name__}") from None


def describe_actors(placement: Placement, policies: dict[str, PolicyNet]) -> tuple[list[dict[str, object]], dict[str, object]]:
    """Every actor's description, each card with a label of its own; an actor that loaded other
    bytes than the driver is a UsageError."""
    *cards, reference = wait_described([*placement.cards, placement.reference])
    refuse_other_bytes([*cards, reference], policies)
    return unique_labels(cards), reference


def unique_labels(cards: list[dict[str, object]]) -> list[dict[str, object]]:
    """A card's label is its id on its node (`npu3`); cards on several nodes can share one, and
    two cards under one label would never be compared with each other. Where labels repeat, each
    is qualified with its node (`npu3@5f2c1a`, the start of Ray's node id)."""
    labels = [str(c["label"]) for c in cards]
    if len(set(labels)) == len(labels):
        return cards
    return [c | {"label": f"{c['label']}@{str(c['node_id'])[:6]}"} for c in cards]


def refuse_other_bytes(descriptions: list[dict[str, object]], policies: dict[str, PolicyNet]) -> None:
    """Every actor must have loaded the driver's bytes: a node with another file at the same
    path would otherwise be compared as if it ran the same policy."""
    expected = {name: p.info.sha256 for name, p in policies.items()}
    for actor in descriptions:
        if actor["policies"] != expected:
            raise UsageError(
                f"{actor['label']} on {actor['node']} loaded other policy bytes than the driver: {actor['policies']} "
                f"vs {expected}"
            )
