"""ML-Agents ONNX exports (model version 2 or 3), rebuilt as a torch module from the initializers.

The graph is read by walking it from the inputs, the way ML-Agents' exporter lays it out:

    obs_i -> Sub(running_mean) -> Div(std) -> Clip(-5, 5)      one chain per input (or none)
          -> Concat -> [Gemm -> Sigmoid -> Mul] x n -> Gemm (mu)
    deterministic_continuous_actions = Clip(mu, -3, 3) / 3

with a memory (`recurrent_in` [batch, 1, memory_size] holding an LSTM's [h | c]), between the
Swish layers and the last Gemm:

    recurrent_in -> Transpose(1, 0, 2) -> Slice [0, m/2) = h0, Slice [m/2, m) = c0 (axis 2)
    encoding -> Unsqueeze(0) -> LSTM(h0, c0) -> Y -> Squeeze(0, 1) -> the last Gemm
                                             -> Concat(Y_h, Y_c) -> Transpose(1, 0, 2) = recurrent_out

one ONNX LSTM step (gates i, o, f, c; read into torch's i, f, g, o), the state carried by the
caller from one step's recurrent_out to the next step's recurrent_in;

or, for one discrete branch, the last Gemm's logits masked by `action_masks` as
MultiCategoricalDistribution._mask_branch does (logits * mask - 1e8 * (1 - mask): for masks of 0
and 1, the harness's masked policy, `PolicyNet.masked_scores`), `deterministic_discrete_actions`
their argmax. For several branches (`discrete_action_output_shape` their sizes), the encoding
feeds a Gemm per branch, each masked by its own Slice of `action_masks`: read as one
multi-discrete head, the Gemms stacked in the order of their mask columns, the action the argmax
of each branch. The masked logits (side by side) and the action are what onnxruntime is compared on.

Anything else is refused with one line naming the file and what was found instead: a partial
match rebuilt into a wrong module would make every later comparison meaningless. The file
itself stays the onnxruntime reference (`PolicyInfo.onnx_path`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import torch

from harness.errors import PolicyLoadError
from harness.policies.base import NORMALIZER_CLAMP, Normalizer, PolicyNet, branch_starts
from harness.policies.mlagents import ACTION_CLIP, LayoutError, LstmWeights, MLAgentsWeights
from harness.policies.onnx_model import GraphIndex, OnnxFile, read_model

VERSIONS = (2, 3)  # ModelApiVersion.MLAgents1_0 and MLAgents2_0
DETERMINISTIC = "deterministic_continuous_actions"
# What an ML-Agents export carries besides observations and actions: an LSTM's memory ([h | c] in
# `recurrent_in`/`recurrent_out`, `memory_size` wide), and what discrete action branches come with
# (their `action_masks`, their sizes, their argmax).
RECURRENT_IN = "recurrent_in"
RECURRENT_OUT = "recurrent_out"
MEMORY_OUTPUT = "memory"  # recurrent_out's role in onnx_outputs: onnx_any.OnnxReference feeds it back to recurrent_in
# ONNX's LSTM stacks its gates' rows as (input, output, forget, cell); torch's as (input, forget,
# cell, output): torch's k-th gate is ONNX's ONNX_TO_TORCH_GATES[k]-th.
ONNX_TO_TORCH_GATES = (0, 2, 3, 1)
ACTION_MASKS = "action_masks"
DISCRETE_SHAPE = "discrete_action_output_shape"
DISCRETE_DETERMINISTIC = "deterministic_discrete_actions"


def load_mlagents_onnx(path: Path, onnx_file: OnnxFile | None = None) -> PolicyNet:
    onnx_file = onnx_file if onnx_file is not None else read_model(path)
    model = onnx_file.model
    try:
        graph = _Graph(model.graph)
    except ValueError as error:  # numpy_helper on a tensor whose data does not fill its shape
        raise PolicyLoadError(path, f"malformed ONNX tensor ({error})") from None
    try:
        version, weights, onnx_outputs = _read(graph)
    except LayoutError as error:
        raise PolicyLoadError(path, f"not an ML-Agents export this reader reads: {error}") from None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), "?")
    producer = "harness" if model.producer_name == "harness" else "ML-Agents"
    detail = f"{producer} export v{version}, opset {opset}, {weights.describe()}"
    # A harness export of a synthetic policy keeps its label (and its detail up front).
    props = {prop.key: prop.value for prop in model.metadata_props}
    synthetic = props.get("harness.synthetic") == "true"
    if synthetic:
        detail = f"{props.get('harness.detail', 'SYNTHETIC weights')}; {detail}"
    return weights.to_policy(
        name=str(path),
        source="mlagents-onnx",
        sha256=onnx_file.sha256,
        detail=detail,
        synthetic=synthetic,
        onnx_path=str(path),
        onnx_outputs=onnx_outputs,
        onnx_memory=(RECURRENT_IN, RECURRENT_OUT) if weights.lstm is not None else None,
    )


class _Graph(GraphIndex):
    """The index, with the lookups the ML-Agents layout is read by: each raises LayoutError."""

    def constant(self, name: str, what: str) -> np.ndarray:
        if name not in self.constants:
            raise LayoutError(f"{what} {name!r} is computed, expected a constant")
        return self.constants[name]

    def only_consumer(self, name: str, op_types: tuple[str, ...]) -> onnx.NodeProto:
        found = self.consumers.get(name, [])
        if len(found) != 1 or found[0].op_type not in op_types:
            ops = [node.op_type for node in found]
            raise LayoutError(f"{name!r} feeds {ops}, expected one {' or '.join(op_types)}")
        return found[0]

    def clip_bounds(self, node: onnx.NodeProto) -> tuple[float, float]:
        """Clip keeps its bounds in attributes before opset 11 and in inputs from then on."""
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        bounds = []
        for position, key, unbounded in ((1, "min", -np.inf), (2, "max", np.inf)):
            if key in attrs:
                bounds.append(float(attrs[key]))
            elif len(node.input) > position and node.input[position]:
                bounds.append(float(self.constant(node.input[position], f"Clip {key}")))
            else:
                bounds.append(unbounded)
        return bounds[0], bounds[1]


def _read(graph: _Graph) -> tuple[int, MLAgentsWeights, tuple[tuple[str, str], ...]]:
    """The version, the weights, and the graph tensors onnxruntime is compared on (by the harness's names)."""
    version = _version(graph)
    _unread(graph)
    discrete = DISCRETE_DETERMINISTIC in graph.outputs
    if not discrete and DETERMINISTIC not in graph.outputs and "continuous_actions" not in graph.outputs:
        raise LayoutError(f"no action output (outputs: {graph.outputs})")
    obs_sizes = _obs_sizes(graph)
    x, normalizer = _encoder(graph, obs_sizes)
    branches = tuple(int(n) for n in _constant_of(graph, DISCRETE_SHAPE))
    several = discrete and len(branches) > 1
    layers: list[tuple[torch.Tensor, torch.Tensor]] = []
    recurrent = RECURRENT_IN in [value.name for value in graph.inputs]
    lstm: LstmWeights | None = None
    branched = False
    while True:
        if several and len(graph.consumers.get(x, [])) > 1:  # the encoding, feeding a Gemm per branch
            branched = True
            break
        # With a memory, the Swish layers end where their output goes into the LSTM's sequence.
        gemm = graph.only_consumer(x, ("Gemm", "Unsqueeze") if recurrent and lstm is None else ("Gemm",))
        if gemm.op_type == "Unsqueeze":
            lstm, x = _memory(graph, gemm)
            continue
        weight_bias = _gemm(graph, gemm)
        swish = _swish(graph, gemm.output[0])
        if swish is None:
            break
        layers.append(weight_bias)
        x = swish
    if recurrent and lstm is None:
        raise LayoutError(f"{RECURRENT_IN} is an input, but the Swish layers feed no LSTM")
    # The memory after the step, which the reference feeds back (onnx_any.OnnxReference).
    state = ((RECURRENT_OUT, MEMORY_OUTPUT),) if lstm is not None else ()
    if branched:
        head, masked = _branches(graph, x, branches)
        weights = MLAgentsWeights(obs_sizes, normalizer, layers, head, None, None, discrete=True, branches=branches, lstm=lstm)
        return version, weights, (*((name, "logits") for name in masked), (DISCRETE_DETERMINISTIC, "action"), *state)
    mu = gemm.output[0]
    if discrete:
        logits = _masked_logits(graph, mu, weight_bias[0].shape[0])
        weights = MLAgentsWeights(obs_sizes, normalizer, layers, weight_bias, None, None, discrete=True, lstm=lstm)
        return version, weights, ((logits, "logits"), (DISCRETE_DETERMINISTIC, "action"), *state)
    log_sigma = _log_sigma(graph)
    weights = MLAgentsWeights(obs_sizes, normalizer, layers, weight_bias, log_sigma, _action_clip(graph, mu), lstm=lstm)
    # A version 2 export has no deterministic output: nothing for onnxruntime to compare.
    return version, weights, (((DETERMINISTIC, "action"),) if DETERMINISTIC in graph.outputs else ()) + state


def _memory(graph: _Graph, unsqueeze: onnx.NodeProto) -> tuple[LstmWeights, str]:
    """The LSTM step the encoding goes into (a sequence of one step: Unsqueeze on axis 0), its
    state read from `recurrent_in` and written to `recurrent_out` in ML-Agents' layout: the
    weights in torch's gate order, and the output that goes on to the head."""
    if _axes(graph, unsqueeze) != [0]:
        raise LayoutError(f"the LSTM's input is unsqueezed on axes {_axes(graph, unsqueeze)}, expected [0]")
    node = graph.only_consumer(unsqueeze.output[0], ("LSTM",))
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    plain = {"hidden_size", "direction"} | {key for key in ("input_forget", "layout") if not attrs.get(key)}
    hidden = int(attrs.get("hidden_size", 0))
    if set(attrs) - plain or attrs.get("direction", b"forward") != b"forward" or hidden < 1:
        raise LayoutError(f"the LSTM {node.name!r} is not one plain forward layer ({attrs})")
    inputs = [*node.input, *[""] * (8 - len(node.input))]
    if inputs[0] != unsqueeze.output[0] or inputs[4] or inputs[7]:
        raise LayoutError(f"the LSTM {node.name!r} takes {list(node.input)}: sequence lengths or peepholes are not read")
    # ONNX's W (input weights), R (recurrence weights) and B ([Wb | Rb], zeros where absent).
    weights = graph.constant(inputs[1], "LSTM W").astype(np.float32)
    recurrence = graph.constant(inputs[2], "LSTM R").astype(np.float32)
    bias = graph.constant(inputs[3], "LSTM B").astype(np.float32) if inputs[3] else np.zeros((1, 8 * hidden), np.float32)
    for part, array, shape in (
        ("W", weights, (1, 4 * hidden, weights.shape[-1])),
        ("R", recurrence, (1, 4 * hidden, hidden)),
        ("B", bias, (1, 8 * hidden)),
    ):
        if array.shape != shape:
            raise LayoutError(f"the LSTM's {part} is {list(array.shape)}, expected {list(shape)} for hidden_size {hidden}")
    _memory_in(graph, inputs[5], inputs[6], hidden)
    _memory_out(graph, node, hidden)

    def torch_order(rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(
            np.ascontiguousarray(rows.reshape(4, hidden, -1)[list(ONNX_TO_TORCH_GATES)].reshape(4 * hidden, -1))
        )

    lstm = LstmWeights(
        torch_order(weights[0]),
        torch_order(recurrence[0]),
        torch_order(bias[0, : 4 * hidden]).reshape(-1),
        torch_order(bias[0, 4 * hidden :]).reshape(-1),
    )
    squeeze = graph.only_consumer(node.output[0], ("Squeeze",))
    if _axes(graph, squeeze) != [0, 1]:
        raise LayoutError(f"the LSTM's Y is squeezed on axes {_axes(graph, squeeze)}, expected [0, 1]")
    return lstm, squeeze.output[0]


def _memory_in(graph: _Graph, h0: str, c0: str, hidden: int) -> None:
    """h0 and c0 are the halves of recurrent_in [batch, 1, 2 * hidden], transposed to [1, batch, 2 * hidden]."""
    dims = _dims(graph, RECURRENT_IN)
    if len(dims) != 3 or dims[1:] != [1, 2 * hidden]:
        raise LayoutError(f"{RECURRENT_IN} is {dims}, expected [batch, 1, {2 * hidden}] for an LSTM of {hidden} units")
    memory = _constant_of(graph, "memory_size")
    if memory != [2.0 * hidden]:
        raise LayoutError(f"memory_size is {memory}, expected [{2 * hidden}] for an LSTM of {hidden} units ([h | c])")
    transpose = graph.only_consumer(RECURRENT_IN, ("Transpose",))
    if _perm(transpose) != [1, 0, 2]:
        raise LayoutError(f"{RECURRENT_IN} is transposed by {_perm(transpose)}, expected [1, 0, 2]")
    for name, half, (start, end) in ((h0, "h0", (0, hidden)), (c0, "c0", (hidden, 2 * hidden))):
        node = graph.producer.get(name)
        bounds = _slice(graph, node, dims) if node is not None and node.op_type == "Slice" else None
        if node is None or node.input[0] != transpose.output[0] or bounds is None or bounds != (start, end, 2):
            raise LayoutError(f"the LSTM's {half} {name!r} is not {RECURRENT_IN}'s [{start}, {end}) on axis 2 ({bounds})")


def _memory_out(graph: _Graph, lstm: onnx.NodeProto, hidden: int) -> None:
    """recurrent_out is [Y_h | Y_c], transposed back to [batch, 1, 2 * hidden]."""
    if RECURRENT_OUT not in graph.outputs or len(lstm.output) < 3:
        raise LayoutError(f"no {RECURRENT_OUT} output of the LSTM's Y_h and Y_c (outputs: {graph.outputs})")
    concat = graph.only_consumer(lstm.output[1], ("Concat",))
    axis = {a.name: a.i for a in concat.attribute}.get("axis")
    if list(concat.input) != list(lstm.output[1:3]) or axis not in (2, -1):
        raise LayoutError(f"the memory is Concat of {list(concat.input)} on axis {axis}, expected [Y_h, Y_c] on axis 2")
    transpose = graph.only_consumer(concat.output[0], ("Transpose",))
    name = transpose.output[0]
    while name != RECURRENT_OUT and len(graph.consumers.get(name, [])) == 1 and graph.consumers[name][0].op_type == "Identity":
        name = graph.consumers[name][0].output[0]
    if _perm(transpose) != [1, 0, 2] or name != RECURRENT_OUT:
        raise LayoutError(
            f"the LSTM's [h | c] is transposed by {_perm(transpose)} into {name!r}, expected [1, 0, 2] into {RECURRENT_OUT}"
        )


def _axes(graph: _Graph, node: onnx.NodeProto) -> list[int]:
    """Unsqueeze's and Squeeze's axes: an attribute before opset 13, an input from then on."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    return [int(a) for a in graph.constant(node.input[1], f"{node.op_type} axes").reshape(-1)] if len(node.input) > 1 else []


def _perm(node: onnx.NodeProto) -> list[int]:
    return [int(p) for p in next((a.ints for a in node.attribute if a.name == "perm"), [])]


def _slice(graph: _Graph, node: onnx.NodeProto, dims: list[int | str]) -> tuple[int, int, int] | None:
    """(start, end, axis) of a Slice of one axis with step 1 of a tensor of `dims` (attributes
    before opset 10, inputs from then on), the end clamped to that axis's width as Slice clamps
    it; None for anything else."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if "starts" in attrs:
        parts = [list(attrs["starts"]), list(attrs["ends"]), list(attrs.get("axes", [0]))]
        steps = [1]
    else:
        named = [*node.input[1:5], *[""] * (4 - len(node.input[1:5]))]
        parts = [[int(v) for v in graph.constant(name, "Slice argument").reshape(-1)] if name else [] for name in named[:3]]
        steps = [int(v) for v in graph.constant(named[3], "Slice steps").reshape(-1)] if named[3] else [1]
    starts, ends, axes = parts
    if len(starts) != 1 or len(ends) != 1 or len(axes) != 1 or steps != [1]:
        return None
    axis = int(axes[0]) % len(dims)
    width = dims[axis]
    return int(starts[0]), min(int(ends[0]), width) if isinstance(width, int) else int(ends[0]), axis


def _dims(graph: _Graph, name: str) -> list[int | str]:
    """The input `name`'s shape: each dimension's size, or its name where it has none (batch)."""
    value = next(value for value in graph.inputs if value.name == name)
    return [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]


def _masks_width(graph: _Graph, actions: int) -> None:
    dims = _dims(graph, ACTION_MASKS)
    if len(dims) != 2 or dims[1] != actions:
        raise LayoutError(f"{ACTION_MASKS} is {dims}, expected [batch, {actions}]")


def _masked_logits(graph: _Graph, logits: str, actions: int) -> str:
    """The branch's logits after _mask_branch: `logits` times the masks (`action_masks`, through a
    Slice of its columns or as it is), then less 1e8 times the blocked ones (a Sub)."""
    _masks_width(graph, actions)
    mul = graph.only_consumer(logits, ("Mul",))
    (mask,) = [name for name in mul.input if name != logits] or [logits]
    while mask != ACTION_MASKS and mask in graph.producer and graph.producer[mask].op_type in ("Slice", "Identity", "Cast"):
        mask = graph.producer[mask].input[0]
    if mask != ACTION_MASKS:
        raise LayoutError(f"the logits {logits!r} are multiplied by {mul.input[1]!r}, expected {ACTION_MASKS}")
    return graph.only_consumer(mul.output[0], ("Sub",)).output[0]


def _branches(graph: _Graph, x: str, branches: tuple[int, ...]) -> tuple[tuple[torch.Tensor, torch.Tensor], list[str]]:
    """Several discrete branches on the encoding `x`: one Gemm each, its logits masked by its own
    Slice of `action_masks` as _mask_branch does. The branch a Gemm is, is the columns of the masks
    it is told by; they must tile the masks in the order and sizes `discrete_action_output_shape`
    says. The Gemms stacked in that order (one head of the logits side by side), and each
    branch's masked logits."""
    _masks_width(graph, sum(branches))
    gemms = graph.consumers.get(x, [])
    if len(gemms) != len(branches) or any(node.op_type != "Gemm" for node in gemms):
        ops = [node.op_type for node in gemms]
        raise LayoutError(f"{x!r} feeds {ops}, expected a Gemm for each of the {len(branches)} discrete branches")
    columns = {_mask_columns(graph, gemm.output[0]): gemm for gemm in gemms}
    expected = [(first, first + size) for first, size in zip(branch_starts(branches), branches, strict=True)]
    if sorted(columns) != expected:
        raise LayoutError(
            f"the branches' Gemms are masked by columns {sorted(columns)} of {ACTION_MASKS}, "
            f"expected {expected} for {DISCRETE_SHAPE} {list(branches)}"
        )
    weights, biases, logits = [], [], []
    for (first, last), gemm in sorted(columns.items()):
        weight, bias = _gemm(graph, gemm)
        if weight.shape[0] != last - first:
            raise LayoutError(f"the Gemm of mask columns {first}:{last} gives {weight.shape[0]} logits")
        weights.append(weight)
        biases.append(bias)
        logits.append(_masked_logits(graph, gemm.output[0], sum(branches)))
    return (torch.cat(weights), torch.cat(biases)), logits


def _mask_columns(graph: _Graph, logits: str) -> tuple[int, int]:
    """The columns [start, end) of `action_masks` that a branch's logits are multiplied by: a Slice on axis 1."""
    mul = graph.only_consumer(logits, ("Mul",))
    (mask,) = [name for name in mul.input if name != logits] or [logits]
    node = graph.producer.get(mask)
    if node is None or node.op_type != "Slice" or node.input[0] != ACTION_MASKS:
        raise LayoutError(f"the branch logits {logits!r} are multiplied by {mask!r}, expected a Slice of {ACTION_MASKS}")
    bounds = _slice(graph, node, _dims(graph, ACTION_MASKS))
    if bounds is None or bounds[2] != 1:
        raise LayoutError(f"the Slice {mask!r} of {ACTION_MASKS} is not one range of columns with step 1: {bounds}")
    return bounds[0], bounds[1]


def _version(graph: _Graph) -> int:
    if "version_number" not in graph.outputs:
        raise LayoutError(f"no version_number output (outputs: {graph.outputs})")
    value = _constant_of(graph, "version_number")
    if len(value) != 1 or int(value[0]) not in VERSIONS:
        raise LayoutError(f"model version {value}, supported: {', '.join(map(str, VERSIONS))}")
    return int(value[0])


def _unread(graph: _Graph) -> None:
    """LayoutError naming a memory half declared, or discrete actions without their masks or
    argmax: read as a feed-forward actor, either would be misread (the LSTM skipped, the masks
    ignored)."""
    inputs = [value.name for value in graph.inputs]
    problems = []
    memory = _constant_of(graph, "memory_size")
    if (RECURRENT_IN in inputs) != any(memory):
        size = ", ".join(f"{m:g}" for m in memory) or "?"
        problems.append(
            f"a memory is read with its {RECURRENT_IN} and a memory_size, not one without the other (memory_size {size})"
        )
    if (DISCRETE_DETERMINISTIC in graph.outputs) != (ACTION_MASKS in inputs):
        problems.append(
            f"discrete actions are read with their {ACTION_MASKS} and {DISCRETE_DETERMINISTIC}, not one without the other"
        )
    if problems:
        raise LayoutError("; ".join(problems))


def _constant_of(graph: _Graph, output: str) -> list[float]:
    """The values of a constant output (through Identity nodes); [] where it is computed or absent."""
    name = output
    while name not in graph.constants and name in graph.producer and graph.producer[name].op_type == "Identity":
        name = graph.producer[name].input[0]
    return [float(v) for v in graph.constants[name].reshape(-1)] if name in graph.constants else []


def _obs_sizes(graph: _Graph) -> tuple[int, ...]:
    observations = [value for value in graph.inputs if value.name not in (ACTION_MASKS, RECURRENT_IN)]
    names = [value.name for value in observations]
    if names != [f"obs_{i}" for i in range(len(names))] or not names:
        raise LayoutError(
            f"inputs {names}, expected obs_0..obs_k (and {ACTION_MASKS} for discrete actions, {RECURRENT_IN} for a memory)"
        )
    sizes = []
    for value in observations:
        dims = value.type.tensor_type.shape.dim
        if len(dims) != 2 or not dims[1].HasField("dim_value"):
            shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
            raise LayoutError(f"input {value.name} has shape {shape}, expected [batch, n] with a fixed n")
        sizes.append(dims[1].dim_value)
    return tuple(sizes)


def _encoder(graph: _Graph, obs_sizes: tuple[int, ...]) -> tuple[str, Normalizer | None]:
    """Follow each input through its normalizer (if any) into the Concat; return the Concat output."""
    outputs, stats = [], []
    for i, size in enumerate(obs_sizes):
        first = graph.only_consumer(f"obs_{i}", ("Sub", "Concat", "Gemm"))
        if first.op_type == "Sub":
            name, mean, std = _normalizer_chain(graph, first, size)
            outputs.append(name)
            stats.append((mean, std))
        else:
            outputs.append(f"obs_{i}")
    if 0 < len(stats) < len(obs_sizes):
        raise LayoutError("some inputs are normalized and others are not")
    normalizer = None
    if stats:
        std = np.concatenate([s for _, s in stats])
        # ML-Agents folds sqrt(variance_sum / steps) into one constant: keep it as a sum over 1 step.
        normalizer = Normalizer(
            torch.from_numpy(np.concatenate([m for m, _ in stats])),
            torch.from_numpy(std) ** 2,
            torch.ones(()),
        )
    if len(outputs) == 1 and graph.only_consumer(outputs[0], ("Concat", "Gemm")).op_type == "Gemm":
        return outputs[0], normalizer
    concat = graph.only_consumer(outputs[0], ("Concat",))
    axis = {a.name: a.i for a in concat.attribute}.get("axis")
    if list(concat.input) != outputs or axis not in (1, -1):
        raise LayoutError(f"Concat takes {list(concat.input)} on axis {axis}, expected {outputs} on axis 1")
    return concat.output[0], normalizer


def _normalizer_chain(graph: _Graph, sub: onnx.NodeProto, size: int) -> tuple[str, np.ndarray, np.ndarray]:
    mean = _float_vector(graph, sub.input[1], "running_mean", size)
    div = graph.only_consumer(sub.output[0], ("Div",))
    std = _float_vector(graph, div.input[1], "normalizer std", size)
    clip = graph.only_consumer(div.output[0], ("Clip",))
    if graph.clip_bounds(clip) != (-NORMALIZER_CLAMP, NORMALIZER_CLAMP):
        raise LayoutError(f"normalizer clips to {graph.clip_bounds(clip)}, expected (-5.0, 5.0)")
    return clip.output[0], mean, std


def _float_vector(graph: _Graph, name: str, what: str, size: int) -> np.ndarray:
    value = graph.constant(name, what)
    if value.dtype.kind != "f" or value.size != size:
        raise LayoutError(f"{what} {name!r} is {value.dtype} {list(value.shape)}, expected {size} floats")
    return value.astype(np.float32).reshape(size)


def _gemm(graph: _Graph, node: onnx.NodeProto) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight [out, in], bias [out]) of a Gemm computing x @ W^T + b."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0) or len(node.input) != 3:
        raise LayoutError(f"Gemm {node.name or node.output[0]!r} is not a plain x @ W^T + b ({attrs})")
    weight = graph.constant(node.input[1], "Gemm weight").astype(np.float32)
    bias = graph.constant(node.input[2], "Gemm bias").astype(np.float32)
    if weight.ndim == 2 and not attrs.get("transB", 0):
        weight = weight.T
    return torch.from_numpy(np.ascontiguousarray(weight)), torch.from_numpy(bias)


def _swish(graph: _Graph, name: str) -> str | None:
    """The output of x * sigmoid(x) on `name`, or None when `name` is not followed by a Swish."""
    users = graph.consumers.get(name, [])
    sigmoids = [node for node in users if node.op_type == "Sigmoid"]
    if len(sigmoids) != 1:
        return None
    muls = [node for node in users if node.op_type == "Mul" and set(node.input) == {name, sigmoids[0].output[0]}]
    if len(users) != 2 or len(muls) != 1:
        raise LayoutError(f"{name!r} feeds {[node.op_type for node in users]}, expected Sigmoid and Mul (Swish)")
    return muls[0].output[0]


def _log_sigma(graph: _Graph) -> torch.Tensor | None:
    # Found by name: ML-Agents and harness exports both name it after the torch parameter.
    names = [name for name in graph.constants if re.search(r"(^|\.)log_sigma$", name)]
    if len(names) > 1:
        raise LayoutError(f"several log_sigma initializers: {names}")
    return torch.from_numpy(graph.constants[names[0]].astype(np.float32)) if names else None


def _action_clip(graph: _Graph, mu: str) -> float | None:
    """The c of clip(mu, -c, c) / c from the deterministic output; None when it is mu itself."""
    if DETERMINISTIC not in graph.outputs:
        return ACTION_CLIP  # version 2 exports have no deterministic output; ML-Agents clips at 3
    node = graph.producer.get(DETERMINISTIC)
    if node is not None and node.op_type == "Identity" and node.input[0] == mu:
        return None
    clip = graph.producer.get(node.input[0]) if node is not None and node.op_type == "Div" else None
    if node is not None and clip is not None and clip.op_type == "Clip" and clip.input[0] == mu:
        low, high = graph.clip_bounds(clip)
        divisor = graph.constant(node.input[1], "action divisor").reshape(-1)
        if low == -high and divisor.size == 1 and float(divisor[0]) == high:
            return high
    users = [user.op_type for user in graph.consumers.get(mu, [])]
    raise LayoutError(f"{DETERMINISTIC} is not clip(mu, -c, c) / c of the Gemm {mu!r}, which feeds {users}")
