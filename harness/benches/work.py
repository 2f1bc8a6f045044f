"""What a bench measures, before it is measured: the (policy, dtype, batch) combinations, their
batches made on the driver from the seed, and the closed loops."""

from __future__ import annotations

from dataclasses import dataclass

from harness.envs.spec import EnvSpec
from harness.workloads import ObsBatch


@dataclass(frozen=True)
class Work:
    """One (policy, dtype, batch) combination still to measure."""

    policy: str
    dtype: str
    batch: ObsBatch

    @property
    def key(self) -> tuple[str, str, int]:
        return self.policy, self.dtype, self.batch.size


@dataclass(frozen=True)
class Loop:
    """One closed loop still to measure: `n_envs` environments of `env` in lockstep, played by
    `policy` in `dtype`."""

    policy: str
    env: EnvSpec
    dtype: str
    n_envs: int
