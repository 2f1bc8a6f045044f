"""The actor shape every ML-Agents source fills: the `.pt` loader, the ONNX loader and huggy-arch.

An ML-Agents continuous actor (`SimpleActor`) is: one running normalizer per observation input,
the inputs concatenated, a Swish MLP (`LinearEncoder`), a linear `mu`, a free `log_sigma`, and
the action `clip(mu, -3, 3) / 3`; or discrete branches, each its linear logits, told the legal
actions by masks (one branch: a discrete policy; several: a multi-discrete one, the logits side
by side). With a memory (`memory_size` > 0), an LSTM of memory_size / 2 units sits between the
Swish MLP and the head, its state [h | c] carried from step to step and zeroed where an agent's
episode starts. Each source describes it with `MLAgentsWeights`, so shape checks and the torch
rebuild live once, here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from harness.policies.base import ActionKind, Memory, Normalizer, ObsInput, PolicyInfo, PolicyNet, mlp

# State-dict prefixes of ML-Agents' SimpleActor ("endoder" is ML-Agents' own spelling).
PROCESSORS = "network_body.observation_encoder.processors"
BODY = "network_body._body_endoder.seq_layers"
HEAD = "action_model._continuous_distribution"
MEMORY_MODULE = "network_body.lstm"  # ML-Agents' LSTM module, whose torch LSTM is `MEMORY_MODULE.lstm`
LSTM_PARTS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
ACTION_CLIP = 3.0  # ML-Agents: action = clip(mu, -3, 3) / 3


class LayoutError(ValueError):
    """The file is readable but does not hold the ML-Agents layout; the message is the problem."""


@dataclass
class LstmWeights:
    """ML-Agents' memory: one torch LSTM layer, its gates in torch's order (input, forget, cell,
    output), of memory_size / 2 units; [h | c] is the memory the agent carries."""

    weight_ih: torch.Tensor  # [4 * hidden, in]
    weight_hh: torch.Tensor  # [4 * hidden, hidden]
    bias_ih: torch.Tensor  # [4 * hidden]
    bias_hh: torch.Tensor  # [4 * hidden]

    @property
    def hidden(self) -> int:
        return self.weight_hh.shape[-1]

    def check(self, width: int) -> int:
        """LayoutError unless every tensor fits an LSTM of `hidden` units over `width` inputs; its output width."""
        gates = 4 * self.hidden
        expected = {"weight_ih": (gates, width), "weight_hh": (gates, self.hidden), "bias_ih": (gates,), "bias_hh": (gates,)}
        for name, shape in expected.items():
            held = tuple(getattr(self, name).shape)
            if held != shape:
                raise LayoutError(f"the LSTM's {name} is {held}, expected {shape} ({self.hidden} units over {width} inputs)")
        return self.hidden

    def describe(self) -> str:
        return f"{Memory(1, self.hidden).describe()} (memory_size {2 * self.hidden})"

    def module(self) -> nn.LSTM:
        with torch.random.fork_rng(devices=[]):
            lstm = nn.LSTM(self.weight_ih.shape[1], self.hidden)
        with torch.no_grad():
            for name in LSTM_PARTS:
                getattr(lstm, f"{name}_l0").copy_(getattr(self, name))
        return lstm


class Concatenated(nn.Module):
    """The inputs concatenated, then `layers`: ML-Agents' encoder as a recurrent policy's features
    stage (PolicyNet hands its features each input on its own)."""

    def __init__(self, layers: nn.Sequential) -> None:
        super().__init__()
        self.layers = layers

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(torch.cat(inputs, dim=-1) if len(inputs) > 1 else inputs[0])
        return out


@dataclass
class MLAgentsWeights:
    """An ML-Agents continuous actor as float32 tensors, before it becomes a `PolicyNet`."""

    obs_sizes: tuple[int, ...]
    normalizer: Normalizer | None
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # (weight [out, in], bias [out]) per Swish layer
    mu: tuple[torch.Tensor, torch.Tensor]
    log_sigma: torch.Tensor | None
    action_clip: float | None = ACTION_CLIP
    discrete: bool = False  # discrete branches (`mu` their logits side by side), told their legal actions by masks
    branches: tuple[int, ...] = ()  # several discrete branches (multi-discrete): each one's actions
    lstm: LstmWeights | None = None  # a memory, between the Swish layers and `mu`

    def __post_init__(self) -> None:
        width = sum(self.obs_sizes)
        if self.normalizer is not None and tuple(self.normalizer.running_mean.shape) != (width,):
            raise LayoutError(
                f"normalizer covers {tuple(self.normalizer.running_mean.shape)} values, the observations have {width}"
            )
        for index, (weight, bias) in enumerate([*self.layers, self.mu]):
            what = "mu" if index == len(self.layers) else f"layer {index}"
            if index == len(self.layers) and self.lstm is not None:
                width = self.lstm.check(width)
            if weight.dim() != 2 or weight.shape[1] != width or tuple(bias.shape) != (weight.shape[0],):
                raise LayoutError(
                    f"{what} has weight {tuple(weight.shape)} and bias {tuple(bias.shape)}, expected [out, {width}] and [out]"
                )
            width = weight.shape[0]
        if self.branches and (not self.discrete or sum(self.branches) != self.action_size):
            raise LayoutError(f"discrete branches {list(self.branches)} do not split the head's {self.action_size} logits")
        if self.log_sigma is not None:
            if self.log_sigma.numel() != self.action_size:
                raise LayoutError(f"log_sigma has {self.log_sigma.numel()} values for {self.action_size} actions")
            self.log_sigma = self.log_sigma.reshape(self.action_size)

    @property
    def action_size(self) -> int:
        return self.mu[0].shape[0]

    def describe(self) -> str:
        """The body as a person would say it: "2 x 128 SiLU"."""
        hidden = [weight.shape[0] for weight, _ in self.layers]
        body = (
            f"{len(hidden)} x {hidden[0]} SiLU"
            if hidden and len(set(hidden)) == 1
            else f"[{', '.join(map(str, hidden))}] SiLU"
        )
        if self.lstm is not None:
            body = f"{body}, {self.lstm.describe()}"
        if self.branches:
            return f"{body}, discrete branches {list(self.branches)}, action masks"
        return f"{body}, {self.action_size} discrete actions, action masks" if self.discrete else body

    @property
    def action_kind(self) -> ActionKind:
        if self.branches:
            return "multi_discrete"
        return "discrete" if self.discrete else "continuous"

    def to_policy(
        self,
        *,
        name: str,
        source: str,
        sha256: str,
        detail: str,
        synthetic: bool = False,
        onnx_path: str | None = None,
        onnx_outputs: tuple[tuple[str, str], ...] = (),
        onnx_memory: tuple[str, str] | None = None,
    ) -> PolicyNet:
        info = PolicyInfo(
            name=name,
            source=source,
            action_kind=self.action_kind,
            inputs=tuple(ObsInput(f"obs_{i}", (size,)) for i, size in enumerate(self.obs_sizes)),
            action_size=self.action_size,
            sha256=sha256,
            synthetic=synthetic,
            onnx_path=onnx_path,
            onnx_outputs=onnx_outputs,
            onnx_memory=onnx_memory,
            detail=detail,
            masked=self.discrete,
            memory=Memory(1, self.lstm.hidden) if self.lstm is not None else None,
            branches=self.branches,
        )
        # The random init is overwritten below; loading must not move the caller's global RNG.
        with torch.random.fork_rng(devices=[]):
            body = mlp([sum(self.obs_sizes), *(weight.shape[0] for weight, _ in self.layers)], nn.SiLU)
            head = nn.Linear(self.mu[0].shape[1], self.action_size)
        memory = self.lstm.module() if self.lstm is not None else None
        linears = [module for module in body if isinstance(module, nn.Linear)] + [head]
        with torch.no_grad():
            for linear, (weight, bias) in zip(linears, [*self.layers, self.mu], strict=True):
                linear.weight.copy_(weight)
                linear.bias.copy_(bias)
        if memory is None:
            return PolicyNet(info, body, head, self.normalizer, self.log_sigma, self.action_clip)
        # The Swish layers run before the LSTM: they are the features stage, the body is empty.
        features = Concatenated(body)
        return PolicyNet(
            info, nn.Sequential(), head, self.normalizer, self.log_sigma, self.action_clip, features=features, memory=memory
        )


def weights_from_state_dict(state: Mapping[str, object]) -> MLAgentsWeights:
    """Read a SimpleActor state dict; several normalizer processors are several observation inputs."""
    tensors = {key: value.float() for key, value in state.items() if isinstance(key, str) and isinstance(value, torch.Tensor)}

    def need(key: str) -> torch.Tensor:
        if key not in tensors:
            raise LayoutError(f"missing {key!r}: not an ML-Agents continuous-action Policy state dict")
        return tensors[key]

    if f"{HEAD}.log_sigma.weight" in tensors:
        raise LayoutError("conditional sigma (log_sigma computed from the body) is not supported")
    layers = [
        (need(f"{BODY}.{index}.weight"), need(f"{BODY}.{index}.bias"))
        for index in _indices(tensors, rf"{re.escape(BODY)}\.(\d+)\.weight")
    ]
    mu = (need(f"{HEAD}.mu.weight"), need(f"{HEAD}.mu.bias"))
    processors = _indices(tensors, rf"{re.escape(PROCESSORS)}\.(\d+)\.normalizer\.running_mean")
    if processors != list(range(len(processors))):
        raise LayoutError(f"normalizer processors {processors} are not numbered 0..{len(processors) - 1}")
    buffers = ("running_mean", "running_variance", "normalization_steps")
    stats = [[need(f"{PROCESSORS}.{i}.normalizer.{buffer}") for buffer in buffers] for i in processors]
    first_in = (layers[0][0] if layers else mu[0]).shape[-1]
    # Without normalizers nothing records how the inputs were split; one input of the full width
    # takes the same concatenated observation.
    obs_sizes = tuple(mean.numel() for mean, _, _ in stats) or (first_in,)
    return MLAgentsWeights(obs_sizes, _normalizer(stats), layers, mu, need(f"{HEAD}.log_sigma"), lstm=_lstm(tensors))


def _lstm(tensors: Mapping[str, torch.Tensor]) -> LstmWeights | None:
    """The memory's one torch LSTM layer (ML-Agents builds it with torch's gate order), checked
    against `memory_size_vector`; anything else under the memory is refused by name."""
    names = [f"{MEMORY_MODULE}.lstm.{part}_l0" for part in LSTM_PARTS]
    held = sorted(key for key in tensors if key.startswith(f"{MEMORY_MODULE}."))
    declared = tensors.get("memory_size_vector")
    size = int(declared.reshape(-1)[0]) if declared is not None and declared.numel() == 1 else None
    if not held:
        if size:
            raise LayoutError(f"memory_size_vector is {size}, but there is no {MEMORY_MODULE}: a memory without its LSTM")
        return None
    if held != sorted(names):
        raise LayoutError(f"the memory holds {held}; one LSTM layer ({', '.join(names)}) is read")
    lstm = LstmWeights(*(tensors[name] for name in names))
    if size is not None and size != 2 * lstm.hidden:
        raise LayoutError(f"memory_size_vector is {size}, but the LSTM has {lstm.hidden} units ([h | c] is {2 * lstm.hidden})")
    return lstm


def _normalizer(stats: list[list[torch.Tensor]]) -> Normalizer | None:
    if not stats:
        return None
    for i, (mean, variance, steps) in enumerate(stats):
        if variance.shape != mean.shape or steps.numel() != 1:
            raise LayoutError(
                f"processor {i} normalizer has running_mean {tuple(mean.shape)}, running_variance "
                f"{tuple(variance.shape)} and {steps.numel()} normalization_steps values"
            )
    mean = torch.cat([mean.reshape(-1) for mean, _, _ in stats])
    counts = [s.reshape(()) for _, _, s in stats]
    if all(torch.equal(s, counts[0]) for s in counts):
        # Keep the real buffers: their size (sums ~1e5, steps ~2e6) is what the dtype rule guards.
        return Normalizer(mean, torch.cat([v.reshape(-1) for _, v, _ in stats]), counts[0])
    per_step = torch.cat([v.reshape(-1) / s for (_, v, _), s in zip(stats, counts, strict=True)])
    return Normalizer(mean, per_step, torch.ones(()))


def _indices(tensors: Mapping[str, torch.Tensor], pattern: str) -> list[int]:
    return sorted(int(match.group(1)) for key in tensors if (match := re.fullmatch(pattern, key)))
