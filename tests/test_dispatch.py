"""Each kind of work is sent where it belongs, shared results are computed once, and every
ObjectRef is let go once the last unit that reads it is judged: with stand-in actors, no Ray."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.policies import load_policy
from harness.cluster.clients import PolicyClient, ReferenceClient
from harness.sweeps.dispatch import HONEST_REPLAY_COST, Role, SharedRefs, submit
from harness.config.command_plan import sweep_plan
from harness.config.options import SweepConfig
from harness.cluster.place import REFERENCE_POOL_MAX, Placed, Placement, reference_pool_size
from harness.sweeps.gather import shares_of
from tests.builders import described
from harness.sweeps.plan import (
    BatchWork,
    EpisodeWork,
    InvarianceWork,
    LoaderWork,
    LocateWork,
    Search,
    Unit,
    plan_inputs,
    plan_units,
)
from harness.workloads import make_batch
from tests.helpers import REPO


class _Method:
    """`handle.method.remote(*args)` returns a token naming the call, and counts it."""

    def __init__(self, calls: Counter[tuple[Any, ...]], actor: str, name: str) -> None:
        self.calls, self.actor, self.name = calls, actor, name

    def remote(self, *args: Any) -> tuple[Any, ...]:
        key = (self.actor, self.name, *(a if isinstance(a, (str, int, bool)) else type(a).__name__ for a in args))
        self.calls[key] += 1
        return key


class _Actor:
    def __init__(self, calls: Counter[tuple[Any, ...]], name: str) -> None:
        self.calls, self.name = calls, name

    def __getattr__(self, method: str) -> _Method:
        return _Method(self.calls, self.name, method)


def _placement(cards: int, pool: int = 1) -> tuple[Placement, Counter[tuple[Any, ...]]]:
    calls: Counter[tuple[Any, ...]] = Counter()
    # The stand-ins are the handles; the calls go through the real clients.
    actors = [Placed(PolicyClient(_Actor(calls, f"card{i}")), described(f"sim-cpu{i}")) for i in range(cards)]
    names = ["reference"] if pool == 1 else [f"reference{m}" for m in range(pool)]
    references = [Placed(ReferenceClient(_Actor(calls, name)), described("cpu")) for name in names]
    return Placement(group=None, cards=actors, references=references, resource="NPU"), calls


def test_every_kind_of_work_is_sent_once_where_it_belongs_and_shared_refs_are_released() -> None:
    policies = {"cartpole": load_policy("cartpole")}
    config = sweep_plan(SweepConfig(policies=["cartpole"], dtypes=["float32", "bfloat16"], batch_sizes=[1, 64], episodes=2))
    inputs = {"cartpole": plan_inputs(config, policies["cartpole"])}
    units = plan_units(config, policies, inputs, {"float32": "float32", "bfloat16": "bfloat16"})
    placement, calls = _placement(cards=2)
    shared = SharedRefs()
    jobs = [submit(placement, unit, shared) for unit in units]
    by_kind = Counter(type(u.work).__name__ for u in units)
    assert set(by_kind) == {"BatchWork", "InvarianceWork", "EpisodeWork"}
    for job in jobs:
        match job.unit.work:
            case BatchWork():
                assert len(job.cards) == 2 and set(job.references) == {Role.GOLDEN, Role.FLOAT32, Role.SAME}
            case InvarianceWork():
                assert len(job.cards) == 2 and len(job.inside) == 2 and not job.references
            case EpisodeWork():
                # The CPU float32's episodes, and its replay of them as an honest port.
                assert len(job.cards) == 2 and set(job.references) == {Role.FLOAT32, Role.HONEST}
            case LoaderWork():
                raise AssertionError("cartpole is no ONNX policy")
    # The golden and float32 of a batch are computed once for both dtypes; each card runs each
    # batch once per dtype, its invariance units reading that same run.
    n_batches = by_kind["BatchWork"] // 2
    golden = [k for k in calls if k[:3] == ("reference", "run_batch", "cartpole") and k[3] == "float64"]
    assert len(golden) == 1 and calls[golden[0]] == n_batches
    card_batches = sum(n for k, n in calls.items() if k[:2] == ("card0", "run_batch"))
    assert card_batches == by_kind["BatchWork"] + by_kind["InvarianceWork"]  # the batch runs, and the rows alone
    # Each mode's CPU episodes and their honest replay, once for both dtypes.
    replays = Counter(k[-1] for k, n in calls.items() if k[:2] == ("reference", "run_episodes") for _ in range(n))
    assert replays == {False: 2, True: 2}
    assert len(shared) > 0
    for job in jobs:
        shared.release(job.shared)
    assert len(shared) == 0, "every shared ref is dropped after its last reader"


def test_a_layer_search_asks_only_the_actors_it_compares_for_their_captures() -> None:
    batch = make_batch(load_policy("cartpole").info, "normal", 8, 0)
    placement, calls = _placement(cards=3)
    asked = {}
    for search in Search:
        work = LocateWork(search, batch, None if search == Search.OVERFLOW else 2)
        job = submit(placement, Unit("u", "cartpole", "float16", work), SharedRefs())
        asked[search] = (list(job.cards), list(job.references), job.shared)
    assert asked == {
        Search.CROSS_CARD: ([2, 0], [], []),
        Search.PORT: ([2], [Role.SAME, Role.GOLDEN], []),
        Search.OVERFLOW: ([], [Role.SAME, Role.GOLDEN], []),
        Search.NONFINITE: ([2], [Role.GOLDEN], []),
    }
    # The cards capture in their dtype; the CPU in the card's dtype and the float64 golden.
    assert set(calls) == {
        ("card2", "capture", "cartpole", "float16", "tuple"),
        ("card0", "capture", "cartpole", "float16", "tuple"),
        ("reference", "capture", "cartpole", "float16", "tuple"),
        ("reference", "capture", "cartpole", "float64", "tuple"),
    }


def test_the_references_results_are_shared_out_over_its_pool_each_computed_once() -> None:
    """Pool of three: each result of the reference goes to the member with the least of its kind
    of work, so the members compute about equal shares; a set of episodes and its honest replay go
    to two members; a result that several units read is still computed once, by one member, for
    all of them."""
    policies = {"cartpole": load_policy("cartpole")}
    config = sweep_plan(SweepConfig(policies=["cartpole"], dtypes=["float32", "bfloat16"], batch_sizes=[1, 64], episodes=2))
    inputs = {"cartpole": plan_inputs(config, policies["cartpole"])}
    units = plan_units(config, policies, inputs, {"float32": "float32", "bfloat16": "bfloat16"})
    placement, calls = _placement(cards=2, pool=3)
    shared = SharedRefs()
    jobs = [submit(placement, unit, shared) for unit in units]
    per_member = Counter(k[0] for k, n in calls.items() if k[0].startswith("reference") for _ in range(n))
    assert set(per_member) == {"reference0", "reference1", "reference2"}
    for kind, loads in placement.loads.items():
        # Shared out greedily as they come: no member more than one result's cost ahead of another.
        rows = [len(u.work.batch.noise) for u in units if isinstance(u.work, BatchWork)]
        largest = 2 * HONEST_REPLAY_COST if kind == "episodes" else max(rows)
        assert max(loads) - min(loads) <= largest, (kind, loads)
    for job in jobs:
        for role, ref in job.references.items():
            assert ref[0] == f"reference{job.members[role]}", "the member recorded is the one asked"
        if isinstance(job.unit.work, EpisodeWork):
            assert job.members[Role.FLOAT32] != job.members[Role.HONEST], "played and replayed side by side"
    golden = [k for k in calls if k[1:4] == ("run_batch", "cartpole", "float64")]
    assert sum(calls[k] for k in golden) == by_batch(units), "a batch's golden once, for both dtypes"
    # Its shares come back on the lanes after the cards', one per member.
    assert {lane for job in jobs for lane in shares_of(job, reference=2)} == {0, 1, 2, 3, 4}


def by_batch(units: list[Any]) -> int:
    return len({u.work.batch.sha256 for u in units if isinstance(u.work, BatchWork)})


def test_the_pool_is_one_per_spare_cpu_at_least_one_at_most_six_or_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    for cpus, cards, pool in ((2, 2, 1), (1, 2, 1), (4, 2, 2), (5, 2, 3), (8, 2, 6), (192, 8, REFERENCE_POOL_MAX)):
        monkeypatch.setattr("ray.cluster_resources", lambda cpus=cpus: {"CPU": float(cpus), "NPU": 8.0})
        assert reference_pool_size(None, cards) == pool, (cpus, cards)
    assert reference_pool_size(2, 8) == 2, "--reference-pool wins"


NEW_WORK = (
    "harness/sweeps/plan.py",
    "Work = BatchWork | InvarianceWork | LoaderWork | EpisodeWork | LocateWork",
    "@dataclass(frozen=True)\nclass NewWork:\n    name: str = 'new'\n    input_sha256: str = ''\n\n\n"
    "Work = BatchWork | InvarianceWork | LoaderWork | EpisodeWork | LocateWork | NewWork",
    "harness/sweeps/dispatch.py",
    2,  # submit and judge
)
NEW_CHECK = (
    "harness/judge/kinds.py",
    '    ERROR = "error"',
    '    ERROR = "error"\n    NEW = "new"',
    "harness/judge/results.py",
    1,  # the result types a kind holds
)


@pytest.mark.slow
@pytest.mark.parametrize(("edited", "old", "new", "checked", "misses"), [NEW_WORK, NEW_CHECK], ids=["work", "check"])
def test_a_kind_added_in_one_place_and_forgotten_in_another_fails_mypy(
    tmp_path: Path, edited: str, old: str, new: str, checked: str, misses: int
) -> None:
    """Add a kind of work or of check and nothing else: the type checker names every dispatch
    that misses it."""
    pytest.importorskip("mypy")
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "harness", copy / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    path = copy / edited
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    # A copy of `make lint`'s cache, where there is one, spares the type checking of torch and numpy.
    cache = tmp_path / "mypy_cache"
    if (REPO / ".mypy_cache").is_dir():
        shutil.copytree(REPO / ".mypy_cache", cache)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), checked],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout
    missed = [line for line in proc.stdout.splitlines() if line.startswith(checked) and "assert_never" in line]
    assert len(missed) == misses, proc.stdout
