"""An ONNX file read, never executed: the model with its external data, the sha256 of the bytes
it was built from, and its graph indexed by value name (inputs, outputs, constants, and which node
produces and which consume each value). The ML-Agents loader, the any-graph loader and the
onnxruntime reference all read models through it.

External data (weights kept in files beside the .onnx, `onnx.save(..., save_as_external_data=True)`)
is read here, not by onnx: from the model's folder only, each file once, into the tensors. Its
location is checked by name, not resolved, so that a file outside the folder is never opened; the
files may be symlinks (the Hugging Face cache keeps every file as one).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data

from harness.errors import PolicyLoadError
from harness.policies.file_bytes import read_whole, sha256_of

# The .onnx and its external data together. They are read into memory once, so that the bytes
# hashed are the bytes parsed; the largest real policies are a few hundred MB.
MAX_ONNX_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True)
class OnnxFile:
    model: onnx.ModelProto  # external data filled in: no tensor refers to a file any more
    sha256: str  # of the .onnx's bytes, then each external data file's, in the order of their names


def read_model(path: Path) -> OnnxFile:
    content = read_whole(path, MAX_ONNX_BYTES, "an ONNX model")
    try:
        model = onnx.load_model_from_string(content)
    except Exception as error:  # protobuf raises its own DecodeError, among others
        raise PolicyLoadError(path, f"not an ONNX model ({type(error).__name__})") from None
    external = _load_external_data(path, model, MAX_ONNX_BYTES - len(content))
    return OnnxFile(model, sha256_of(content, *external))


def _load_external_data(path: Path, model: onnx.ModelProto, budget: int) -> list[bytes]:
    """Fill in every tensor whose data is in a file beside the model, each file read once; the
    files' bytes, in the order of their names. Anything outside the model's folder is refused
    before a file is opened."""
    files: dict[str, bytes] = {}
    for tensor in _stored_tensors(model):
        if not uses_external_data(tensor):
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        location = entries.get("location", "")
        name = PurePosixPath(location)
        if name.is_absolute() or ".." in name.parts:
            where = f"external data of tensor {tensor.name!r} is at {location!r}"
            raise PolicyLoadError(path, f"{where}, outside the model's folder: refused, not opened")
        if location not in files:
            files[location] = read_whole(path.parent / location, budget, "an ONNX model's external data")
            budget -= len(files[location])
        tensor.raw_data = _extent(path, tensor.name, entries, files[location])
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return [files[location] for location in sorted(files)]


def _extent(path: Path, tensor: str, entries: dict[str, str], data: bytes) -> bytes:
    """The bytes `offset` and `length` pick from an external file; all of it where they are unset."""
    try:
        offset = int(entries.get("offset", 0))
        length = int(entries.get("length", len(data) - offset))
    except ValueError:
        shown = {key: entries.get(key) for key in ("offset", "length")}
        raise PolicyLoadError(path, f"external data of tensor {tensor!r} has offset and length {shown}") from None
    if offset < 0 or length < 0 or offset + length > len(data):
        location = entries.get("location", "")
        extent = f"bytes {offset} to {offset + length} of {location}"
        raise PolicyLoadError(path, f"external data of tensor {tensor!r} is {extent}, which holds {len(data)}")
    return data[offset : offset + length]


def _stored_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor the file holds: initializers, and node attributes (Constant's value, ...)."""
    for graph in _graphs(model):
        yield from graph.initializer
    for node in _nodes(model):
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors


def _graphs(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    """The main graph and every subgraph (If branches, Loop and Scan bodies), in functions too."""
    return [model.graph, *_subgraphs(model.graph.node), *(g for f in model.functions for g in _subgraphs(f.node))]


def _subgraphs(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.GraphProto]:
    for node in nodes:
        for attribute in node.attribute:
            for graph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                yield graph
                yield from _subgraphs(graph.node)


def _nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node of every graph and function."""
    for graph in _graphs(model):
        yield from graph.node
    for function in model.functions:
        yield from function.node


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
