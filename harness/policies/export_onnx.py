"""Write a `PolicyNet` as ONNX, built node by node with `onnx.helper`.

Why not `torch.onnx.export`: in torch 2.13 its default (dynamo) exporter needs `onnxscript`,
which is not a dependency, and the TorchScript exporter behind `dynamo=False` is deprecated
("will be removed"). A policy is a handful of Gemms, so the graph is written directly, in exactly
the layout the loaders read back: continuous policies as an ML-Agents model version 3 export
(opset 9, as ML-Agents writes it, so Unity can run it too), discrete ones with input `obs` and
outputs `logits` and `deterministic_actions`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import harness
from harness.errors import UsageError
from harness.policies.base import ObservationNormalizer, PolicyNet, SamplingKind

OPSET = 9
MLAGENTS_VERSION = 3.0
BATCH = "batch"


class _Builder:
    """Accumulates nodes and float32 initializers; names every value after the module it comes from."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def constant(self, name: str, value: torch.Tensor | np.ndarray | list[float]) -> str:
        array = value.detach().cpu().float().numpy() if isinstance(value, torch.Tensor) else value
        self.initializers.append(numpy_helper.from_array(np.asarray(array, dtype=np.float32), name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def linear(self, x: str, linear: nn.Linear, name: str, output: str | None = None) -> str:
        weight = self.constant(f"{name}.weight", linear.weight)
        bias = self.constant(f"{name}.bias", linear.bias)
        return self.op("Gemm", [x, weight, bias], output or f"{name}/Gemm", transB=1)


def _swish(b: _Builder, x: str, name: str) -> str:
    return b.op("Mul", [x, b.op("Sigmoid", [x], f"{name}/Sigmoid")], f"{name}/Mul")


# How each activation a loader can put in a body is written in opset 9 (which has no Swish op).
ACTIVATIONS: dict[type[nn.Module], Callable[[_Builder, str, str, nn.Module], str]] = {
    nn.SiLU: lambda b, x, name, _: _swish(b, x, name),
    nn.ReLU: lambda b, x, name, _: b.op("Relu", [x], f"{name}/Relu"),
    nn.Tanh: lambda b, x, name, _: b.op("Tanh", [x], f"{name}/Tanh"),
    nn.ELU: lambda b, x, name, m: b.op("Elu", [x], f"{name}/Elu", alpha=float(cast(nn.ELU, m).alpha)),
    nn.LeakyReLU: lambda b, x, name, m: b.op(
        "LeakyRelu", [x], f"{name}/LeakyRelu", alpha=float(cast(nn.LeakyReLU, m).negative_slope)
    ),
}


def export_onnx(policy: PolicyNet, out: Path) -> None:
    """Write `policy` to `out` with float32 weights and a dynamic batch axis."""
    _check_exportable(policy)
    b = _Builder()
    info = policy.info
    if info.action_kind == "discrete":
        if len(info.obs_sizes) != 1:
            raise UsageError(f"{info.name}: a discrete export takes one input, the policy has {len(info.obs_sizes)}")
        names = ["obs"]
        head = _body_and_head(b, policy, names, "logits")
        b.op("ArgMax", [head], "deterministic_actions", axis=1, keepdims=0)
        outputs = [_tensor("logits", TensorProto.FLOAT, [BATCH, info.action_size])]
        outputs.append(_tensor("deterministic_actions", TensorProto.INT64, [BATCH]))
    else:
        names = [f"obs_{i}" for i in range(len(info.obs_sizes))]
        mu = _body_and_head(b, policy, names, "mu")
        outputs = _mlagents_outputs(b, policy, mu)
    inputs = [_tensor(name, TensorProto.FLOAT, [BATCH, size]) for name, size in zip(names, info.obs_sizes, strict=True)]
    graph = helper.make_graph(b.nodes, info.name, inputs, outputs, b.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="harness",
        producer_version=harness.__version__,
        # The oldest IR that carries this opset, so older runtimes (Unity's among them) read it.
        ir_version=helper.find_min_ir_version_for([helper.make_opsetid("", OPSET)]),
    )
    # Provenance travels with the file, so an exported synthetic policy stays labelled when loaded.
    helper.set_model_props(
        model,
        {"harness.policy": info.name, "harness.detail": info.detail, "harness.synthetic": str(info.synthetic).lower()},
    )
    onnx.checker.check_model(model, full_check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out)


def _check_exportable(policy: PolicyNet) -> None:
    """The layouts written here: vector inputs, an MLP, a Linear head, actions by argmax or by
    ML-Agents' rule. Anything more (a CNN, a Q-network's epsilon, gSDE, SB3's tanh squash, SAC's
    log std layer) would be written wrong, so it is refused by what it is."""
    what = [
        *(["a features extractor"] if policy.features is not None else []),
        *([f"{policy.info.sampling.kind} sampling"] if policy.info.sampling.kind is not SamplingKind.DISTRIBUTION else []),
        *(["tanh-squashed actions"] if policy.action_low is not None else []),
        *(["a log std layer"] if policy.log_std is not None else []),
    ]
    if what:
        raise UsageError(f"{policy.info.name}: cannot export {' and '.join(what)} (only MLP policies with a plain head)")


def _body_and_head(b: _Builder, policy: PolicyNet, inputs: list[str], head_name: str) -> str:
    """Normalizer (one Sub/Div/Clip chain per input, as ML-Agents writes it), Concat, body, head."""
    normalizer = policy.normalizer
    if not isinstance(policy.body, nn.Sequential) or not isinstance(policy.head, nn.Linear):
        raise UsageError(f"{policy.info.name}: only MLP policies can be exported; this one is a rebuilt graph")
    if normalizer is not None and not isinstance(normalizer, ObservationNormalizer):
        raise UsageError(f"{policy.info.name}: cannot export its {type(normalizer).__name__} observation preprocessing")
    chains = list(inputs)
    if normalizer is not None:
        mean = normalizer.mean()
        std = normalizer.std()  # the float32 value the torch forward divides by
        start = 0
        for i, (name, size) in enumerate(zip(inputs, policy.info.obs_sizes, strict=True)):
            prefix = f"normalizer.{i}"
            x = b.op("Sub", [name, b.constant(f"{prefix}.running_mean", mean[start : start + size])], f"{prefix}/Sub")
            x = b.op("Div", [x, b.constant(f"{prefix}.std", std[start : start + size])], f"{prefix}/Div")
            chains[i] = b.op("Clip", [x], f"{prefix}/Clip", min=-normalizer.clip, max=normalizer.clip)
            start += size
    x = b.op("Concat", chains, "concat", axis=1)
    for index, module in enumerate(policy.body):
        name = f"body.{index}"
        if isinstance(module, nn.Linear):
            x = b.linear(x, module, name)
        elif type(module) in ACTIVATIONS:
            x = ACTIVATIONS[type(module)](b, x, name, module)
        else:
            known = ", ".join(cls.__name__ for cls in ACTIVATIONS)
            raise UsageError(f"{policy.info.name}: cannot export {type(module).__name__} (exportable: {known})")
    return b.linear(x, policy.head, "head", output=head_name)


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
    """clip(x, -c, c) / c, as `PolicyNet._squash`; the identity when the policy has no clip."""
    clip = policy.action_clip
    if clip is None:
        b.op("Identity", [x], output)
        return
    clipped = b.op("Clip", [x], f"{output}/Clip", min=-clip, max=clip)
    b.op("Div", [clipped, b.constant(f"{output}/divisor", [clip])], output)


def _tensor(name: str, elem_type: int, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)
