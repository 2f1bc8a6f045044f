"""PolicyActor: one per card. Runs the work it is sent and returns numpy; never judges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import ray

from harness.devices import RAY_RESOURCE, Kind, open_card
from harness.inference.faults import Fault, corrupt_first_layer, maybe_crash, perturb_one_weight
from harness.inference.runner import Runner
from harness.outputs import EpisodeOutput, Outputs
from harness.policies.base import PolicyNet


def card_id(kind: Kind, position: int) -> int:
    """The card's id on its node as Ray assigned it. Ray hides the other cards
    (ASCEND_RT_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES), so in here the card is ordinal 0."""
    ids = ray.get_runtime_context().get_accelerator_ids().get(RAY_RESOURCE[kind], [])
    return int(ids[0]) if ids else position


class PolicyActor:
    def __init__(
        self,
        kind: Kind,
        position: int,
        policies: list[str],
        threads: int,
        faults: list[Fault],
        crash_marker: str,
    ) -> None:
        self.position = position
        self.faults = faults
        self.crash_marker = Path(crash_marker)
        self.runner = Runner(open_card(kind, card_id(kind, position)), policies, threads, prepare=self._inject)

    def describe(self) -> dict[str, object]:
        return describe_runner(self.runner) | {"position": self.position, "faults": [str(f) for f in self.faults]}

    def _inject(self, policy: PolicyNet) -> PolicyNet:
        kinds = {f.kind for f in self.faults}
        if "perturb-weight" in kinds:
            perturb_one_weight(policy)
        if "corrupt-weight" in kinds:
            corrupt_first_layer(policy)
        return policy

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Outputs:
        maybe_crash(self.faults, self.crash_marker)
        return self.runner.run_batch(key, dtype, obs, noise)

    def run_episodes(self, key: str, dtype: str, env_id: str, seeds: list[int], stochastic: bool) -> list[EpisodeOutput]:
        maybe_crash(self.faults, self.crash_marker)
        return self.runner.run_episodes(key, dtype, env_id, seeds, stochastic)

    def capture(self, key: str, dtype: str, obs: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        return self.runner.capture(key, dtype, obs)


def describe_runner(runner: Runner) -> dict[str, object]:
    """What an actor reports about itself: its device, threads, the bytes it loaded, its node."""
    node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    return runner.device.as_dict() | {"threads": runner.threads, "policies": runner.loaded(), "node_id": node_id}
