"""Any ONNX policy graph, rebuilt in torch by onnx2torch from the part that computes the head.

Read from the graph, never executed:

    inputs   every float input [batch, n] (n fixed), concatenated in order as PolicyNet passes them
    head     the float tensor that feeds a final ArgMax (discrete), else the graph's only float
             output, else the tensor `--onnx-output` names; `--onnx-output` wins when given
    kind     discrete when the head feeds ArgMax, else `--action-kind discrete|continuous`

SB3's documented export (`OnnxableSB3Policy`) ends in ArgMax(Softmax(logits - logsumexp(logits)))
and returns int64 actions, values and log-probabilities: the head is the raw logits behind the
softmax, the same tensor SB3's `action_net` computes. Only the sub-graph from the inputs to the
head is converted; the rest (value net, sampling) is never rebuilt. Observation preprocessing on
the inputs before the first layer (Sub, Div, Clip by constants) becomes a float32 normalizer when
the graph can be cut there at one tensor. The original file stays the onnxruntime reference
(`onnx_any.onnx_reference`), with the tensor names it needs in `PolicyInfo.onnx_outputs`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch import nn

from harness.errors import first_line
from harness.policies.base import ActionKind, ObsInput, PolicyInfo, PolicyNet
from harness.policies.onnx_model import GraphIndex, OnnxFile

FLOAT = onnx.TensorProto.FLOAT
# Ops that change neither values nor the row they belong to: how an ArgMax reaches the action output.
SHAPE_ONLY = ("Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")
# Observation preprocessing before the first layer, and the layout ops it may sit between.
NORMALIZING = ("Sub", "Div", "Mul", "Add", "Clip")
PREPROCESSING = (*NORMALIZING, "Cast", "Flatten", "Identity", "Concat")
# onnx2torch's converters for these two import torchvision (see `_onnx2torch`).
TORCHVISION_OPS = ("NonMaxSuppression", "RoiAlign")


class GraphError(ValueError):
    """The file is a readable ONNX model that this loader cannot rebuild; the message says why."""


@dataclass(frozen=True)
class _Head:
    name: str
    kind: ActionKind
    why: str  # how it was found, for `detail`
    action: str | None  # the graph output holding ArgMax's deterministic action, if there is one


def load_onnx_graph(path: Path, onnx_file: OnnxFile, onnx_output: str | None, action_kind: ActionKind | None) -> PolicyNet:
    """Rebuild the model read from `path` as a float32 PolicyNet; GraphError for what cannot be."""
    opset = _opset(onnx_file.model)
    try:
        model = onnx.shape_inference.infer_shapes(onnx_file.model)  # the value infos Extractor cuts at, and widths
        graph = GraphIndex(model.graph)
    except Exception as error:  # inference errors, or numpy_helper on a tensor its data does not fill
        raise GraphError(f"malformed ONNX graph ({first_line(error)})") from None
    inputs, obs_sizes = _float_inputs(graph)
    head = _find_head(model.graph, graph, onnx_output, action_kind)
    action_size = _width(model.graph, head.name)
    if action_size is None:
        raise GraphError(
            f"head {head.name!r} is not a float [batch, n] tensor with a fixed n (as far as ONNX shape inference can tell)"
        )
    _matmuls_as_gemm(model.graph, graph)
    extractor = onnx.utils.Extractor(model)
    part = extractor.extract_model(inputs, [head.name]).graph
    _check_operators(part, opset)
    cut = _normalizer_cut(part, graph, model.graph)
    if cut is None:
        normalizer, body = None, _rebuild(extractor, inputs, head.name, obs_sizes)
    else:
        normalizer = _rebuild(extractor, inputs, cut.name, obs_sizes)
        body = _rebuild(extractor, [cut.name], head.name, obs_sizes)
    out_name = "logits" if head.kind == "discrete" else "mu"
    onnx_outputs = [(head.name, out_name)] + ([(head.action, "action")] if head.action else [])
    sizes = "+".join(map(str, obs_sizes))
    info = PolicyInfo(
        name=str(path),
        source="onnx-graph",
        action_kind=head.kind,
        inputs=tuple(ObsInput(name, (size,)) for name, size in zip(inputs, obs_sizes, strict=True)),
        action_size=action_size,
        sha256=onnx_file.sha256,
        onnx_path=str(path),
        detail=f"ONNX graph (opset {opset}, {sizes} -> {out_name} {action_size}, via onnx2torch): head {head.name!r} "
        f"{head.why}",
        obs_normalization=f"in the graph, before the first layer: {', '.join(cut.ops)} (float32)" if cut else "",
        onnx_outputs=tuple(onnx_outputs),
    )
    policy = PolicyNet(info, body, nn.Identity(), normalizer)
    _check_forward(policy)
    return policy


def _opset(model: onnx.ModelProto) -> int:
    """The default-domain opset, refused when it is newer than any onnx2torch converter."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise GraphError("no ai.onnx opset import")
    newest = _newest_opset()
    if opset > newest:
        raise GraphError(f"opset {opset} is newer than onnx2torch converts (opset {newest} at most)")
    return opset


def _float_inputs(graph: GraphIndex) -> tuple[list[str], tuple[int, ...]]:
    if not graph.inputs:
        raise GraphError("the graph has no inputs")
    sizes = []
    for value in graph.inputs:
        tensor = value.type.tensor_type
        dims = tensor.shape.dim
        if tensor.elem_type != FLOAT:
            kind = onnx.TensorProto.DataType.Name(tensor.elem_type)
            raise GraphError(f"input {value.name!r} is {kind}; only FLOAT (float32) observation inputs are supported")
        if len(dims) != 2 or not dims[1].HasField("dim_value"):
            shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
            raise GraphError(f"input {value.name!r} has shape {shape}, expected [batch, n] with a fixed n")
        sizes.append(dims[1].dim_value)
    return [value.name for value in graph.inputs], tuple(sizes)


def _find_head(proto: onnx.GraphProto, graph: GraphIndex, onnx_output: str | None, action_kind: ActionKind | None) -> _Head:
    argmaxes = [node for node in proto.node if node.op_type == "ArgMax"]
    if onnx_output is not None:
        if onnx_output not in graph.producer:
            raise GraphError(
                f"--onnx-output {onnx_output!r} is not a tensor of the graph (outputs: {', '.join(graph.outputs)})"
            )
        name, why = onnx_output, "named by --onnx-output"
        fed = [node for node in argmaxes if _logits(graph, node.input[0]) == onnx_output]
    elif argmaxes:
        if len(argmaxes) > 1:
            names = ", ".join(repr(node.name or node.output[0]) for node in argmaxes)
            raise GraphError(f"{len(argmaxes)} ArgMax nodes ({names}): pass --onnx-output NAME to say which head")
        name, why, fed = _logits(graph, argmaxes[0].input[0]), "feeds ArgMax", argmaxes
    else:
        floats = [value.name for value in proto.output if value.type.tensor_type.elem_type == FLOAT]
        if len(floats) != 1:
            found = f"{len(floats)} float outputs ({', '.join(floats)})" if floats else "no float output"
            raise GraphError(f"{found} and no ArgMax: pass --onnx-output NAME to say which is the head")
        name, why, fed = floats[0], "is the graph's only float output", []
    if fed and action_kind == "continuous":
        raise GraphError(f"--action-kind continuous, but head {name!r} feeds ArgMax: its actions are discrete")
    kind = "discrete" if fed else action_kind
    if kind is None:
        raise GraphError(
            f"the graph does not say whether head {name!r} is discrete or continuous: pass --action-kind discrete|continuous"
        )
    if fed and _attr(fed[0], "axis", 0) not in (1, -1):
        raise GraphError(f"ArgMax {fed[0].name!r} takes axis {_attr(fed[0], 'axis', 0)}, expected the last axis of [batch, n]")
    return _Head(name, kind, why, _action_output(graph, fed[0]) if fed else None)


def _logits(graph: GraphIndex, name: str) -> str:
    """The raw logits behind an ArgMax input: softmax and log-normalization keep every row's
    argmax, and logits (not probabilities) are what Gumbel-max sampling and the sb3-zip loader use."""
    while (node := graph.producer.get(name)) is not None:
        if node.op_type in ("Softmax", "LogSoftmax", "Identity") and _attr(node, "axis", -1) in (1, -1):
            name = node.input[0]
            continue
        lse = graph.producer.get(node.input[1]) if node.op_type == "Sub" else None
        if lse is not None and lse.op_type == "ReduceLogSumExp" and lse.input[0] == node.input[0]:
            name = node.input[0]  # x - logsumexp(x): log-softmax written out
            continue
        break
    return name


def _action_output(graph: GraphIndex, argmax: onnx.NodeProto) -> str | None:
    """The one graph output that ArgMax's result reaches through shape-only ops, if any."""
    reached, frontier = set(), [argmax.output[0]]
    while frontier:
        name = frontier.pop()
        if name in graph.outputs:
            reached.add(name)
        frontier += [out for node in graph.consumers.get(name, []) if node.op_type in SHAPE_ONLY for out in node.output]
    return reached.pop() if len(reached) == 1 else None


def _float_dims(proto: onnx.GraphProto, name: str) -> list[int | None] | None:
    """The shape ONNX inference found for a float tensor (None where a dimension is not fixed);
    None when it found none, or the tensor is not float."""
    value = next((v for v in (*proto.value_info, *proto.output, *proto.input) if v.name == name), None)
    if value is None or value.type.tensor_type.elem_type != FLOAT or not value.type.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def _width(proto: onnx.GraphProto, name: str) -> int | None:
    """n of a float [batch, n] tensor with a fixed n; None for any other."""
    dims = _float_dims(proto, name)
    return dims[1] if dims is not None and len(dims) == 2 else None


def _matmuls_as_gemm(proto: onnx.GraphProto, graph: GraphIndex) -> None:
    """MatMul(x, W) of a [batch, k] x and a constant float [k, n] W becomes Gemm(x, W): the same
    product, and onnx2torch makes a Gemm on constant weights an nn.Linear, the layer that the
    weight faults and the TF32/HF32 emulation (matmul_precision) act on."""
    initializers = {t.name for t in proto.initializer}
    for node in proto.node:
        if node.op_type != "MatMul" or node.input[1] not in initializers:
            continue
        weight, dims = graph.constants[node.input[1]], _float_dims(proto, node.input[0])
        if weight.ndim == 2 and weight.dtype.kind == "f" and dims is not None and len(dims) == 2:
            node.op_type = "Gemm"


def _check_operators(part: onnx.GraphProto, opset: int) -> None:
    """Refuse, before converting, any node of the head's sub-graph onnx2torch has no converter for."""
    _onnx2torch()
    from onnx2torch.node_converters import get_converter

    torchvision = _torchvision_loads()
    for node in part.node:
        where = f"operator {node.op_type} (node {node.name or node.output[0]!r})"
        if node.domain not in ("", "ai.onnx"):
            raise GraphError(f"{where} is in domain {node.domain!r}; onnx2torch converts ai.onnx operators only")
        if node.op_type in TORCHVISION_OPS and not torchvision:
            raise GraphError(f"{where} needs torchvision, which cannot load beside this torch")
        try:
            get_converter(operation_type=node.op_type, version=opset)
        except NotImplementedError:
            raise GraphError(f"{where} has no onnx2torch converter at opset {opset}") from None


@dataclass(frozen=True)
class _Cut:
    name: str  # the one tensor the preprocessing hands to the first layer
    ops: tuple[str, ...]


def _normalizer_cut(part: onnx.GraphProto, graph: GraphIndex, model: onnx.GraphProto) -> _Cut | None:
    """Where observation preprocessing ends, if it does at one [batch, n] tensor before any layer.

    Preprocessing: the nodes, in graph order, whose every computed input is an observation or
    another preprocessing output. A clean cut: exactly one of their tensors is read by the rest.
    """
    computed = {value.name for value in part.input}
    ops, rest = [], []
    for node in part.node:
        data = [name for name in node.input if name and name not in graph.constants]
        if node.op_type in PREPROCESSING and data and all(name in computed for name in data):
            computed.update(node.output)
            ops.append(node.op_type)
        else:
            rest.append(node)
    read_on = {name for node in rest for name in node.input if name in computed}
    if not any(op in NORMALIZING for op in ops) or len(read_on) != 1:
        return None
    (name,) = read_on
    if _width(model, name) is None:
        return None  # not one row of n values per observation: leave it to the body
    return _Cut(name, tuple(ops))


def _rebuild(extractor: onnx.utils.Extractor, inputs: list[str], output: str, obs_sizes: tuple[int, ...]) -> nn.Module:
    """The sub-graph from `inputs` to `output` as a torch module that takes one tensor."""
    try:
        module = _onnx2torch().convert(extractor.extract_model(inputs, [output]))
    except Exception as error:  # a converter refusing an attribute or a dynamic input, in its own words
        raise GraphError(f"onnx2torch cannot convert the graph up to {output!r}: {first_line(error)}") from None
    _follow_the_cast(module)
    return _SplitInputs(module, obs_sizes) if len(inputs) > 1 else module


def _follow_the_cast(module: nn.Module) -> None:
    """Make the graph's Casts to a float type cast to the dtype the module is cast to.

    onnx2torch keeps every tensor constant as a registered buffer or parameter (initializers,
    Constant and ConstantOfShape values; Gemm on constant weights becomes a Linear), so
    `.to(dtype)` reaches them all; Clip and Pad bounds are Python floats, which take the input's
    dtype. What pins a dtype is Cast: SB3's export starts with Cast(to=float32), which would turn a
    float16 body back to float32 (or a float64 golden down to float32).
    """
    _onnx2torch()
    from onnx2torch.node_converters.cast import OnnxCast

    for name, child in list(module.named_children()):
        if isinstance(child, OnnxCast) and child.torch_dtype.is_floating_point:
            setattr(module, name, _FloatCast())


class _FloatCast(nn.Module):
    """An ONNX Cast to a float type: to whatever float dtype this module was last cast to."""

    dtype_of: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        # The target dtype, held by a buffer so that cast_policy's .to(dtype) and .double() move it.
        self.dtype_of: torch.Tensor
        self.register_buffer("dtype_of", torch.zeros((), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype_of.dtype)


class _SplitInputs(nn.Module):
    """PolicyNet's concatenated observation, split back into the graph's inputs."""

    def __init__(self, graph: nn.Module, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.graph = graph
        self.sizes = list(sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.graph(*torch.split(x, self.sizes, dim=-1))


def _check_forward(policy: PolicyNet) -> None:
    """Two rows through the rebuild: a graph that fixes its batch, or whose head is not [batch, n],
    is refused at load rather than on the first sweep."""
    obs = [torch.zeros(2, n) for n in policy.info.obs_sizes]
    try:
        with torch.inference_mode():
            out = policy(*obs)
    except Exception as error:  # whatever the rebuilt ops raise on a batch of 2
        raise GraphError(f"the rebuilt graph fails on a batch of 2 rows ({first_line(error)})") from None
    if tuple(out.shape) != (2, policy.info.action_size):
        raise GraphError(
            f"the rebuilt head gives shape {tuple(out.shape)} for 2 rows, expected (2, {policy.info.action_size})"
        )


def _attr(node: onnx.NodeProto, name: str, default: object) -> object:
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


@functools.cache
def _torchvision_loads() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # ImportError where absent; RuntimeError where it was built for another torch
        return False
    return True


@functools.cache
def _onnx2torch() -> types.ModuleType:
    """onnx2torch, imported once, also where torchvision cannot load.

    onnx2torch imports torchvision at import time, only for its NonMaxSuppression and RoiAlign
    converters. Beside a torch it was not built for (PyPI's torchvision 0.28.0 next to a local
    CPU torch 2.13.0 wheel), `import torchvision` raises "operator torchvision::nms does not exist"
    and takes all of onnx2torch down. There an inert stand-in is in sys.modules while onnx2torch
    loads (and only then); graphs using those two operators are refused before conversion
    (`_check_operators`). Where torchvision loads, it is used untouched.
    """
    try:
        if _torchvision_loads():
            import onnx2torch

            return onnx2torch
        with _torchvision_stand_in():
            import onnx2torch
    except ModuleNotFoundError as error:
        if error.name != "onnx2torch":
            raise
        # Not a dependency: its metadata would pull torchvision and replace torch (pyproject.toml).
        raise GraphError("onnx2torch is not installed; pip install --no-deps 'onnx2torch>=1.5,<2'") from None
    return onnx2torch


@contextlib.contextmanager
def _torchvision_stand_in() -> Iterator[None]:
    def unavailable(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("torchvision cannot load beside this torch")

    package, ops = types.ModuleType("torchvision"), types.ModuleType("torchvision.ops")
    package.ops = ops  # type: ignore[attr-defined]
    # What onnx2torch's nms.py and roialign.py take from it; nothing else, so that code walking
    # sys.modules (inspect, torch.library) sees an ordinary empty module.
    ops.roi_align = ops.nms = ops.box_convert = unavailable  # type: ignore[attr-defined]
    stand_ins = {"torchvision": package, "torchvision.ops": ops}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)


def _newest_opset() -> int:
    # onnx2torch has no public list of what it converts; its registry is the one source.
    _onnx2torch()
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY

    return max(op.version for op in _CONVERTER_REGISTRY if op.domain == "")
