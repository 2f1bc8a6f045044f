"""Ray: join or start a cluster, and place one actor per card (plus, for a sweep, the CPU reference).

Placement is one placement group: a card bundle per card and a CPU bundle for each actor of the
CPU reference's pool (the reference computes several things per unit where a card computes one,
so a pool shares them out where the cluster has CPUs to spare: `reference_pool_size`).
If the cluster cannot hold it the run fails within PLACEMENT_TIMEOUT_S with what the cluster
has, instead of waiting forever for resources that will not come. Joining a cluster that refuses
this client (nothing listens, a token it lacks, other Ray or Python versions) fails in seconds
with the cause and the fix; a local Ray that does not start is the machine's failure (exit 3).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.bench_actor import BenchActor
from actors.policy_actor import PolicyActor
from actors.reference_actor import ReferenceActor
from harness.devices import Kind, accelerator
from harness.errors import InfrastructureError, UsageError, first_line
from harness.inference.fault_specs import Fault, env_vars, striking
from harness.inference.runner import Described
from harness.policies import PolicyNet, PolicySpec
from harness.cluster.clients import WATCH_GROUP, ActorClient, BenchClient, PolicyClient, ReferenceClient, SweepClient
from harness.cluster.ray_internals import AuthenticationError, ask_gcs

PLACEMENT_TIMEOUT_S = 30.0
# A sweep's actors (cards and the CPU reference) that die are restarted, where their node died on
# another node, and their tasks retried there; a card that dies more often is recorded dead.
ACTOR_MAX_RESTARTS = 2
# Retry an actor's tasks for as long as the actor may restart: every failed attempt to reach it
# counts as a retry, and a lost node is tried several times before Ray declares it dead.
RETRY_WHILE_RESTARTABLE = -1
# Every worker must import torch with device autoload off (see harness/__init__.py), even
# before it has imported the harness package.
BASE_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
# The CPU reference does about three times a card's work for a unit (a batch's golden, float32 and
# the card's dtype; a set of episodes, and its honest-card replay at twice that set's cost). A set is
# never split (a lockstep set is one batch: split, its bytes would change), so three members would
# each need an exact third; twice that many leave each at most one replay and one plain set, within
# a card's share. More would be processes (each importing torch) with little to do.
REFERENCE_POOL_MAX = 6


C = TypeVar("C", bound=ActorClient, covariant=True)


@dataclass(frozen=True)
class Placed(Generic[C]):
    """An actor placed on its card (the CPU reference: on a CPU), up: its client, and what it
    said of itself, its label the one it has in result rows."""

    actor: C
    described: Described

    @property
    def label(self) -> str:
        return self.described.label

    @property
    def simulated(self) -> bool:
        return self.described.device.simulated

    @property
    def one_core(self) -> bool:
        """A simulated card on one torch thread wants exactly one core: less in a window is starvation.
        (With more threads, what a card can use depends on what its kernels parallelize.)"""
        return self.simulated and self.described.threads == 1


BenchCard = Placed[BenchClient]
"""A bench's card."""


@dataclass
class Placement:
    """A sweep's actors, up: one per card, in card order, and the CPU reference's pool."""

    group: PlacementGroup
    cards: list[Placed[PolicyClient]]
    references: list[Placed[ReferenceClient]]
    resource: str
    loads: dict[str, list[float]] = field(default_factory=dict)  # kind of work -> each member's share so far

    @property
    def reference(self) -> Placed[ReferenceClient]:
        """The pool's first member: the one a layer search asks for the CPU's activations."""
        return self.references[0]

    @property
    def actors(self) -> list[Placed[SweepClient]]:
        """The cards in card order, then the reference's pool: as the driver watches them and `runs.devices` lists them."""
        return [*self.cards, *self.references]

    def next_reference(self, kind: str, cost: float) -> int:
        """The pool member that computes the reference's next result, of `kind` and about `cost`:
        the one with the least of that kind so far (the first of them on a tie, so results of one
        cost go round in turn). Each kind is shared out on its own, since their costs compare only
        among themselves. Which member computes a result changes none of its bytes (every member is
        the same CPU runner, on the same threads)."""
        loads = self.loads.setdefault(kind, [0.0] * len(self.references))
        member = loads.index(min(loads))
        loads[member] += cost
        return member


def cluster_address(address: str | None) -> str | None:
    """The cluster a run joins: `--address`, else RAY_ADDRESS; None for a private local Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def connect(address: str | None, kind: Kind, cards: int | None) -> str:
    """Join `address` (or RAY_ADDRESS); else start a private local Ray, declaring `cards`
    cards where `kind` has none of its own (simulated cards). Returns the joined cluster's
    dashboard (host:port, as ray.init's context says it), or "" where it runs none."""
    address = cluster_address(address)
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
    for logger in accelerator(kind).quiet_loggers:
        logging.getLogger(logger).setLevel(logging.CRITICAL)
    if address:
        probe_address(address)
        try:
            context = ray.init(address=address, **quiet)
        except AuthenticationError:
            raise UsageError(token_refusal(address)) from None
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UsageError(join_refusal(address, exc)) from None
        return str(context.dashboard_url or "")
    # "local" always starts a new cluster: a ray_current_cluster file left by a killed head
    # would otherwise make ray.init() join a cluster that is gone.
    resources = accelerator(kind).local_ray_resources(cards)
    try:
        ray.init(address="local", resources=resources, include_dashboard=False, **quiet)
    except Exception as exc:  # Ray raises bare Exception, OSError, RuntimeError, ... for a start that failed
        raise InfrastructureError(f"Ray did not start: {first_line(exc)}") from exc
    return ""  # started without a dashboard


def probe_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds when the cluster at a host:port address cannot be joined: nothing listens
    there, or it wants a token this client lacks. Ray itself retries for 20 s and more before it
    gives up, and then names neither."""
    host_port = address.removeprefix("ray://")
    if address == "auto" or ":" not in host_port:
        return
    host, _, port = host_port.rpartition(":")
    if not port.isdigit():
        raise UsageError(f"--address {address!r}: expected host:port, e.g. 127.0.0.1:6379")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise UsageError(
            f"cannot join the Ray cluster at {address}: nothing answers there ({exc.strerror or exc}); start it "
            "(ray start --head) or give the address it printed (--address or RAY_ADDRESS)"
        ) from None
    if not address.startswith("ray://"):  # a Ray Client server is no GCS to ask
        probe_gcs(address, timeout_s)


def probe_gcs(address: str, timeout_s: float) -> None:
    """Ask the cluster's GCS one question, with this client's credentials as ray.init will send
    them; a refusal is a UsageError naming the token's problem. Anything else is left to ray.init."""
    import grpc

    try:
        ask_gcs(address, timeout_s)
    except AuthenticationError:  # token mode, and no token anywhere
        raise UsageError(token_refusal(address)) from None
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise UsageError(token_refusal(address)) from None


TOKEN_FIX = (
    "the cluster's token (`ray get-auth-token` on its head prints it) as RAY_AUTH_TOKEN, in ~/.ray/auth_token, "
    "or in a file named by RAY_AUTH_TOKEN_PATH"
)


def token_refusal(address: str) -> str:
    """Why the cluster at `address` refused this client's token, and what to set instead."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode != "token":
        return (
            f"the Ray cluster at {address} requires a token and token authentication is off in this client "
            f"(RAY_AUTH_MODE={mode or 'unset'}): export RAY_AUTH_MODE=token and {TOKEN_FIX}"
        )
    source = (
        "RAY_AUTH_TOKEN"
        if os.environ.get("RAY_AUTH_TOKEN")
        else os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    )
    if source != "RAY_AUTH_TOKEN" and not Path(source).is_file():
        return f"the Ray cluster at {address} requires a token and this client has none: give it {TOKEN_FIX}"
    return f"the Ray cluster at {address} refused this client's token (from {source}), not the cluster's: give {TOKEN_FIX}"


_VERSIONS = re.compile(r"Ray: (\S+)\s+Python: (\S+)")


def join_refusal(address: str, exc: BaseException) -> str:
    """ray.init's refusal as one line with its cause and fix: other Ray or Python versions than
    the cluster's are named; anything else is Ray's own first line."""
    versions = _VERSIONS.findall(str(exc))
    if str(exc).startswith("Version mismatch") and len(versions) == 2:
        (cluster_ray, cluster_python), (mine_ray, mine_python) = versions
        return (
            f"the Ray cluster at {address} runs Ray {cluster_ray} on Python {cluster_python}, this client Ray {mine_ray} "
            f"on Python {mine_python}: join it from an environment with the cluster's versions "
            f"(pip install 'ray[default]=={cluster_ray}' under Python {cluster_python}), or submit the sweep with "
            "`ray job submit` so it runs on the cluster's own"
        )
    return f"cannot join the Ray cluster at {address}: {first_line(exc)}"


def card_count(kind: Kind, cards: int | None) -> int:
    """`cards` if the cluster has that many, else all it has; too few is a UsageError."""
    resource = accelerator(kind).ray_resource
    have = int(ray.cluster_resources().get(resource, 0))
    wanted = cards or have
    if wanted == 0 or have < wanted:
        raise UsageError(f"the sweep needs {wanted or 1} {resource} card(s) but the cluster has {have}; {describe_cluster()}")
    return wanted


def describe_cluster() -> str:
    # Without a placement group's own resources (`NPU_group_0_<id>`): they repeat what it holds.
    total = {
        k: v
        for k, v in sorted(ray.cluster_resources().items())
        if not k.startswith(("node:", "memory", "object_store")) and "_group_" not in k
    }
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    return f"cluster resources: {total} on {nodes} node(s)"


def reference_pool_size(requested: int | None, n_cards: int) -> int:
    """How many actors share the CPU reference's work: `requested` (--reference-pool), else one per
    CPU the cluster has left after the cards (each card's process drives its card from a core,
    though it reserves none), at least one and at most REFERENCE_POOL_MAX. One on a single 2-core
    node with two simulated cards."""
    if requested is not None:
        return requested
    spare = int(ray.cluster_resources().get("CPU", 0)) - n_cards
    return max(1, min(REFERENCE_POOL_MAX, spare))


def reserve(kind: Kind, n_cards: int, strategy: str, cpu_bundles: int) -> PlacementGroup:
    """A placement group with one bundle per card (and a CPU bundle per reference actor), or a
    UsageError within PLACEMENT_TIMEOUT_S that lists what the cluster has."""
    resource = accelerator(kind).ray_resource
    bundles = [{resource: 1.0} for _ in range(n_cards)] + [{"CPU": 1.0} for _ in range(cpu_bundles)]
    group = placement_group(bundles, strategy=strategy)
    # Asked of the GCS: Ray 2.40's `ready()` runs a task in the group, so it also waits for a
    # worker process to start on a bundle's node (a node just added has none), seconds on a busy machine.
    if not group.wait(PLACEMENT_TIMEOUT_S):
        remove_placement_group(group)
        what = f"{n_cards} {resource} card(s)" + (f" and {cpu_bundles} CPU" if cpu_bundles else "")
        raise UsageError(f"could not place {what} ({strategy}) within {PLACEMENT_TIMEOUT_S:.0f} s; {describe_cluster()}")
    return group


def card_options(
    kind: Kind, group: PlacementGroup, position: int, env: dict[str, str], restarts: int = 0
) -> dict[str, object]:
    """Ray options of the actor for card `position`: the card's resource and no CPU of its own
    (else the reference never schedules on small machines), pinned to its bundle."""
    return {
        "num_cpus": 0,
        **accelerator(kind).actor_options(),
        "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=position),
        "max_restarts": restarts,
        "max_task_retries": RETRY_WHILE_RESTARTABLE if restarts else 0,
        "runtime_env": {"env_vars": BASE_ENV | env},
    }


def place_sweep(
    kind: Kind,
    n_cards: int,
    strategy: str,
    policies: list[PolicySpec],
    threads: int,
    precision: str,
    faults: Sequence[Fault],
    marker_dir: Path,
    loaded: dict[str, PolicyNet],
    pool: int | None = None,
) -> Placement:
    """A PolicyActor per card, each with its own faults (their marker files in `marker_dir`), and
    the CPU reference's pool of `pool` ReferenceActors (None: `reference_pool_size`), in the
    bundles after the cards', once each is up with the driver's bytes (`loaded`): an actor that
    loaded others is a UsageError."""
    n_references = reference_pool_size(pool, n_cards)
    group = reserve(kind, n_cards, strategy, cpu_bundles=n_references)
    cards = []
    for position in range(n_cards):
        mine = striking(faults, position)
        actor = watched(PolicyActor).options(**card_options(kind, group, position, env_vars(mine), ACTOR_MAX_RESTARTS))
        handle = actor.remote(kind, position, policies, threads, precision, mine, str(marker_dir / f"card{position}"))
        cards.append(PolicyClient(handle))
    references = [
        ReferenceClient(
            watched(ReferenceActor)
            .options(
                num_cpus=1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=n_cards + member),
                max_restarts=ACTOR_MAX_RESTARTS,
                max_task_retries=RETRY_WHILE_RESTARTABLE,
                runtime_env={"env_vars": dict(BASE_ENV)},
            )
            .remote(policies, threads)
        )
        for member in range(n_references)
    ]
    described = wait_described([*cards, *references])
    refuse_other_bytes(described, loaded)
    placed = [Placed(card, d) for card, d in zip(cards, unique_labels(described[:n_cards]), strict=True)]
    members = [Placed(reference, d) for reference, d in zip(references, described[n_cards:], strict=True)]
    return Placement(group, placed, members, accelerator(kind).ray_resource)


def watched(cls: type) -> Any:
    """`cls` as a sweep's Ray actor, with a thread of its own for the driver's progress questions
    (Ray takes concurrency groups only here, not in `.options()`)."""
    return ray.remote(concurrency_groups={WATCH_GROUP: 1})(cls)


def place_bench(
    kind: Kind,
    n_cards: int,
    specs: list[PolicySpec],
    policies: dict[str, PolicyNet],
    threads: int,
    precision: str,
    faults: Sequence[Fault],
) -> list[BenchCard]:
    """A BenchActor per card, one bundle each (a bench has no CPU reference), each with its own
    timed-path faults. The placement group lives until Ray shuts down."""
    group = reserve(kind, n_cards, "PACK", cpu_bundles=0)
    actors = [
        BenchClient(
            ray.remote(BenchActor)
            .options(**card_options(kind, group, position, {}))
            .remote(kind, position, specs, threads, precision, striking(faults, position))
        )
        for position in range(n_cards)
    ]
    descriptions = wait_described(actors)
    refuse_other_bytes(descriptions, policies)
    return [Placed(a, d) for d, a in zip(unique_labels(descriptions), actors, strict=True)]


def wait_described(actors: Sequence[ActorClient]) -> list[Described]:
    """Wait for actors to start, saying each as it comes up (`actors 2/3 up: sim-cpu1 on HOST`);
    one that cannot open its card is a UsageError with its reason."""
    asked = [a.describe() for a in actors]
    described: dict[int, Described] = {}
    pending = list(asked)
    try:
        while pending:
            [ready], pending = ray.wait(pending, num_returns=1)
            description: Described = ray.get(ready)
            described[asked.index(ready)] = description
            print(f"actors {len(described)}/{len(asked)} up: {description.label} on {description.device.node}", flush=True)
    except ray.exceptions.RayActorError as exc:
        cause = str(getattr(exc, "cause", None) or exc).strip()
        raise UsageError(f"a card actor failed to start: {cause.splitlines()[-1] if cause else type(exc).__name__}") from None
    return [described[i] for i in range(len(asked))]


def unique_labels(cards: list[Described]) -> list[Described]:
    """A card's label is its id on its node (`npu3`); cards on several nodes can share one, and
    two cards under one label would never be compared with each other. Where labels repeat, each
    is qualified with its node (`npu3@5f2c1a`, the start of Ray's node id)."""
    labels = [c.label for c in cards]
    if len(set(labels)) == len(labels):
        return cards
    return [c.relabelled(f"{c.label}@{c.node_id[:6]}") for c in cards]


def refuse_other_bytes(descriptions: list[Described], policies: dict[str, PolicyNet]) -> None:
    """Every actor must have loaded the driver's bytes: a node with another file at the same
    path would otherwise be compared as if it ran the same policy."""
    expected = {name: p.info.sha256 for name, p in policies.items()}
    for actor in descriptions:
        if actor.policies != expected:
            raise UsageError(
                f"{actor.label} on {actor.device.node} loaded other policy bytes than the driver: {actor.policies} "
                f"vs {expected}"
            )
