"""PolicyActor: one per card. Runs the work it is sent and returns numpy; never judges."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import ray

from harness.devices import Kind, open_card, ray_card_id
from harness.envs.spec import EnvSpec
from harness.inference.faults import Fault, inject, maybe_crash
from harness.inference.runner import Runner
from harness.outputs import EpisodeOutput, Outputs
from harness.policies import PolicySpec


class PolicyActor:
    def __init__(
        self,
        kind: Kind,
        position: int,
        policies: list[PolicySpec],
        threads: int,
        precision: str,
        faults: list[Fault],
        crash_marker: str,
    ) -> None:
        self.position = position
        self.faults = faults
        self.crash_marker = Path(crash_marker)
        card = open_card(kind, ray_card_id(kind, position), precision)
        self.runner = Runner(card, policies, threads, prepare=partial(inject, faults=faults))

    def describe(self) -> dict[str, object]:
        return describe_runner(self.runner) | {"position": self.position, "faults": [str(f) for f in self.faults]}

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Outputs:
        maybe_crash(self.faults, self.crash_marker)
        return self.runner.run_batch(key, dtype, obs, noise)

    def run_episodes(
        self, key: str, dtype: str, env: EnvSpec, seeds: list[int], stochastic: bool, batching: str
    ) -> list[EpisodeOutput]:
        maybe_crash(self.faults, self.crash_marker)
        return self.runner.run_episodes(key, dtype, env, seeds, stochastic, batching)

    def capture(self, key: str, dtype: str, obs: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        return self.runner.capture(key, dtype, obs)


def describe_runner(runner: Runner) -> dict[str, object]:
    """What an actor reports about itself: its device, threads, the bytes it loaded, its node."""
    node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    return runner.device.as_dict() | {"threads": runner.threads, "policies": runner.loaded(), "node_id": node_id}
