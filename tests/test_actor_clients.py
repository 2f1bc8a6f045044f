"""Every call the driver makes to an actor's method goes through a typed client
(harness/cluster/clients.py), whose signature mypy checks; a bare `handle.method.remote(...)`
elsewhere is refused. Shown to bite on a planted call, and the clients shown to match the actors."""

from __future__ import annotations

import ast
import inspect

import pytest

from actors.bench_actor import BenchActor
from actors.policy_actor import PolicyActor
from actors.reference_actor import ReferenceActor
from actors.warm import WarmCardActor, WarmReferenceActor
from harness.cluster.clients import (
    ActorClient,
    BenchClient,
    KeeperClient,
    PolicyClient,
    ReferenceClient,
    WarmCardClient,
    WarmReferenceClient,
)
from harness.cluster.keeper import Keeper
from tests.helpers import REPO

CLIENTS = REPO / "harness" / "cluster" / "clients.py"


def method_calls_across_ray(source: str) -> list[str]:
    """`x.method.remote(...)` calls, with their line: an actor method called on a handle.
    (Creating an actor, `ray.remote(Actor).options(...).remote(...)`, is no method call.)"""
    return [
        f"{node.lineno}: {ast.unparse(node.func)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "remote"
        and isinstance(node.func.value, ast.Attribute)
    ]


def test_every_actor_method_call_goes_through_a_client() -> None:
    files = [p for top in ("harness", "actors", "jobs") for p in sorted((REPO / top).rglob("*.py")) if p != CLIENTS]
    found = {str(p.relative_to(REPO)): calls for p in files if (calls := method_calls_across_ray(p.read_text()))}
    assert not found, found


def test_a_planted_bare_call_is_found() -> None:
    assert method_calls_across_ray("def f(card, w):\n    return card.actor.run_batch.remote(w.policy, w.dtype)\n")
    assert not method_calls_across_ray("ray.remote(A).options(num_cpus=1).remote(1)\nactor.remote(2)\n")


@pytest.mark.parametrize(
    ("client", "actor"),
    [
        (PolicyClient, PolicyActor),
        (ReferenceClient, ReferenceActor),
        (BenchClient, BenchActor),
        (WarmCardClient, WarmCardActor),
        (WarmReferenceClient, WarmReferenceActor),
        (KeeperClient, Keeper),
    ],
)
def test_each_client_method_has_its_actors_signature(client: type[ActorClient], actor: type) -> None:
    methods = [name for name, _ in inspect.getmembers(client, inspect.isfunction) if not name.startswith("_")]
    assert ("describe" in methods or client is KeeperClient) and len(methods) > 1
    for name in methods:
        mine, theirs = inspect.signature(getattr(client, name)), inspect.signature(getattr(actor, name))
        assert list(mine.parameters) == list(theirs.parameters), name
        assert [p.annotation for p in mine.parameters.values()] == [p.annotation for p in theirs.parameters.values()], name
