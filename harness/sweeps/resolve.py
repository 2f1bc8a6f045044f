"""The one step that turns a command's plan into what a run runs, for `harness sweep` and `harness
bench` alike (and the reruns of diagnose and repro): `resolve` before Ray starts, `complete` once
the cluster has said how many cards the run gets.

Every check of a plan is made here, once: the faults against the dtypes the run computes in and
the cards it gets, the cards against this machine, the policies loaded, a precision plan against
their layers, ignore-masks against their masks, the environments they play, and the memory the plan
needs (harness/sweeps/budget.py). A plan refused here is one line, exit 2, before Ray starts and
before the run id is claimed: nothing is written.

Light at the top on purpose: what the options alone refuse is refused before anything imports
torch (detecting an accelerator does, and so do the policies), so that such a mistake is answered
at once (tests/test_cli_imports.py); the rest is imported where it is first needed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Generic, TypeVar

from harness.cluster.phases import Phases
from harness.config.command_plan import BenchPlan, SweepPlan
from harness.devices import Kind, accelerator, resolve_accelerator
from harness.errors import UsageError
from harness.inference.fault_specs import refuse_absent_cards, refuse_absent_dtypes, refuse_maskless

if TYPE_CHECKING:
    from harness.envs.spec import EnvSpec
    from harness.policies import PolicyNet, PolicySpec

P = TypeVar("P", SweepPlan, BenchPlan)

# A simulated card is a process computing on its own threads; past this many per CPU core the
# cards only queue for the cores, and a typo like `--cards 1000` would start actor after actor.
SIMULATED_CARDS_PER_CORE = 4
# Where a run's card count comes from when the cluster, not the options, says it.
FROM_THE_CLUSTER = "all the cluster has"


@dataclass(frozen=True)
class Cards:
    """The cards a run asks Ray for, and how many it gets as far as is known before Ray starts."""

    asked: int | None
    """--cards (a bench without it: its largest --card-counts); None: all the cluster has."""
    count: int | None
    """`asked`, or the simulated cards a private local Ray declares; None where the cluster will say."""
    source: str
    """Where `count` comes from, as a refusal says it (`--cards 2`)."""

    @property
    def expected(self) -> int:
        """What the plan's memory is estimated for before Ray starts: `count`, else one card."""
        return self.count or 1


@dataclass(frozen=True)
class Resolved(Generic[P]):
    """A command's plan, resolved: checked, its accelerator named, its policies loaded in the driver
    and the specs the actors load them from, the environments they play."""

    plan: P
    kind: Kind
    cards: Cards
    specs: list[PolicySpec]
    policies: dict[str, PolicyNet]
    envs: dict[str, EnvSpec]
    """Each policy's environment, checked to fit it, where the run plays episodes; a policy that plays none is absent."""


def resolve(plan: P, phases: Phases | None = None) -> Resolved[P]:
    """`plan` resolved before Ray starts, or a UsageError saying what does not fit; the cheapest
    checks first. `phases` times it (the torch imports apart from the planning)."""
    phases = phases or Phases()
    common = plan.common
    with phases("plan"):
        refuse_absent_dtypes(common.faults, computed_dtypes(plan))
        # Detecting the accelerator imports torch: only a private local Ray's card count waits for it.
        kind = cache(lambda: resolve_accelerator(common.accelerator))
        cards = planned_cards(plan, kind)
        refuse_absent_cards(common.faults, cards.count, cards.source)
        check_cards(cards, kind(), common.address)
    with phases("imports"):
        from harness.config.precision_plan import check_plan
        from harness.policies.keep_float32 import precision_layers
        from harness.sweeps.budget import check_memory, estimate
        from harness.sweeps.plan import load_policies
    with phases("plan"):
        specs, policies = load_policies(common)
        if isinstance(plan, SweepPlan):
            check_plan(plan.kept, {key: precision_layers(p) for key, p in policies.items()}, common.dtypes)
        refuse_maskless(common.faults, any(p.info.masked for p in policies.values()), list(policies))
        envs = played_envs(plan, policies)
        check_memory(estimate(plan, policies, cards.expected), common.max_memory_gib)
    return Resolved(plan, kind(), cards, specs, policies, envs)


def complete(resolved: Resolved[P], n_cards: int) -> None:
    """The plan held to the `n_cards` cards the cluster gave the run, where `resolve` could not
    count them (a joined cluster, a node's own cards): a fault on a card beyond them, the memory
    of that many cards. A UsageError before any actor starts."""
    from harness.sweeps.budget import check_memory, estimate

    plan = resolved.plan
    if n_cards != resolved.cards.count:
        refuse_absent_cards(plan.common.faults, n_cards, FROM_THE_CLUSTER)
    if n_cards != resolved.cards.expected:
        check_memory(estimate(plan, resolved.policies, n_cards), plan.common.max_memory_gib)


def computed_dtypes(plan: SweepPlan | BenchPlan) -> list[str]:
    """The dtypes a run computes in: its --dtypes, and float32 where a precision plan keeps layers in it."""
    kept = isinstance(plan, SweepPlan) and bool(plan.kept)
    return [*plan.common.dtypes, *(["float32"] if kept else [])]


def planned_cards(plan: SweepPlan | BenchPlan, kind: Callable[[], Kind]) -> Cards:
    """The cards `plan` asks for and gets, as far as the options, the cluster's address and the
    accelerator (`kind`, asked only where the count is its private local Ray's) tell."""
    common = plan.common
    if common.cards is not None:
        return Cards(common.cards, common.cards, f"--cards {common.cards}")
    if isinstance(plan, BenchPlan) and plan.card_counts:
        # The bench places its largest step's cards and runs its smaller steps on some of them.
        most = max(plan.card_counts)
        return Cards(most, most, f"--card-counts {','.join(map(str, plan.card_counts))}")
    from harness.cluster.place import cluster_address  # Ray's: after what the options alone tell

    if cluster_address(common.address):
        return Cards(None, None, FROM_THE_CLUSTER)
    local = accelerator(kind()).local_cards
    return Cards(None, local, "the private local Ray's simulated cards; --cards N for more" if local else FROM_THE_CLUSTER)


def check_cards(cards: Cards, kind: Kind, address: str | None) -> None:
    """Simulated cards on a private local Ray are processes of this machine: at most
    SIMULATED_CARDS_PER_CORE per core. A joined cluster (`address`) says for itself what it can hold."""
    from harness.cluster.place import cluster_address

    cores, asked = os.cpu_count() or 1, cards.asked
    if accelerator(kind).simulated and cluster_address(address) is None and asked is not None:
        if asked > SIMULATED_CARDS_PER_CORE * cores:
            raise UsageError(
                f"{cards.source}: {asked} simulated cards on this machine's {cores} cores is more than "
                f"{SIMULATED_CARDS_PER_CORE} per core; use at most {SIMULATED_CARDS_PER_CORE * cores}, or --address a cluster"
            )


def played_envs(plan: SweepPlan | BenchPlan, policies: dict[str, PolicyNet]) -> dict[str, EnvSpec]:
    """The environment each policy plays, refused (UsageError) where it does not fit the policy;
    none where the run plays no episodes (a sweep with --episodes 0)."""
    from harness.envs.registry import check_env
    from harness.envs.spec import EnvSpec

    if isinstance(plan, SweepPlan) and plan.episodes == 0:
        return {}
    envs = {key: env for key, p in policies.items() if (env := EnvSpec.played_by(p.info)) is not None}
    for key, env in envs.items():
        check_env(env, policies[key].info)
    return envs
