"""The work of a sweep: policies x dtypes x workloads, each unit with a stable id.

A unit id is a hash of what the unit computes (policy bytes, dtype, input bytes or episode
seeds), so the same unit has the same id in every run: `--resume` skips the ids already done,
and two runs can be joined on it.

The inputs are made before Ray starts (a bad policy or option fails at once); the units are
named once the cards have said which precision their float32 runs in (`float32-tf32` is
another unit than `float32`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from enum import StrEnum

from harness.dtypes import kept_label
from harness.envs.renames import renamed
from harness.envs.spec import EnvSpec, is_registered, require_registered
from harness.errors import UsageError
from harness.policies import PolicyNet, PolicySpec, load_policy, with_found_env
from harness.policies.base import ObservationNormalizer, PolicyInfo
from harness.config.command_plan import CommonPlan, SweepPlan
from harness.config.options import AUTO_EPISODES
from harness.workloads import ObsBatch, make_batch

EDGE_BATCH = 64
UNIFORM_BATCH = 4096
# The uniform batch holds at most this many observation values: 4096 rows of any vector policy
# up to 64 values wide, and 64 rows of an 84x84x4 Atari image rather than 4096 (115 MB, and a
# float64 golden forward of a minute on one core).
UNIFORM_VALUES = UNIFORM_BATCH * 64
# A recurrent policy's batch is one sequence, a forward per row (a millisecond each on one core):
# its uniform batch is this many steps, over 1000 of them in its first episode (workloads.episode_starts).
RECURRENT_STEPS = 1152
# A large batch's first rows are also computed as batches of these sizes (batch invariance).
INVARIANCE_ROWS = (1, 8)
# The loader check (onnx_reference) compares float32 implementations, whatever the cards run.
LOADER_DTYPE = "float32"
# A published score is compared with the CPU float32's episodes, whatever the cards run.
PUBLISHED_DTYPE = "float32"
# The first round of `--episodes auto`; later rounds grow to what the undecided verdicts ask for.
AUTO_FIRST_ROUND = 24


@dataclass(frozen=True)
class BatchWork:
    """One fixed batch through every card, and through the CPU three ways (golden, float32, the card's dtype)."""

    batch: ObsBatch

    @property
    def name(self) -> str:
        return self.batch.name

    @property
    def input_sha256(self) -> str:
        return self.batch.sha256


@dataclass(frozen=True)
class InvarianceWork:
    """A large batch's first `rows` rows, alone and inside it, on every card."""

    batch: ObsBatch
    rows: int

    @property
    def name(self) -> str:
        return f"invariance-{self.rows}-of-{self.batch.name}"

    @property
    def input_sha256(self) -> str:
        return self.batch.sha256


@dataclass(frozen=True)
class LoaderWork:
    """An ONNX policy's batch through onnxruntime on the original file and through its torch rebuild."""

    batch: ObsBatch

    @property
    def name(self) -> str:
        return f"onnx-{self.batch.name}"

    @property
    def input_sha256(self) -> str:
        return self.batch.sha256


@dataclass(frozen=True)
class EpisodeWork:
    env: EnvSpec
    seeds: tuple[int, ...]
    stochastic: bool
    batching: str  # lockstep or single

    @property
    def mode(self) -> str:
        return "stochastic" if self.stochastic else "deterministic"

    @property
    def batch_size(self) -> int:
        return len(self.seeds) if self.batching == "lockstep" else 1

    @property
    def name(self) -> str:
        return f"episodes-{self.mode}-{len(self.seeds)}x-s{self.seeds[0]}-{self.batching}"

    @property
    def input_sha256(self) -> str:
        return hashlib.sha256(f"{self.env.key}|{self.seeds}|{self.stochastic}|{self.batching}".encode()).hexdigest()


class Search(StrEnum):
    """Where a batch unit's failure is looked for, layer by layer (harness/sweeps/localize.py)."""

    CROSS_CARD = "cross-card"  # where a card parts from card 0 bit for bit
    PORT = "port"  # where a card leaves the golden by the port rule
    OVERFLOW = "overflow"  # where the CPU in the dtype first computes a value it cannot hold
    NONFINITE = "nonfinite"  # where a card first computes NaN or inf that the golden does not


@dataclass(frozen=True)
class LocateWork:
    """A follow-up of a batch unit the judge failed: every layer's output for the same batch,
    captured on the card searched (none for an overflow: the CPU's) and on what it is held to."""

    search: Search
    batch: ObsBatch
    card: int | None  # the searched card's place in the card order

    @property
    def name(self) -> str:
        on = "" if self.card is None else f"-card{self.card}"
        return f"locate-{self.search}{on}-of-{self.batch.name}"

    @property
    def input_sha256(self) -> str:
        return self.batch.sha256


Work = BatchWork | InvarianceWork | LoaderWork | EpisodeWork | LocateWork


@dataclass(frozen=True)
class Unit:
    unit_id: str
    policy: str  # key into the sweep's policies: the name the user gave
    dtype: str  # the card dtype's label: float32, float16, bfloat16, float32-tf32, float32-hf32
    work: Work

    @property
    def workload(self) -> str:
        return self.work.name


def load_policies(common: CommonPlan) -> tuple[list[PolicySpec], dict[str, PolicyNet]]:
    """Each policy the user named, loaded in the driver, and the specs the actors load it from:
    carrying the environment the driver found, so that no actor parses the files beside a
    policy again."""
    refuse_unknown_envs(common)
    specs = policy_specs(common)
    policies = {spec.source: with_gymnasium_id(load_policy(spec)) for spec in specs}
    return [with_found_env(spec, policies[spec.source]) for spec in specs], policies


def refuse_unknown_envs(common: CommonPlan) -> None:
    """`--env` and the config's [envs] name environments gymnasium knows (or renamed), whether or
    not a policy plays them: a misspelt --env next to policies that name their own would
    otherwise pass unseen."""
    named = [("--env", common.env)] if common.env is not None else []
    for where, env_id in [*named, *((f"[envs] {policy}", env) for policy, env in common.envs.items())]:
        if renamed(env_id) is None:
            try:
                require_registered(env_id)
            except UsageError as exc:
                raise UsageError(f"{where} {env_id}: {exc}") from None


def with_gymnasium_id(policy: PolicyNet) -> PolicyNet:
    """`policy` playing its environment under the id gymnasium gives it now, where gymnasium
    renamed the one its files (or the options) name; `env_source` says so. An id the installed
    gymnasium still registers is played as it is (Taxi-v3 before gymnasium 1.3)."""
    info = policy.info
    if info.env_id is None or is_registered(info.env_id) or (rename := renamed(info.env_id)) is None:
        return policy
    source = f"{info.env_source}: {rename.describe(info.env_id)}"
    setup = rename.setup(info.env_setup)
    policy.info = replace(info, env_id=rename.env_id, env_source=source, env_renamed_from=info.env_id, env_setup=setup)
    return policy


def policy_specs(common: CommonPlan) -> list[PolicySpec]:
    """Each policy the user named, with the options that tell how to load it."""
    return [
        PolicySpec(
            source=name,
            env_id=common.envs.get(name, common.env),
            env_source="the config's envs" if name in common.envs else "--env",
            env_overrides=name in common.envs,
            onnx_output=common.onnx_output,
            action_kind=common.action_kind,
        )
        for name in common.policies
    ]


@dataclass(frozen=True)
class Inputs:
    """What one policy is fed, whatever the dtype: its batches and its episodes."""

    batches: list[ObsBatch]
    episodes: list[EpisodeWork]


def plan_inputs(plan: SweepPlan, policy: PolicyNet) -> Inputs:
    """The batches and episodes (the environment they play checked by harness/sweeps/resolve.py)."""
    return Inputs(plan_batches(plan, policy), plan_episodes(plan, policy))


def plan_units(
    plan: SweepPlan, policies: dict[str, PolicyNet], inputs: dict[str, Inputs], dtypes: dict[str, str]
) -> list[Unit]:
    """Every unit of the sweep in the dtypes of `dtypes`, which maps each to its label on these
    cards, to which a precision plan (--keep-float32) adds the layers it keeps in float32."""
    units = []
    for key, policy in policies.items():
        batches = inputs[key].batches
        for dtype, card_label in dtypes.items():
            label = kept_label(card_label, plan.kept.get((key, dtype), ()))
            works: list[Work] = [BatchWork(b) for b in batches]
            works += [
                InvarianceWork(largest_normal(batches), rows)
                for rows in INVARIANCE_ROWS
                if rows < largest_normal(batches).size
            ]
            works += inputs[key].episodes
            units += [Unit(unit_id(policy, label, work), key, label, work) for work in works]
        if policy.info.onnx_path:
            units += [Unit(unit_id(policy, LOADER_DTYPE, LoaderWork(b)), key, LOADER_DTYPE, LoaderWork(b)) for b in batches]
    return units


@dataclass(frozen=True)
class PlannedBatch:
    """A batch of the plan before it is made: what the memory estimate (harness/sweeps/budget.py)
    sizes, and what `plan_batches` makes."""

    distribution: str
    rows: int


def planned_batches(plan: SweepPlan, info: PolicyInfo) -> list[PlannedBatch]:
    """The batches a sweep feeds a policy: each batch size of normal observations, the uniform
    batch and the edge batch."""
    normal = [PlannedBatch("normal", size) for size in plan.common.batch_sizes]
    return [*normal, PlannedBatch("uniform", uniform_rows(info)), PlannedBatch("edge", EDGE_BATCH)]


def plan_batches(plan: SweepPlan, policy: PolicyNet) -> list[ObsBatch]:
    info, normalizer = policy.info, policy.normalizer

    def made(b: PlannedBatch) -> ObsBatch:
        if b.distribution == "edge" and isinstance(normalizer, ObservationNormalizer):
            # On the normalizer's clamp and far beyond it, rather than on the observation bounds.
            return make_batch(info, "edge", b.rows, plan.common.seed, normalizer.clamp_bounds(), normalizer.clip)
        return make_batch(info, b.distribution, b.rows, plan.common.seed)

    return [made(b) for b in planned_batches(plan, info)]


def uniform_rows(info: PolicyInfo) -> int:
    """Rows of the uniform batch: UNIFORM_BATCH, fewer for wide observations (never below EDGE_BATCH);
    a recurrent policy's is one sequence of RECURRENT_STEPS."""
    if info.memory is not None:
        return RECURRENT_STEPS
    return int(min(UNIFORM_BATCH, max(EDGE_BATCH, UNIFORM_VALUES // info.obs_size)))


def largest_normal(batches: list[ObsBatch]) -> ObsBatch:
    return max((b for b in batches if b.distribution == "normal"), key=lambda b: b.size)


def plan_episodes(plan: SweepPlan, policy: PolicyNet) -> list[EpisodeWork]:
    """Closed-loop episodes for policies that have an environment: the first round of each mode
    (with `--episodes auto`, harness/sweeps/closed_loop.py plans the others)."""
    env = EnvSpec.played_by(policy.info)
    count = AUTO_FIRST_ROUND if plan.episodes == AUTO_EPISODES else plan.episodes
    if count == 0 or env is None:
        return []
    seeds = tuple(range(plan.common.seed, plan.common.seed + count))
    return [EpisodeWork(env, seeds, stochastic, plan.episode_batching) for stochastic in (False, True)]


def unit_id(policy: PolicyNet, dtype: str, work: Work) -> str:
    text = f"{policy.info.sha256}|{dtype}|{work.name}|{work.input_sha256}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]
