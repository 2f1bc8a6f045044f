"""ReferenceActor: the CPU, computing every batch several ways for the judge: the float64 golden,
float32, and each card's dtype; and onnxruntime on the original file where a policy came as ONNX.
A sweep places a pool of them (harness/cluster/place.py), each computing its share of these."""

from __future__ import annotations

import numpy as np

from actors.policy_actor import BusyClock, describe_runner, produced
from harness.devices import cpu_reference
from harness.envs.spec import EnvSpec
from harness.inference.runner import Described, Runner
from harness.outputs import Busy, EpisodeOutput, Outputs, Produced
from harness.policies import PolicySpec
from harness.policies.onnx_any import OnnxReference, onnx_reference


class ReferenceActor:
    def __init__(self, policies: list[PolicySpec], threads: int) -> None:
        self.runner = Runner(cpu_reference(), policies, threads)
        self._onnx: dict[str, OnnxReference] = {}
        # Seconds per dtype, besides the total: what the golden and the same-dtype runs cost a sweep.
        self.busy = BusyClock()

    def describe(self) -> Described:
        return describe_runner(self.runner)

    def progress(self) -> int:
        """Episode steps played so far, its own and its replays (PolicyActor.progress)."""
        return self.runner.steps

    def busy_time(self) -> Busy:
        return self.busy.read()

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Produced[Outputs]:
        """`dtype` is a card's (float32, float16, bfloat16, float32-tf32, ...) or the golden's float64."""
        with self.busy(dtype):
            return produced(self.runner, self.runner.run_batch(key, dtype, obs, noise))

    def run_episodes(
        self, key: str, dtype: str, env: EnvSpec, seeds: list[int], stochastic: bool, batching: str, honest: bool = False
    ) -> Produced[list[EpisodeOutput]]:
        """`honest`: replayed under the honest-card model, to see where an honest port's
        trajectories part from these (docs/verdicts.md, "Closed-loop returns")."""
        with self.busy(f"episodes {dtype}{' honest replay' if honest else ''}"):
            episodes = self.runner.run_episodes(key, dtype, env, seeds, stochastic, batching, honest)
            return produced(self.runner, episodes)

    def capture(self, key: str, dtype: str, obs: tuple[np.ndarray, ...]) -> Produced[dict[str, np.ndarray]]:
        with self.busy():
            return produced(self.runner, self.runner.capture(key, dtype, obs))

    def compute_seconds(self) -> dict[str, float]:
        return dict(self.busy.by_what)

    def run_onnx(self, key: str, obs: tuple[np.ndarray, ...]) -> Produced[Outputs]:
        """onnxruntime on the original file: an implementation independent of the torch rebuild."""
        with self.busy():
            if key not in self._onnx:
                self._onnx[key] = onnx_reference(self.runner.float32[key].info, self.runner.threads)
            return produced(self.runner, self._onnx[key].run(obs))
