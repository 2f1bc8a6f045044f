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

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data

from harness.errors import PolicyLoadError
from harness.files import read_whole, sha256_of

# The .onnx and its external data together. They are read into memory once, so that the bytes
# hashed are the bytes parsed; the largest real policies are a few hundred MB.
MAX_ONNX_BYTES = 1024 * 1024 * 1024
# What a graph may build from its constants, in elements, every such tensor together: one per byte
# read (room for copies of every weight: Transpose, Cast, dequantize) plus this, far above the small
# tensors real policies build (zero states, position ranges); 256 MiB of float32. A bomb builds
# billions from a few hundred bytes, and onnx2torch and onnxruntime would allocate them all.
BUILD_BUDGET = 64 * 1024 * 1024
# A shape or a Range bound is a handful of values: only constants this small are read as one.
SHAPE_VALUES = 64
# The nodes that build a tensor from a shape argument, and which input it is. Reshape is not one:
# it keeps its input's elements.
SHAPE_ARGUMENT = {"ConstantOfShape": 0, "Expand": 1, "Tile": 1}


@dataclass(frozen=True)
class OnnxFile:
    model: onnx.ModelProto  # external data filled in: no tensor refers to a file any more
    sha256: str  # of the .onnx's bytes, then each external data file's, in the order of their names


def read_model(path: Path) -> OnnxFile:
    """The model in `path` with its external data, checked for bombs; PolicyLoadError if unusable."""
    content = read_whole(path, MAX_ONNX_BYTES, "an ONNX model", PolicyLoadError)
    try:
        model = onnx.load_model_from_string(content)
    except Exception as error:  # protobuf raises its own DecodeError, among others
        raise PolicyLoadError(path, f"not an ONNX model ({type(error).__name__})") from None
    external = _load_external_data(path, model, MAX_ONNX_BYTES - len(content))
    _check_built_sizes(path, model, len(content) + sum(map(len, external)))
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
            files[location] = read_whole(path.parent / location, budget, "an ONNX model's external data", PolicyLoadError)
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


def _check_built_sizes(path: Path, model: onnx.ModelProto, n_bytes: int) -> None:
    """Refuse, before anything allocates, a graph whose tensors built from constants outgrow
    `n_bytes` + BUILD_BUDGET elements: each tensor whose shape ONNX inference fixes, or that a
    ConstantOfShape, Expand, Tile or Range builds from constant arguments, counted once."""
    bound, built = n_bytes + BUILD_BUDGET, 0
    inferred, constants = _inferred_shapes(model), _small_constants(model)
    for node in _nodes(model):
        if node.op_type == "Constant" and not any(a.name == "sparse_value" for a in node.attribute):
            continue  # its value is in the file; a sparse one is made dense
        least = _least_shape(node, constants)
        for index, name in enumerate(node.output):
            shape = inferred.get(name)
            if index == 0 and least is not None and (shape is None or math.prod(least) > math.prod(shape)):
                shape = least
            if shape is None:
                continue
            elements = math.prod(shape)
            if built + elements > bound:
                where = f"node {node.name or name!r} ({node.op_type}) builds a {shape} tensor ({elements} elements)"
                before = f", after {built} built before it" if built else ""
                limit = f"the {bound} elements a graph may build from constants ({n_bytes} bytes read + {BUILD_BUDGET})"
                raise PolicyLoadError(path, f"{where}{before}: over {limit}")
            built += elements


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """The shapes ONNX inference fixes, every dimension known. Inference reads shape arguments
    (data_prop: through Concat, Mul, ... of constants too) but never builds a tensor. It runs on
    a copy whose tensors too large to be a shape argument keep only their type and dims, as it
    serializes what it is given: a tenth of the time on a 268 MB model."""
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    for tensor in _stored_tensors(skeleton):
        if math.prod(tensor.dims) > SHAPE_VALUES:
            tensor.CopyFrom(onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims))
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception:  # a graph it cannot read: the loaders say what is wrong; the shape arguments still count
        return {}
    shapes = {}
    for graph in _graphs(inferred):
        for value in (*graph.value_info, *graph.output):
            tensor = value.type.tensor_type
            if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
                shapes[value.name] = [d.dim_value for d in tensor.shape.dim]
    return shapes


def _small_constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The constants small enough to be a shape argument: initializers and Constant values."""
    tensors = {t.name: t for graph in _graphs(model) for t in graph.initializer}
    values: dict[str, np.ndarray] = {}
    for node in _nodes(model):
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.output:
            attribute = node.attribute[0]
            if attribute.name == "value":
                tensors[node.output[0]] = attribute.t
            elif attribute.name in ("value_int", "value_ints", "value_float", "value_floats"):
                values[node.output[0]] = np.asarray(onnx.helper.get_attribute_value(attribute))
    for name, tensor in tensors.items():
        if math.prod(tensor.dims) <= SHAPE_VALUES:
            try:
                values[name] = to_array(tensor)
            except ValueError:
                continue  # the loaders refuse it
    return values


def _least_shape(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> list[int] | None:
    """The shape a node builds, read from its constant arguments: exact for ConstantOfShape and
    Range, the least it can be for Expand and Tile (their input may add to it); None for other
    nodes, or where an argument is computed."""
    arguments = [constants.get(name) for name in node.input]
    if node.op_type in SHAPE_ARGUMENT:
        position = SHAPE_ARGUMENT[node.op_type]
        dims = arguments[position] if position < len(arguments) else None
        if dims is None or dims.ndim != 1 or dims.dtype.kind not in "iu" or np.any(dims < 0):
            return None
        return [int(d) for d in dims]
    scalars = [value for value in arguments if value is not None and value.size == 1 and value.dtype.kind in "iuf"]
    if node.op_type == "Range" and len(scalars) == 3:
        start, limit, delta = (float(value.reshape(())) for value in scalars)
        if delta == 0 or not all(math.isfinite(x) for x in (start, limit, delta)):
            return None  # an error when it runs, not a tensor
        return [max(math.ceil((limit - start) / delta), 0)]
    return None


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


def to_array(tensor: onnx.TensorProto) -> np.ndarray:
    """A stored tensor's value; ValueError for one whose data does not fill its shape, and for
    a data type numpy has none for (numpy_helper raises KeyError or TypeError there)."""
    try:
        return numpy_helper.to_array(tensor)
    except (KeyError, TypeError):
        raise ValueError(f"tensor {tensor.name!r} has data type {tensor.data_type}, which has no numpy type") from None


class GraphIndex:
    """Name lookups over one ONNX graph: constants, producers and consumers of each value.
    Raises ValueError for a tensor whose value cannot be read (`to_array`)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.inputs = [value for value in graph.input if value.name not in {t.name for t in graph.initializer}]
        self.outputs = [value.name for value in graph.output]
        self.constants: dict[str, np.ndarray] = {t.name: to_array(t) for t in graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = to_array(node.attribute[0].t)
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
