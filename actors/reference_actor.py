"""ReferenceActor: the CPU in float32 with torch, and onnxruntime where a policy came as ONNX."""

from __future__ import annotations

import harness.devices  # noqa: F401  (sets TORCH_DEVICE_BACKEND_AUTOLOAD before torch loads)

import numpy as np

from actors.runner import Runner
from harness.devices import cpu_reference

# ONNX output names (ML-Agents export, harness export) -> the harness's output names.
ONNX_OUTPUTS = {"deterministic_continuous_actions": "action", "deterministic_actions": "action", "logits": "logits"}


class ReferenceActor(Runner):
    def __init__(self, policies: list[str], threads: int) -> None:
        super().__init__(cpu_reference(), policies, threads)
        self._sessions: dict[str, object] = {}

    def run_onnx(self, key: str, obs: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        """onnxruntime on the original file: an implementation independent of the torch rebuild."""
        import onnxruntime as ort

        if key not in self._sessions:
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            path = self._float32[key].info.onnx_path
            self._sessions[key] = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        session = self._sessions[key]
        names = [i.name for i in session.get_inputs()]
        wanted = [o.name for o in session.get_outputs() if o.name in ONNX_OUTPUTS]
        values = session.run(wanted, dict(zip(names, obs)))
        return {ONNX_OUTPUTS[name]: np.asarray(v) for name, v in zip(wanted, values)}
