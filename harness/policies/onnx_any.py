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
    outputs: dict[str, str]  # graph tensor -> "logits", "mu" or "action"; several to one name: side by side
    batch: int | None  # the batch size the graph's inputs fix; None: any
    action_kind: ActionKind

    def run(self, obs: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        if not self.outputs:  # an ML-Agents v2 export: no deterministic output to compare
            return {}
        rows = len(obs[0])
        # A graph that fixes its batch (SB3's recipe: 1) runs as exported, a batch of that size at a time.
        step = self.batch or rows
        if rows % step:
            raise ValueError(f"the graph takes batches of exactly {step} rows, got {rows}")
        names = list(self.outputs)
        # A batch's masks are bool; a graph may take them as numbers (ML-Agents' action_masks: 1 where legal).
        feed = [x.astype(dtype) if x.dtype == np.bool_ else x for x, dtype in zip(obs, self.dtypes, strict=True)]
        parts = [
            self.session.run(names, {n: x[i : i + step] for n, x in zip(self.inputs, feed, strict=True)})
            for i in range(0, rows, step)
        ]
        tensors = {name: np.concatenate([part[k] for part in parts]) for k, name in enumerate(names)}
        # ML-Agents' branches each mask their own logits: the harness's head holds them side by side.
        values = {
            ours: np.concatenate([tensors[name] for name in names if self.outputs[name] == ours], axis=-1)
            for ours in dict.fromkeys(self.outputs.values())
        }
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
    return OnnxReference(session, [value.name for value in inputs], dtypes, outputs, batch, info.action_kind)


def _is_mlagents(model: onnx.ModelProto) -> bool:
    return any(value.name == "version_number" for value in model.graph.output)
