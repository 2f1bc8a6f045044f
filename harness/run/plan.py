"""The work of a sweep: policies x dtypes x workloads, each unit with a stable id.

A unit id is a hash of what the unit computes (policy bytes, dtype, input bytes or episode
seeds), so the same unit has the same id in every run: `--resume` skips the ids already done,
and two runs can be joined on it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


from harness.run.options import SweepConfig
from harness.policies.base import ObservationNormalizer, PolicyNet
from harness.workloads import ObsBatch, make_batch

EDGE_BATCH = 64
UNIFORM_BATCH = 4096


@dataclass(frozen=True)
class BatchWork:
    batch: ObsBatch

    @property
    def name(self) -> str:
        return self.batch.name

    @property
    def input_sha256(self) -> str:
        return self.batch.sha256


@dataclass(frozen=True)
class EpisodeWork:
    env_id: str
    seeds: tuple[int, ...]
    stochastic: bool

    @property
    def name(self) -> str:
        mode = "stochastic" if self.stochastic else "deterministic"
        return f"episodes-{mode}-{len(self.seeds)}x-s{self.seeds[0]}"

    @property
    def input_sha256(self) -> str:
        return hashlib.sha256(f"{self.env_id}|{self.seeds}|{self.stochastic}".encode()).hexdigest()


@dataclass(frozen=True)
class Unit:
    unit_id: str
    policy: str  # key into the sweep's policies: the name the user gave
    dtype: str
    work: BatchWork | EpisodeWork

    @property
    def workload(self) -> str:
        return self.work.name


def plan_units(config: SweepConfig, policies: dict[str, PolicyNet]) -> list[Unit]:
    units = []
    for key, policy in policies.items():
        works = [BatchWork(b) for b in plan_batches(config, policy)] + plan_episodes(config, policy)
        for dtype in config.dtypes:
            for work in works:
                units.append(Unit(unit_id(policy, dtype, work), key, dtype, work))
    return units


def plan_batches(config: SweepConfig, policy: PolicyNet) -> list[ObsBatch]:
    info = policy.info
    bounds = policy.normalizer.clamp_bounds() if isinstance(policy.normalizer, ObservationNormalizer) else None
    batches = [make_batch(info, "normal", size, config.seed) for size in config.batch_sizes]
    batches.append(make_batch(info, "uniform", UNIFORM_BATCH, config.seed))
    batches.append(make_batch(info, "edge", EDGE_BATCH, config.seed, bounds))
    return batches


def plan_episodes(config: SweepConfig, policy: PolicyNet) -> list[EpisodeWork]:
    """Closed-loop episodes for discrete policies that name their environment."""
    if config.episodes == 0 or policy.info.env_id is None or policy.info.action_kind != "discrete":
        return []
    seeds = tuple(range(config.seed, config.seed + config.episodes))
    return [EpisodeWork(policy.info.env_id, seeds, stochastic) for stochastic in (False, True)]


def unit_id(policy: PolicyNet, dtype: str, work: BatchWork | EpisodeWork) -> str:
    text = f"{policy.info.sha256}|{dtype}|{work.name}|{work.input_sha256}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]
