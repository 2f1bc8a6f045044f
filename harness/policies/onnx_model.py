"""An ONNX file read, never executed: the model, and its graph indexed by value name (inputs,
outputs, constants, and which node produces and which consume each value). The ML-Agents loader
and the any-graph loader both read graphs through it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from harness.errors import PolicyLoadError


def read_model(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(path)  # reads external weight files beside it, if the model has any
    except Exception as error:  # protobuf raises its own DecodeError, among others
        raise PolicyLoadError(path, f"not an ONNX model ({type(error).__name__})") from None


class GraphIndex:
    """Name lookups over one ONNX graph: constants, producers and consumers of each value.
    Raises ValueError for a tensor whose data does not fill its shape."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.inputs = [value for value in graph.input if value.name not in {t.name for t in graph.initializer}]
        self.outputs = [value.name for value in graph.output]
        self.constants: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
