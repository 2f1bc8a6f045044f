"""PolicyActor: one per card. Runs the work it is sent and returns numpy; never judges."""

from __future__ import annotations

import harness.devices  # noqa: F401  (sets TORCH_DEVICE_BACKEND_AUTOLOAD before torch loads)

from pathlib import Path

import numpy as np
import ray

from actors.runner import Runner
from harness.devices import RAY_RESOURCE, Kind, open_card
from harness.faults import Fault, corrupt_first_layer, maybe_crash, perturb_one_weight
from harness.inference import EpisodeOutput
from harness.policies.base import PolicyNet


class PolicyActor(Runner):
    def __init__(
        self,
        kind: Kind,
        position: int,
        policies: list[str],
        threads: int,
        faults: list[Fault],
        crash_marker: str,
    ) -> None:
        # Ray hides the other cards (ASCEND_RT_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES), so the
        # card is ordinal 0 in here; its real id is what Ray assigned.
        ids = ray.get_runtime_context().get_accelerator_ids().get(RAY_RESOURCE[kind], [])
        super().__init__(open_card(kind, int(ids[0]) if ids else position), policies, threads)
        self.position = position
        self.faults = faults
        self.crash_marker = Path(crash_marker)

    def describe(self) -> dict[str, object]:
        return super().describe() | {"position": self.position, "faults": [str(f) for f in self.faults]}

    def _prepare(self, policy: PolicyNet) -> PolicyNet:
        kinds = {f.kind for f in self.faults}
        if "perturb-weight" in kinds:
            perturb_one_weight(policy)
        if "corrupt-weight" in kinds:
            corrupt_first_layer(policy)
        return policy

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> dict[str, np.ndarray]:
        maybe_crash(self.faults, self.crash_marker)
        return super().run_batch(key, dtype, obs, noise)

    def run_episodes(self, key: str, dtype: str, env_id: str, seeds: list[int], stochastic: bool) -> list[EpisodeOutput]:
        maybe_crash(self.faults, self.crash_marker)
        return super().run_episodes(key, dtype, env_id, seeds, stochastic)
