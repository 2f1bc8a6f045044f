"""ReferenceActor: the CPU in float32 with torch, and onnxruntime where a policy came as ONNX."""

from __future__ import annotations

import numpy as np

from actors.policy_actor import describe_runner
from harness.devices import cpu_reference
from harness.inference.runner import Runner
from harness.outputs import EpisodeOutput, Outputs

# ONNX output names (ML-Agents export, harness export) -> the harness's output names.
ONNX_OUTPUTS = {"deterministic_continuous_actions": "action", "deterministic_actions": "action", "logits": "logits"}


class ReferenceActor:
    def __init__(self, policies: list[str], threads: int) -> None:
        self.runner = Runner(cpu_reference(), policies, threads)
        self._sessions: dict[str, object] = {}

    def describe(self) -> dict[str, object]:
        return describe_runner(self.runner)

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Outputs:
        return self.runner.run_batch(key, dtype, obs, noise)

    def run_episodes(self, key: str, dtype: str, env_id: str, seeds: list[int], stochastic: bool) -> list[EpisodeOutput]:
        return self.runner.run_episodes(key, dtype, env_id, seeds, stochastic)

    def capture(self, key: str, dtype: str, obs: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        return self.runner.capture(key, dtype, obs)

    def run_onnx(self, key: str, obs: tuple[np.ndarray, ...]) -> Outputs:
        """onnxruntime on the original file: an implementation independent of the torch rebuild."""
        import onnxruntime as ort

        if key not in self._sessions:
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.runner.threads
            options.inter_op_num_threads = 1
            path = self.runner.float32[key].info.onnx_path
            self._sessions[key] = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        session = self._sessions[key]
        names = [i.name for i in session.get_inputs()]
        wanted = [o.name for o in session.get_outputs() if o.name in ONNX_OUTPUTS]
        values = session.run(wanted, dict(zip(names, obs)))
        return {ONNX_OUTPUTS[name]: np.asarray(v) for name, v in zip(wanted, values)}
