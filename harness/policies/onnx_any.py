"""`*.onnx`: an ML-Agents export (its known layout, read node by node), else any graph (onnx2torch);
and onnxruntime on the original file, the reference every rebuild is checked against.

onnx is imported where a graph is read, not with this module: the registry imports every format,
so every actor and the driver would pay onnx's import (1.5 s of CPU, most of it ml_dtypes) for
policies that are no ONNX at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, assert_never

import numpy as np

from harness.errors import PolicyLoadError
from harness.policies.base import ActionKind, PolicyInfo, PolicyNet
from harness.policies.loader import Peek, PolicyFormat, PolicySpec

if TYPE_CHECKING:
    import onnx
    import onnxruntime


class Onnx(PolicyFormat):
    name = "onnx"
    suffixes = (".onnx",)
    what = "a serialized ONNX ModelProto (it starts with its ir_version field)"
    # protobuf writes fields in number order, and ModelProto's field 1, ir_version, is a varint:
    # tag byte 0x08. onnx.save and every exporter write it.
    MAGIC = b"\x08"

    @classmethod
    def claims(cls, peek: Peek) -> bool:
        return peek.head.startswith(cls.MAGIC)

    @classmethod
    def load(cls, path: Path, spec: PolicySpec) -> PolicyNet:
        return load_onnx(path, spec.onnx_output, spec.action_kind)


def load_onnx(path: Path, onnx_output: str | None, action_kind: ActionKind | None) -> PolicyNet:
    """An ML-Agents export (it has a `version_number` output, and its layout says the head and
    the action kind, so `onnx_output` and `action_kind` are not needed), else any graph."""
    from harness.policies.onnx_model import read_model

    onnx_file = read_model(path)
    if _is_mlagents(onnx_file.model):
        from harness.policies.mlagents_onnx import load_mlagents_onnx

        return load_mlagents_onnx(path, onnx_file)
    from harness.policies.onnx_graph import GraphError, load_onnx_graph

    try:
        return load_onnx_graph(path, onnx_file, onnx_output, action_kind)
    except GraphError as error:
        raise PolicyLoadError(path, str(error)) from None


@dataclass
class OnnxReference:
    """onnxruntime on one policy's original file, with outputs under the harness's names."""

    session: onnxruntime.InferenceSession
    inputs: list[str]
    dtypes: list[np.dtype]  # of each input, as the graph declares it
    outputs: dict[str, str]  # graph tensor -> "logits", "mu", "action" or "memory"; several to one name: side by side
    batch: int | None  # the batch size the graph's inputs fix; None: any
    action_kind: ActionKind
    memory: tuple[str, str] | None = None  # a recurrent graph's (state input, state output): PolicyInfo.onnx_memory
    hidden: int = 0  # the memory's [h | c] halves' width
    observations: int = 0  # a batch's observation arrays, before its episode starts

    def run(self, obs: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        if not self.outputs:  # an ML-Agents v2 export: no deterministic output to compare
            return {}
        if self.memory is not None:
            return self._sequence(obs, self.memory)
        rows = len(obs[0])
        # A graph that fixes its batch (SB3's recipe: 1) runs as exported, a batch of that size at a time.
        step = self.batch or rows
        if rows % step:
            raise ValueError(f"the graph takes batches of exactly {step} rows, got {rows}")
        names = list(self.outputs)
        feed = _as_declared(obs, self.dtypes)
        parts = [
            self.session.run(names, {n: x[i : i + step] for n, x in zip(self.inputs, feed, strict=True)})
            for i in range(0, rows, step)
        ]
        tensors = {name: np.concatenate([part[k] for part in parts]) for k, name in enumerate(names)}
        return self._actions(self._named(tensors), rows)

    def _named(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's tensors under the harness's names. ML-Agents' branches each mask their own
        logits: the harness's head holds them side by side."""
        return {
            ours: np.concatenate([tensors[name] for name in self.outputs if self.outputs[name] == ours], axis=-1)
            for ours in dict.fromkeys(self.outputs.values())
        }

    def _actions(self, values: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        if "action" in values:
            match self.action_kind:
                case "discrete":
                    values["action"] = values["action"].reshape(rows).astype(np.int64)
                case "multi_discrete":
                    values["action"] = values["action"].reshape(rows, -1).astype(np.int64)
                case "continuous":
                    pass
                case _:
                    assert_never(self.action_kind)
        return values

    def _sequence(self, arrays: tuple[np.ndarray, ...], memory: tuple[str, str]) -> dict[str, np.ndarray]:
        """A graph with a memory steps the batch as one sequence, a row at a time, as the harness's
        recurrent policy does (harness/inference/forward.py): the memory input takes the memory
        output of the step before, zeros where the row's episode starts (`episode_start`, the
        batch's array after the observations). The memory after each step is compared as the
        harness's state: its [h | c] halves are `state_h` and `state_c`, (rows, 1, hidden)."""
        memory_in, memory_out = memory
        given = [(name, dtype) for name, dtype in zip(self.inputs, self.dtypes, strict=True) if name != memory_in]
        n_obs = self.observations
        starts, others = arrays[n_obs], [*arrays[:n_obs], *arrays[n_obs + 1 :]]  # the observations, then any masks
        feed = _as_declared(others, [dtype for _, dtype in given])
        names = list(self.outputs)
        out = names.index(memory_out)
        zeros = np.zeros((1, 1, 2 * self.hidden), np.float32)
        state, steps = zeros, []
        for t in range(len(starts)):
            rows = {name: x[t : t + 1] for (name, _), x in zip(given, feed, strict=True)}
            step = self.session.run(names, {**rows, memory_in: zeros if starts[t] else state})
            state = step[out]
            steps.append(step)
        values = self._named({name: np.concatenate([step[k] for step in steps]) for k, name in enumerate(names)})
        both = values.pop(self.outputs[memory_out])
        values["state_h"], values["state_c"] = both[:, :, : self.hidden], both[:, :, self.hidden :]
        return self._actions(values, len(starts))


def _as_declared(arrays: list[np.ndarray] | tuple[np.ndarray, ...], dtypes: list[np.dtype]) -> list[np.ndarray]:
    """A batch's masks are bool; a graph may take them as numbers (ML-Agents' action_masks: 1 where legal)."""
    return [x.astype(dtype) if x.dtype == np.bool_ else x for x, dtype in zip(arrays, dtypes, strict=True)]


def onnx_reference(info: PolicyInfo, threads: int) -> OnnxReference:
    """onnxruntime on `info.onnx_path`: the graph as exported, nodes and weights untouched.

    Only the list of graph outputs may grow: a head that is not an output (the logits before an
    ArgMax) is added as one, so onnxruntime returns the tensor the torch rebuild computes.
    """
    import onnx
    import onnxruntime

    from harness.policies.onnx_model import GraphIndex, read_model

    if info.onnx_path is None:
        raise ValueError(f"{info.name} did not come as ONNX: there is no onnxruntime reference")
    model = read_model(Path(info.onnx_path)).model
    have = [value.name for value in model.graph.output]
    outputs = dict(info.onnx_outputs)
    for name in outputs:
        if name not in have:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    inputs = GraphIndex(model.graph).inputs
    first = inputs[0].type.tensor_type.shape.dim[0]
    batch = first.dim_value if first.HasField("dim_value") else None
    dtypes = [np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)) for value in inputs]
    names = [value.name for value in inputs]
    reference = OnnxReference(session, names, dtypes, outputs, batch, info.action_kind)
    if info.memory is not None:
        reference.memory, reference.hidden, reference.observations = info.onnx_memory, info.memory.hidden, len(info.inputs)
    return reference


def _is_mlagents(model: onnx.ModelProto) -> bool:
    return any(value.name == "version_number" for value in model.graph.output)
