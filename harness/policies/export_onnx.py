"""Write a `PolicyNet` as ONNX, built node by node with `onnx.helper`, for every family the
loaders read.

Why not `torch.onnx.export`: in torch 2.13 its default (dynamo) exporter needs `onnxscript`,
which is not a dependency, and the TorchScript exporter behind `dynamo=False` is deprecated
("will be removed"). A policy is a few Gemms and convolutions, so the graph is written directly,
module by module, in exactly the order of operations the harness's float32 forward runs.

Two layouts:

- **ML-Agents** (a feed-forward continuous policy that acts by ML-Agents' rule, `clip(mu, -3, 3) /
  3`, or came from an ML-Agents file): the model version 3 names (`obs_0`.., `deterministic_continuous_actions`,
  `continuous_actions` sampled in the graph, `version_number`, ...), which Unity and the
  harness's ML-Agents reader take.
- **Every other policy** (SB3's families): one input per observation input, named as the policy
  names it (`obs`, or a Dict's keys), float32 with a dynamic batch axis (an image as float32
  holding its 0-255 pixel values: ATC takes float inputs, uint8 only through its AIPP image
  preprocessing; a Discrete, MultiDiscrete or MultiBinary observation as its int64 values, one-hot
  encoded in the graph as SB3's preprocess_obs does), and two outputs: the head as a sweep names
  it (`logits`, `q_values` or `mu`) and `deterministic_actions` (the argmax; a Box's action:
  `mu`, or tanh then the action bounds).

  A recurrent policy (RecurrentPPO; an ML-Agents one with a memory, whatever its head) takes one
  step of each row: its state is explicit, inputs `state_h`, `state_c` ([layers, batch, hidden],
  as sb3-contrib's predict returns it) and `episode_start` (float32 [batch], 1 where the row's
  episode starts: the state is multiplied by 1 - episode_start first, as sb3-contrib does), and
  outputs `next_state_h`, `next_state_c`; the LSTM is ONNX's LSTM op, one per layer. A masked
  policy (MaskablePPO) takes `action_mask` (bool [batch, actions], True where legal) and puts
  MASKED_LOGIT on the rest before the argmax. A multi-discrete one (ML-Agents' branches) gives its
  branches' logits side by side and `deterministic_actions` [batch, branches], the argmax of each.

What the harness computes before the body is in the graph too, as constants: the observation
normalizer (ML-Agents' or VecNormalize's statistics, folded in: Sub, Div, Clip, and Where for a
Dict's keys that VecNormalize leaves alone), image scaling by 255, the features extractor
(NatureCNN, CombinedExtractor), batch norms in eval mode (BatchNormalization), QR-DQN's quantile
mean and SAC's clipped gSDE mean. The stochastic action of an SB3 family is not exported: its
noise is the harness's own (drawn on the CPU, the same for every card), not a deployment's.

The opset: `DEFAULT_OPSET`, which Ascend's ATC (`atc --framework=5`) takes in every CANN release
whose documentation states a range (docs/own-policy.md, "Exporting to ONNX").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, assert_never, cast

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import harness
from harness.errors import UsageError
from harness.policies.base import MASKED_LOGIT, BatchNorm, ObservationNormalizer, ObsInput, PolicyNet
from harness.policies.mlagents import Concatenated
from harness.policies.sb3.layers import Combined, NatureCnn
from harness.policies.sb3.q_networks import QuantileMean
from harness.policies.vecnormalize import VecNormalizeObs

# ATC's ONNX parser: opset v9 to v13 in CANN 5.0.4 and 6.0.1, v9 to v18 in CANN 7.0.0 (its "ONNX
# operator specifications"); later releases list each operator's opsets instead. 11 lies in
# every stated range, and it is the first with Clip's bounds as inputs, which ATC and the
# onnxruntime of every supported version read.
DEFAULT_OPSET = 11
OPSETS = range(9, 19)
"""The opsets this exporter writes correctly: ATC's widest stated range."""
MLAGENTS_VERSION = 3.0
BATCH = "batch"
DETERMINISTIC = "deterministic_actions"
# What each observation input is in the graph: an image float32 (its 0-255 pixel values), integer
# values (Discrete, MultiDiscrete, MultiBinary) int64 as the environment gives them, encoded in the graph.
INPUT_TYPES = {"float32": TensorProto.FLOAT, "uint8": TensorProto.FLOAT, "int64": TensorProto.INT64}
# A recurrent policy's state in and out, and its episode starts; a masked policy's masks.
STATE_IN = ("state_h", "state_c")
STATE_OUT = ("next_state_h", "next_state_c")
EPISODE_START = "episode_start"
ACTION_MASK = "action_mask"
# torch's LSTM stacks its gates' rows as (input, forget, cell, output); ONNX's as (input, output,
# forget, cell).
TORCH_TO_ONNX_GATES = (0, 3, 1, 2)
# PyTorch's Softplus (beta 1, threshold 20) returns x itself above the threshold; ONNX's
# Softplus computes log(exp(x) + 1) there, which overflows float32 past 88.
SOFTPLUS_THRESHOLD = 20.0
# torch.nn.SELU's constants, at full precision (ONNX's defaults are their float32 roundings).
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


class _Builder:
    """Accumulates nodes and initializers for one opset; names every value after the module it comes from."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def constant(self, name: str, value: torch.Tensor | np.ndarray | list[float], dtype: Any = np.float32) -> str:
        array = value.detach().cpu().float().numpy() if isinstance(value, torch.Tensor) else value
        self.initializers.append(numpy_helper.from_array(np.asarray(array, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def rename_output(self, value: str, name: str) -> str:
        """Give the value the last node made a graph output's name."""
        last = self.nodes[-1]
        if list(last.output) != [value]:
            raise ValueError(f"{value} is not the last node's output")
        last.output[0] = last.name = name
        return name

    def clip(self, x: str, low: float, high: float, name: str) -> str:
        """Clip keeps its bounds in attributes before opset 11 and in inputs from then on."""
        if self.opset < 11:
            return self.op("Clip", [x], name, min=low, max=high)
        bounds = [self.constant(f"{name}.min", np.array(low)), self.constant(f"{name}.max", np.array(high))]
        return self.op("Clip", [x, *bounds], name)

    def unsqueeze(self, x: str, axes: list[int], name: str) -> str:
        """Unsqueeze and Squeeze keep their axes in an attribute before opset 13, in an input from then on."""
        if self.opset < 13:
            return self.op("Unsqueeze", [x], name, axes=axes)
        return self.op("Unsqueeze", [x, self.constant(f"{name}.axes", np.array(axes), dtype=np.int64)], name)

    def squeeze(self, x: str, axes: list[int], name: str) -> str:
        if self.opset < 13:
            return self.op("Squeeze", [x], name, axes=axes)
        return self.op("Squeeze", [x, self.constant(f"{name}.axes", np.array(axes), dtype=np.int64)], name)

    def linear(self, x: str, linear: nn.Linear, name: str) -> str:
        bias: torch.Tensor | None = linear.bias  # None where built with bias=False (ARS)
        if bias is None:  # Gemm's bias is optional only from opset 11: MatMul with W^T
            return self.op("MatMul", [x, self.constant(f"{name}.weight_t", linear.weight.t())], f"{name}/MatMul")
        weight = self.constant(f"{name}.weight", linear.weight)
        return self.op("Gemm", [x, weight, self.constant(f"{name}.bias", bias)], f"{name}/Gemm", transB=1)

    def softplus(self, x: str, name: str) -> str:
        """torch's softplus: log(1 + exp(x)), and x itself above its threshold."""
        above = self.op("Greater", [x, self.constant(f"{name}.threshold", np.array(SOFTPLUS_THRESHOLD))], f"{name}/Greater")
        return self.op("Where", [above, x, self.op("Softplus", [x], f"{name}/Softplus")], f"{name}/Where")


Emit = Callable[[_Builder, str, str, nn.Module], str]


def _product(b: _Builder, x: str, gate: str, name: str) -> str:
    return b.op("Mul", [x, gate], f"{name}/Mul")


# How each activation a loader can put in a network is written, in ops every opset of OPSETS has.
# SiLU as Sigmoid then Mul, as ML-Agents writes its Swish (opset 9 has no Swish op).
ACTIVATIONS: dict[type[nn.Module], Emit] = {
    nn.Identity: lambda b, x, name, _: x,
    nn.ReLU: lambda b, x, name, _: b.op("Relu", [x], f"{name}/Relu"),
    nn.Tanh: lambda b, x, name, _: b.op("Tanh", [x], f"{name}/Tanh"),
    nn.Sigmoid: lambda b, x, name, _: b.op("Sigmoid", [x], f"{name}/Sigmoid"),
    nn.SiLU: lambda b, x, name, _: _product(b, x, b.op("Sigmoid", [x], f"{name}/Sigmoid"), name),
    nn.ELU: lambda b, x, name, m: b.op("Elu", [x], f"{name}/Elu", alpha=float(cast(nn.ELU, m).alpha)),
    # CELU(alpha) is max(0, x) + min(0, alpha * (exp(x / alpha) - 1)): ELU where alpha is 1.
    nn.CELU: lambda b, x, name, m: _celu(b, x, name, cast(nn.CELU, m)),
    nn.SELU: lambda b, x, name, _: b.op("Selu", [x], f"{name}/Selu", alpha=SELU_ALPHA, gamma=SELU_SCALE),
    nn.LeakyReLU: lambda b, x, name, m: b.op(
        "LeakyRelu", [x], f"{name}/LeakyRelu", alpha=float(cast(nn.LeakyReLU, m).negative_slope)
    ),
    # RReLU in eval mode: a leaky ReLU with the mean of its slope range.
    nn.RReLU: lambda b, x, name, m: b.op(
        "LeakyRelu", [x], f"{name}/LeakyRelu", alpha=(cast(nn.RReLU, m).lower + cast(nn.RReLU, m).upper) / 2
    ),
    nn.GELU: lambda b, x, name, m: _gelu(b, x, name, cast(nn.GELU, m)),
    nn.Softplus: lambda b, x, name, m: _softplus(b, x, name, cast(nn.Softplus, m)),
    nn.Mish: lambda b, x, name, _: _product(b, x, b.op("Tanh", [b.softplus(x, name)], f"{name}/Tanh"), name),
    nn.ReLU6: lambda b, x, name, _: b.clip(x, 0.0, 6.0, f"{name}/Clip"),
    nn.Hardtanh: lambda b, x, name, m: b.clip(x, cast(nn.Hardtanh, m).min_val, cast(nn.Hardtanh, m).max_val, f"{name}/Clip"),
    nn.Hardsigmoid: lambda b, x, name, _: b.op("HardSigmoid", [x], f"{name}/HardSigmoid", alpha=1 / 6, beta=0.5),
    nn.Hardswish: lambda b, x, name, _: _product(
        b, x, b.op("HardSigmoid", [x], f"{name}/HardSigmoid", alpha=1 / 6, beta=0.5), name
    ),
    nn.Hardshrink: lambda b, x, name, m: b.op("Shrink", [x], f"{name}/Shrink", lambd=float(cast(nn.Hardshrink, m).lambd)),
    nn.Softshrink: lambda b, x, name, m: b.op(
        "Shrink", [x], f"{name}/Shrink", lambd=float(cast(nn.Softshrink, m).lambd), bias=float(cast(nn.Softshrink, m).lambd)
    ),
    nn.Softsign: lambda b, x, name, _: b.op("Softsign", [x], f"{name}/Softsign"),
    nn.Tanhshrink: lambda b, x, name, _: b.op("Sub", [x, b.op("Tanh", [x], f"{name}/Tanh")], f"{name}/Sub"),
    # log(sigmoid(x)) = -softplus(-x), with softplus as torch computes it (no overflow).
    nn.LogSigmoid: lambda b, x, name, _: b.op(
        "Neg", [b.softplus(b.op("Neg", [x], f"{name}/Neg"), f"{name}/softplus")], f"{name}/Out"
    ),
}


def _celu(b: _Builder, x: str, name: str, module: nn.CELU) -> str:
    if module.alpha != 1.0:
        raise UsageError(f"cannot export CELU(alpha={module.alpha:g}): only alpha 1, which SB3 builds")
    return b.op("Elu", [x], f"{name}/Elu", alpha=1.0)


def _gelu(b: _Builder, x: str, name: str, module: nn.GELU) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2))), torch's exact GELU (ONNX's Gelu op needs opset 20)."""
    if module.approximate != "none":
        raise UsageError(f"cannot export GELU(approximate={module.approximate!r}): only the exact one, which SB3 builds")
    scaled = b.op("Div", [x, b.constant(f"{name}.sqrt2", np.array(np.sqrt(2.0)))], f"{name}/Div")
    erf = b.op("Add", [b.op("Erf", [scaled], f"{name}/Erf"), b.constant(f"{name}.one", np.array(1.0))], f"{name}/Add")
    half = b.op("Mul", [x, b.constant(f"{name}.half", np.array(0.5))], f"{name}/Half")
    return b.op("Mul", [half, erf], f"{name}/Mul")


def _softplus(b: _Builder, x: str, name: str, module: nn.Softplus) -> str:
    if (module.beta, module.threshold) != (1.0, SOFTPLUS_THRESHOLD):
        raise UsageError(f"cannot export Softplus(beta={module.beta:g}, threshold={module.threshold:g}): only SB3's defaults")
    return b.softplus(x, name)


def export_onnx(policy: PolicyNet, out: Path, opset: int = DEFAULT_OPSET) -> None:
    """Write `policy` to `out` with float32 weights and a dynamic batch axis; UsageError (one line)
    for a part this exporter does not write, named."""
    if opset not in OPSETS:
        raise UsageError(f"opset {opset} is not one this exporter writes ({OPSETS.start} to {OPSETS.stop - 1})")
    info = policy.info
    b = _Builder(opset)
    if _mlagents_layout(policy):
        inputs = [_tensor(f"obs_{i}", TensorProto.FLOAT, [BATCH, size]) for i, size in enumerate(info.obs_sizes)]
        outputs = _mlagents_outputs(b, policy, _network(b, policy, [i.name for i in inputs], "mu"))
    else:
        inputs = [_tensor(i.name, INPUT_TYPES[i.dtype], [BATCH, *i.shape]) for i in info.inputs]
        inputs += _step_inputs(policy)
        head = _network(b, policy, [i.name for i in info.inputs], policy.head_output())
        outputs = [_tensor(head, TensorProto.FLOAT, [BATCH, info.action_size]), _action(b, policy, head)]
        if info.memory is not None:
            shape: list[int | str] = [info.memory.layers, BATCH, info.memory.hidden]
            outputs += [_tensor(name, TensorProto.FLOAT, shape) for name in STATE_OUT]
    graph = helper.make_graph(b.nodes, info.name, inputs, outputs, b.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset)],
        producer_name="harness",
        producer_version=harness.__version__,
        # The oldest IR that carries this opset, so older runtimes (Unity's, ATC's onnx) read it.
        ir_version=helper.find_min_ir_version_for([helper.make_opsetid("", opset)]),
    )
    # Provenance travels with the file, so an exported synthetic policy stays labelled when loaded.
    helper.set_model_props(
        model,
        {"harness.policy": info.name, "harness.detail": info.detail, "harness.synthetic": str(info.synthetic).lower()},
    )
    onnx.checker.check_model(model, full_check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out)


def _mlagents_layout(policy: PolicyNet) -> bool:
    """A feed-forward continuous ML-Agents actor is written with ML-Agents' names; one with a
    memory in the recurrent layout, its state explicit, as every recurrent policy."""
    return (
        policy.info.action_kind == "continuous"
        and policy.info.memory is None
        and (policy.action_clip is not None or policy.info.source.startswith("mlagents"))
    )


def _step_inputs(policy: PolicyNet) -> list[onnx.ValueInfoProto]:
    """A recurrent policy's state and episode starts, a masked policy's masks."""
    info, inputs = policy.info, []
    if info.memory is not None:
        shape: list[int | str] = [info.memory.layers, BATCH, info.memory.hidden]
        inputs += [_tensor(name, TensorProto.FLOAT, shape) for name in STATE_IN]
        inputs.append(_tensor(EPISODE_START, TensorProto.FLOAT, [BATCH]))
    if info.masked:
        inputs.append(_tensor(ACTION_MASK, TensorProto.BOOL, [BATCH, info.action_size]))
    return inputs


def _network(b: _Builder, policy: PolicyNet, inputs: list[str], head: str) -> str:
    """Normalizer, image scaling, features (or the inputs' concatenation), the LSTM of a recurrent
    policy, body, head, a masked policy's masks: the head's output, named `head`."""
    x = _preprocessed(b, policy, inputs)
    if policy.features is None:
        features = x[0] if len(x) == 1 else b.op("Concat", x, "concat", axis=1)
    elif isinstance(policy.features, Concatenated):  # ML-Agents' encoder before its memory
        concat = x[0] if len(x) == 1 else b.op("Concat", x, "features/Concat", axis=1)
        features = _emit(b, policy, policy.features.layers, concat, "features.layers")
    elif isinstance(policy.features, Combined):
        parts = [
            _emit(b, policy, m, xi, f"features.extractors.{key}")
            for (key, m), xi in zip(policy.features.extractors.items(), x, strict=True)
        ]
        features = b.op("Concat", parts, "features/Concat", axis=1)
    else:
        features = _emit(b, policy, policy.features, x[0], "features")
    if policy.memory is not None:
        features = _lstm(b, policy.memory, features, "memory")
    latent = _emit(b, policy, policy.body, features, "body")
    out = _emit(b, policy, policy.head, latent, "head")
    if policy.info.masked:  # as PolicyNet.masked_scores
        out = b.op("Where", [ACTION_MASK, out, b.constant("masked_logit", np.array(MASKED_LOGIT))], "head/Masked")
    return b.rename_output(out, head)


def _lstm(b: _Builder, lstm: nn.LSTM, x: str, name: str) -> str:
    """One step of `lstm` for each row of `x` from the state inputs, each row's state zeroed where
    its episode starts (as PolicyNet.step): the LSTM's output, [batch, hidden]; the state after
    the step as the outputs STATE_OUT."""
    if lstm.bidirectional or lstm.proj_size or not lstm.bias or lstm.batch_first:
        raise UsageError(f"cannot export {lstm} at {name}: only sb3-contrib's (one direction, biases, no projection)")
    one = b.constant(f"{name}.one", np.array(1.0))
    keep = b.op("Sub", [one, EPISODE_START], f"{name}/Keep")
    keep = b.unsqueeze(keep, [0, 2], f"{name}/KeepAxes")  # [1, batch, 1]
    h, c = (b.op("Mul", [state, keep], f"{name}/{state}") for state in STATE_IN)
    seq = b.unsqueeze(x, [0], f"{name}/Sequence")  # a sequence of one step: [1, batch, features]
    hs, cs = [], []
    for k in range(lstm.num_layers):
        layer = f"{name}.l{k}"
        gates = [
            getattr(lstm, f"{part}_l{k}").detach().reshape(4, lstm.hidden_size, -1)[list(TORCH_TO_ONNX_GATES)]
            for part in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        ]
        weight, recurrence = (
            b.constant(f"{layer}.{part}", g.reshape(1, 4 * lstm.hidden_size, -1))
            for part, g in zip(("W", "R"), gates[:2], strict=True)
        )
        bias = b.constant(f"{layer}.B", torch.cat([gates[2].reshape(-1), gates[3].reshape(-1)]).reshape(1, -1))
        index = b.constant(f"{layer}.index", np.array([k]), dtype=np.int64)
        h0, c0 = (b.op("Gather", [state, index], f"{layer}/{part}0", axis=0) for state, part in ((h, "h"), (c, "c")))
        outputs = [f"{layer}/Y", f"{layer}/Y_h", f"{layer}/Y_c"]
        b.nodes.append(
            helper.make_node(
                "LSTM",
                [seq, weight, recurrence, bias, "", h0, c0],
                outputs,
                name=f"{layer}/LSTM",
                hidden_size=lstm.hidden_size,
            )
        )
        seq = b.squeeze(outputs[0], [1], f"{layer}/Out")  # [1, 1, batch, hidden] -> [1, batch, hidden]
        hs.append(outputs[1])
        cs.append(outputs[2])
    for parts, output in zip((hs, cs), STATE_OUT, strict=True):
        if len(parts) > 1:
            b.op("Concat", parts, output, axis=0)
        else:
            b.op("Identity", parts, output)
    return b.squeeze(seq, [0], f"{name}/Step")


def _preprocessed(b: _Builder, policy: PolicyNet, inputs: list[str]) -> list[str]:
    """Each input as the features (or the body) take it, in PolicyNet's order: the float inputs
    normalized, each by its slice of the statistics (the normalizer is elementwise over their
    flattened concatenation), then images divided by 255 where the policy says so."""
    normalizer = policy.normalizer
    if normalizer is not None and not isinstance(normalizer, ObservationNormalizer):
        raise UsageError(f"{policy.info.name}: cannot export its {type(normalizer).__name__} observation preprocessing")
    x = list(inputs)
    start = 0
    for i, inp in enumerate(policy.info.inputs):
        if inp.dtype == "int64":
            x[i] = _encoded_integers(b, x[i], inp)
            continue
        if inp.dtype == "uint8":
            if policy.normalize_images:
                x[i] = b.op("Div", [x[i], b.constant(f"{inp.name}.scale", np.array(255.0))], f"{inp.name}/Scale")
            continue
        if normalizer is not None:
            x[i] = _normalized(b, normalizer, x[i], inp.shape, slice(start, start + inp.size), f"normalizer.{i}")
        start += inp.size
    return x


def _encoded_integers(b: _Builder, x: str, inp: ObsInput) -> str:
    """As `encode_integers`: the one-hot columns by Gather and Equal with the classes, then float32;
    MultiBinary's zeros and ones cast as they are."""
    name = f"{inp.name}/encoded"
    if not inp.classes:
        return b.op("Cast", [x], name, to=TensorProto.FLOAT)
    columns, values = inp.one_hot()
    gathered = b.op("Gather", [x, b.constant(f"{inp.name}.columns", columns, np.int64)], f"{inp.name}/Gather", axis=1)
    hot = b.op("Equal", [gathered, b.constant(f"{inp.name}.classes", values, np.int64)], f"{inp.name}/Equal")
    return b.op("Cast", [hot], name, to=TensorProto.FLOAT)


def _normalized(b: _Builder, normalizer: ObservationNormalizer, x: str, shape: tuple[int, ...], part: slice, name: str) -> str:
    """clamp((x - mean) / std, -clip, clip) over one input, with the float32 statistics the torch
    forward computes with (one Sub/Div/Clip chain per input, as ML-Agents writes it)."""
    flat = x if len(shape) == 1 else b.op("Flatten", [x], f"{name}/Flatten", axis=1)
    y = b.op("Sub", [flat, b.constant(f"{name}.running_mean", normalizer.mean()[part])], f"{name}/Sub")
    y = b.op("Div", [y, b.constant(f"{name}.std", normalizer.std()[part])], f"{name}/Div")
    y = b.clip(y, -normalizer.clip, normalizer.clip, f"{name}/Clip")
    passthrough = normalizer.passthrough if isinstance(normalizer, VecNormalizeObs) else None
    if passthrough is not None:  # a Dict's keys outside VecNormalize's norm_obs_keys pass as they are
        mask = b.constant(f"{name}.passthrough", passthrough[part].cpu().numpy(), dtype=np.bool_)
        y = b.op("Where", [mask, flat, y], f"{name}/Where")
    if len(shape) == 1:
        return y
    return b.op("Reshape", [y, b.constant(f"{name}.shape", np.array([-1, *shape]), dtype=np.int64)], f"{name}/Reshape")


def _emit(b: _Builder, policy: PolicyNet, module: nn.Module, x: str, name: str) -> str:
    """`module` applied to `x`, its nodes named after `name` (the module's path in the policy)."""
    if isinstance(module, nn.Sequential):
        for index, child in enumerate(module):
            x = _emit(b, policy, child, x, f"{name}.{index}")
        return x
    if isinstance(module, NatureCnn):
        return _emit(b, policy, module.linear, _emit(b, policy, module.cnn, x, f"{name}.cnn"), f"{name}.linear")
    if isinstance(module, nn.Linear):
        return b.linear(x, module, name)
    if isinstance(module, nn.Conv2d):
        return _conv(b, module, x, name)
    if isinstance(module, nn.Flatten):
        if (module.start_dim, module.end_dim) != (1, -1):
            raise UsageError(f"{policy.info.name}: cannot export {module} at {name}: only a flatten after the batch axis")
        return b.op("Flatten", [x], f"{name}/Flatten", axis=1)
    if isinstance(module, BatchNorm):
        tensors = [b.constant(f"{name}.{t}", getattr(module, t)) for t in ("scale", "bias", "running_mean", "running_var")]
        return b.op("BatchNormalization", [x, *tensors], f"{name}/BatchNormalization", epsilon=module.eps)
    if isinstance(module, QuantileMean):
        shape = b.constant(f"{name}.shape", np.array([-1, module.n_quantiles, module.n_actions]), dtype=np.int64)
        quantiles = b.op("Reshape", [x, shape], f"{name}/Reshape")
        if b.opset < 18:
            return b.op("ReduceMean", [quantiles], f"{name}/ReduceMean", axes=[1], keepdims=0)
        axes = b.constant(f"{name}.axes", np.array([1]), dtype=np.int64)
        return b.op("ReduceMean", [quantiles, axes], f"{name}/ReduceMean", keepdims=0)
    emit = ACTIVATIONS.get(type(module))
    if emit is not None:
        try:
            return emit(b, x, name, module)
        except UsageError as error:
            raise UsageError(f"{policy.info.name}: {error}") from None
    known = ", ".join(cls.__name__ for cls in ACTIVATIONS)
    rebuilt = f" (it came as ONNX: {policy.info.onnx_path} is its graph already)" if policy.info.onnx_path else ""
    raise UsageError(
        f"{policy.info.name}: cannot export {type(module).__name__} at {name}{rebuilt}; activations written: {known}"
    )


def _conv(b: _Builder, conv: nn.Conv2d, x: str, name: str) -> str:
    padding = conv.padding if isinstance(conv.padding, tuple) else None
    if padding is None or conv.groups != 1 or conv.padding_mode != "zeros":
        raise UsageError(f"cannot export {conv} at {name}: only explicit zero padding in one group, as NatureCNN has")
    inputs = [x, b.constant(f"{name}.weight", conv.weight)]
    if conv.bias is not None:
        inputs.append(b.constant(f"{name}.bias", conv.bias))
    return b.op(
        "Conv",
        inputs,
        f"{name}/Conv",
        kernel_shape=list(conv.kernel_size),
        strides=list(conv.stride),
        pads=[*padding, *padding],
        dilations=list(conv.dilation),
    )


def _action(b: _Builder, policy: PolicyNet, head: str) -> onnx.ValueInfoProto:
    """`deterministic_actions`, as `PolicyNet.deterministic_action` computes it from the head."""
    info = policy.info
    kind = info.action_kind
    match kind:
        case "discrete":
            b.op("ArgMax", [head], DETERMINISTIC, axis=1, keepdims=0)
            return _tensor(DETERMINISTIC, TensorProto.INT64, [BATCH])
        case "multi_discrete":
            # Each branch's columns by Gather (one meaning in every opset, where Split's and
            # Slice's arguments moved from attributes to inputs), its ArgMax, side by side.
            chosen, first = [], 0
            for i, size in enumerate(info.branches):
                columns = b.constant(f"branch.{i}.columns", np.arange(first, first + size), np.int64)
                part = b.op("Gather", [head, columns], f"branch.{i}/Gather", axis=1)
                chosen.append(b.op("ArgMax", [part], f"branch.{i}/ArgMax", axis=1, keepdims=1))
                first += size
            b.op("Concat", chosen, DETERMINISTIC, axis=1)
            return _tensor(DETERMINISTIC, TensorProto.INT64, [BATCH, len(info.branches)])
        case "continuous":
            _squash(b, policy, head, DETERMINISTIC)
            return _tensor(DETERMINISTIC, TensorProto.FLOAT, [BATCH, info.action_size])
        case _:
            assert_never(kind)


def _mlagents_outputs(b: _Builder, policy: PolicyNet, mu: str) -> list[onnx.ValueInfoProto]:
    """The ML-Agents model version 3 outputs, stochastic action drawn in-graph as ML-Agents does."""
    size = policy.info.action_size
    for output, value in (
        ("version_number", [MLAGENTS_VERSION]),
        ("memory_size", [0.0]),
        ("continuous_action_output_shape", [float(size)]),
    ):
        b.op("Identity", [b.constant(f"{output}.value", value)], output)
    noise = b.op("RandomNormalLike", [mu], "noise", dtype=TensorProto.FLOAT)
    if policy.log_sigma is not None:
        sigma = b.op("Exp", [b.constant("log_sigma", policy.log_sigma)], "sigma")
        noise = b.op("Mul", [noise, sigma], "scaled_noise")
    sample = b.op("Add", [mu, noise], "sample")
    _squash(b, policy, sample, "continuous_actions")
    _squash(b, policy, mu, "deterministic_continuous_actions")
    shapes: dict[str, list[int | str]] = {
        "version_number": [1],
        "memory_size": [1],
        "continuous_actions": [BATCH, size],
        "continuous_action_output_shape": [1],
        "deterministic_continuous_actions": [BATCH, size],
    }
    return [_tensor(name, TensorProto.FLOAT, shape) for name, shape in shapes.items()]


def _squash(b: _Builder, policy: PolicyNet, x: str, output: str) -> None:
    """As `PolicyNet._squash`: ML-Agents' clip(x, -c, c) / c; SB3's tanh, then low + 0.5 * (a + 1)
    * (high - low) in its order of operations; the identity where the policy does neither."""
    clip = policy.action_clip
    if clip is not None:
        clipped = b.clip(x, -clip, clip, f"{output}/Clip")
        b.op("Div", [clipped, b.constant(f"{output}/divisor", [clip])], output)
    elif policy.action_low is not None and policy.action_high is not None:
        shifted = b.op(
            "Add", [b.op("Tanh", [x], f"{output}/Tanh"), b.constant(f"{output}.one", np.array(1.0))], f"{output}/Add"
        )
        half = b.op("Mul", [b.constant(f"{output}.half", np.array(0.5)), shifted], f"{output}/Half")
        span = b.op("Mul", [half, b.constant(f"{output}.span", policy.action_high - policy.action_low)], f"{output}/Span")
        b.op("Add", [b.constant(f"{output}.low", policy.action_low), span], output)
    else:
        b.op("Identity", [x], output)


def _tensor(name: str, elem_type: int, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)
