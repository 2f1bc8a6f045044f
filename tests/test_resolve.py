"""The one resolve step (harness/sweeps/resolve.py): the sweep and the bench refuse a plan alike,
before Ray starts and before anything is written, and `complete` holds a plan to the cards the
cluster gives where nothing could count them before."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config.command_plan import bench_plan, sweep_plan
from harness.config.options import BenchConfig, SweepConfig, validate
from harness.errors import UsageError
from harness.sweeps.budget import GIB, estimate
from harness.sweeps.resolve import complete, resolve
from tests.helpers import assert_usage_error, cli

# A private local Ray's simulated cards, without --cards: two.
LOCAL = ("--accelerator", "cpu")


@pytest.mark.parametrize(
    "args, says",
    [
        ((*LOCAL, "--inject-fault", "card3:perturb-weight", "--cards", "2"), "the run has 2 card(s) (--cards 2)"),
        ((*LOCAL, "--inject-fault", "card2:perturb-weight"), "(the private local Ray's simulated cards; --cards N for more)"),
        ((*LOCAL, "--inject-fault", "all:fp16-accumulate", "--dtypes", "float32"), "it acts only on float16"),
        ((*LOCAL, "--inject-fault", "all:ignore-masks", "--policy", "cartpole"), "no policy of the run takes action masks"),
        ((*LOCAL, "--policy", "huggy-arch", "--env", "CartPole-v1"), "environment CartPole-v1 does not fit policy huggy-arch"),
        ((*LOCAL, "--cards", "100000"), "--cards 100000: 100000 simulated cards on this machine"),
    ],
)
def test_the_sweep_and_the_bench_refuse_a_bad_plan_alike(args: tuple[str, ...], says: str, tmp_path: Path) -> None:
    import ray

    sweep = cli("sweep", *args, "--results", str(tmp_path / "sweep"))
    bench = cli("bench", *args, "--results", str(tmp_path / "bench"))
    assert_usage_error(sweep, says)
    assert_usage_error(bench, says)
    assert sweep.stderr == bench.stderr
    assert not any(tmp_path.iterdir()), "nothing written for a refused plan"
    assert not ray.is_initialized(), "refused before Ray starts"


def test_the_bench_counts_the_cards_its_largest_step_places(tmp_path: Path) -> None:
    bench = cli("bench", *LOCAL, "--card-counts", "1,3", "--inject-fault", "card3:perturb-weight", "--results", str(tmp_path))
    assert_usage_error(bench, "the run has 3 card(s) (--card-counts 1,3): card0 to card2")
    resolved = resolve(bench_plan(validate(BenchConfig(accelerator="cpu", card_counts=[1, 3], results=str(tmp_path)))))
    assert (resolved.cards.asked, resolved.cards.count) == (3, 3)


def test_a_sweep_without_episodes_checks_no_environment(tmp_path: Path) -> None:
    bad = SweepConfig(policies=["huggy-arch"], env="CartPole-v1", accelerator="cpu", results=str(tmp_path))
    with pytest.raises(UsageError, match="does not fit policy huggy-arch"):
        resolve(sweep_plan(validate(bad)))
    assert resolve(sweep_plan(validate(bad.model_copy(update={"episodes": 0})))).envs == {}


def test_complete_holds_the_plan_to_the_cards_the_cluster_gives(tmp_path: Path) -> None:
    """With --address and no --cards, only the cluster can say how many cards the run gets: a
    fault beyond them, or more memory than that many cards have, is refused once it says."""
    config = SweepConfig(
        policies=["cartpole"],
        accelerator="cpu",
        address="127.0.0.1:1",
        inject_fault=["card2:perturb-weight"],
        results=str(tmp_path),
    )
    resolved = resolve(sweep_plan(validate(config)))  # the cluster is not asked: nothing to count yet
    assert (resolved.cards.asked, resolved.cards.count) == (None, None)
    complete(resolved, 3)
    with pytest.raises(UsageError, match=r"card2:perturb-weight: the run has 2 card\(s\) \(all the cluster has\)"):
        complete(resolved, 2)

    one, many = (estimate(resolved.plan, resolved.policies, n).total for n in (1, 64))
    config = SweepConfig(**{**config.model_dump(), "inject_fault": [], "max_memory_gib": (one + many) / 2 / GIB})
    bounded = resolve(sweep_plan(validate(config)))  # held to one card before Ray starts: it fits
    complete(bounded, 3)
    with pytest.raises(UsageError, match=r"the plan needs about .* more than --max-memory"):
        complete(bounded, 64)
    assert not any(tmp_path.iterdir())
