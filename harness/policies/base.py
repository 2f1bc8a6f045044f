"""The one torch module every loader produces, and the dtype rule applied to it.

A policy is: an optional observation normalizer -> a body -> a head. The head output is `logits`
for discrete actions and `mu` for continuous ones. Loaders only fill in weights; how a forward
runs in float16, bfloat16 or the float64 golden is decided here, once, for every format.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from harness.dtypes import CARD_DTYPES, GOLDEN, REDUCED_FLOAT32
from harness.policies.policy_files import PLAIN, EnvSetup, PublishedScore
import itertools

ActionKind = Literal["discrete", "continuous"]

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in CARD_DTYPES}
"""The dtypes a card computes in, as torch dtypes."""


# ML-Agents clamps normalized observations to this range (ml-agents/trainers/torch/networks.py).
NORMALIZER_CLAMP = 5.0


ObsDtype = Literal["float32", "uint8"]


@dataclass(frozen=True)
class ObsInput:
    """One observation input, as the environment gives it and the policy takes it: a vector of
    floats, an image of uint8 (SB3's CnnPolicy; channels first, as the policy sees them), or one
    key of a dict observation. Batches are drawn inside its bounds, in its dtype."""

    name: str  # "obs", ML-Agents' "obs_0".., or the key of a dict observation
    shape: tuple[int, ...]  # of one row, e.g. (4,) or (4, 84, 84)
    dtype: ObsDtype = "float32"
    low: tuple[float, ...] | None = None  # flattened (size values), inf allowed; None: unbounded
    high: tuple[float, ...] | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def zeros(self, rows: int) -> np.ndarray:
        return np.zeros((rows, *self.shape), dtype=self.dtype)

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class PolicyInfo:
    """What a policy is and where its bytes came from; recorded with every result."""

    name: str  # what the user asked for: a registry name or a path
    source: str  # "sb3-zip", "mlagents-onnx", "onnx-graph", "mlagents-pt", "synthetic"
    action_kind: ActionKind
    inputs: tuple[ObsInput, ...]  # in the order the policy's forward takes them
    action_size: int  # number of discrete actions, or continuous action dimensions
    sha256: str  # of the file; of the generating recipe for synthetic policies
    synthetic: bool = False
    env_id: str | None = None  # environment for closed-loop episodes, when the policy has one
    onnx_path: str | None = None  # onnxruntime reference, when the policy came as ONNX
    onnx_outputs: tuple[tuple[str, str], ...] = ()  # (graph tensor, "logits" | "mu" | "action") the reference reads
    detail: str = ""  # e.g. "SB3 1.0rc0, Tanh, pi [64, 64]"
    env_source: str = ""  # where env_id came from: "built in", "RL Zoo args.yml", "model card", "--env", ...
    obs_normalization: str = ""  # what normalizes observations inside the policy, e.g. "VecNormalize (vecnormalize.pkl)"
    env_setup: EnvSetup = PLAIN  # how env_id is made: its keyword arguments, wrappers, frames stacked
    published: PublishedScore | None = None  # the score the policy's files say it was published with on env_id
    env_renamed_from: str = ""  # the id the files named, where gymnasium renamed it env_id (harness/envs/renames.py)

    @property
    def obs_sizes(self) -> tuple[int, ...]:
        """Each input's values, flattened."""
        return tuple(i.size for i in self.inputs)

    @property
    def obs_size(self) -> int:
        return sum(self.obs_sizes)


class ObservationNormalizer(nn.Module):
    """clamp((x - mean) / std, -clip, clip), with statistics kept as buffers. It stays float32
    whatever the card's dtype (float64 in the golden): its sums and counts are what overflow."""

    clip: float

    def std(self) -> torch.Tensor:
        raise NotImplementedError

    def mean(self) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp((x - self.mean()) / self.std(), -self.clip, self.clip)

    def clamp_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The observations that normalize to exactly -clip and +clip, in float64."""
        mean, std = (t.detach().cpu().double().numpy() for t in (self.mean(), self.std()))
        return mean - self.clip * std, mean + self.clip * std


class Normalizer(ObservationNormalizer):
    """ML-Agents running normalizer: clamp((x - mean) / sqrt(variance_sum / steps), -5, 5).

    `running_variance` is an accumulated sum, not a variance; guessing sqrt(var + eps) gives
    errors in the hundreds. The buffers stay float32 whatever the policy dtype: in float16 the
    sums (about 1e5) and the step count (about 2e6) overflow to inf and inf / inf is NaN.
    """

    clip = NORMALIZER_CLAMP
    running_mean: torch.Tensor
    running_variance: torch.Tensor
    normalization_steps: torch.Tensor

    def __init__(self, mean: torch.Tensor, variance_sum: torch.Tensor, steps: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("running_mean", mean.detach().clone().float())
        self.register_buffer("running_variance", variance_sum.detach().clone().float())
        self.register_buffer("normalization_steps", steps.detach().clone().float().reshape(()))

    def mean(self) -> torch.Tensor:
        return self.running_mean

    def std(self) -> torch.Tensor:
        return torch.sqrt(self.running_variance / self.normalization_steps)


class PolicyNet(nn.Module):
    """float32 observations in (one tensor per input), float32 logits or mu out (float64 in the
    golden).

    Named children (`normalizer`, `body.0`, `body.1`, ..., `head`) are what a layer-by-layer
    divergence search hooks into, so they are part of the contract. The body is any module: an
    MLP built by `mlp()`, or a graph rebuilt from ONNX.
    """

    log_sigma: torch.Tensor | None

    def __init__(
        self,
        info: PolicyInfo,
        body: nn.Module,
        head: nn.Module,
        normalizer: nn.Module | None = None,
        log_sigma: torch.Tensor | None = None,
        action_clip: float | None = None,
    ) -> None:
        super().__init__()
        self.info = info
        self.normalizer = normalizer
        self.body = body
        self.head = head
        if log_sigma is not None:
            self.register_buffer("log_sigma", log_sigma.detach().clone().float())
        else:
            self.log_sigma = None
        # ML-Agents: action = clip(mu, -3, 3) / 3. None: the action is mu itself (SB3 Box).
        self.action_clip = action_clip
        # What the body and head compute in, and what goes in and comes out: float32, or the
        # golden's float64 throughout. Set by `cast_policy`, never guessed from a weight.
        self.compute_dtype = torch.float32
        self.io_dtype = torch.float32
        # Inference only: no autograd graph behind the outputs, whoever calls forward.
        self.requires_grad_(False)
        self.eval()

    def forward(self, *obs: torch.Tensor) -> torch.Tensor:
        if len(obs) != len(self.info.obs_sizes):
            raise ValueError(f"{self.info.name} takes {len(self.info.obs_sizes)} observation inputs, got {len(obs)}")
        x = (torch.cat(obs, dim=-1) if len(obs) > 1 else obs[0]).to(self.io_dtype)
        if self.normalizer is not None:
            x = self.normalizer(x)
        x = self.body(x.to(self.compute_dtype))
        out: torch.Tensor = self.head(x)
        return out.to(self.io_dtype)

    def bounded_outputs(self) -> frozenset[str]:
        """Outputs whose range the policy itself bounds: ML-Agents' clipped actions lie in [-1, 1]."""
        return frozenset({"action", "stochastic_action"}) if self.action_clip is not None else frozenset()

    def deterministic_action(self, head_out: torch.Tensor) -> torch.Tensor:
        if self.info.action_kind == "discrete":
            return torch.argmax(head_out, dim=-1)
        return self._squash(head_out)

    def stochastic_action(self, head_out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Sample with noise the caller made on the CPU, so every card draws the same sample.

        Discrete: Gumbel-max, argmax(logits + g) with g ~ Gumbel(0, 1), which samples the
        categorical distribution exactly. Continuous: mu + z * exp(log_sigma), z ~ N(0, I).
        """
        if self.info.action_kind == "discrete":
            return torch.argmax(head_out + noise, dim=-1)
        sigma = torch.exp(self.log_sigma) if self.log_sigma is not None else torch.ones_like(head_out)
        return self._squash(head_out + noise * sigma)

    def _squash(self, x: torch.Tensor) -> torch.Tensor:
        if self.action_clip is None:
            return x
        return torch.clamp(x, -self.action_clip, self.action_clip) / self.action_clip


def cast_policy(policy: PolicyNet, dtype: str) -> PolicyNet:
    """A copy that computes in `dtype`.

    A card dtype: every parameter and constant of the body and the head takes it; the normalizer
    and `log_sigma` stay float32, and observations go in and outputs come out as float32 (a
    naive `.to(float16)` of the whole model overflows ML-Agents' normalizer sums to inf). The
    golden (`GOLDEN`, float64): everything, normalizer and head included, and the output too.
    `REDUCED_FLOAT32`: float32 with its matmul inputs rounded as TF32, HF32, ... do.
    """
    if dtype in REDUCED_FLOAT32:
        from harness.policies.matmul_precision import reduce_float32_matmuls

        return reduce_float32_matmuls(cast_policy(policy, "float32"), REDUCED_FLOAT32[dtype])
    cast = copy.deepcopy(policy)
    if dtype == GOLDEN:
        cast.double()
        cast.compute_dtype = cast.io_dtype = torch.float64
        return cast
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join([*DTYPES, *REDUCED_FLOAT32, GOLDEN])}")
    for part in (cast.body, cast.head):
        part.to(DTYPES[dtype])
    cast.compute_dtype = DTYPES[dtype]
    return cast


def mlp(sizes: list[int], activation: type[nn.Module]) -> nn.Sequential:
    """Linear, activation, Linear, activation, ... for consecutive `sizes` (the body, no head)."""
    layers: list[nn.Module] = []
    for n_in, n_out in itertools.pairwise(sizes):
        layers += [nn.Linear(n_in, n_out), activation()]
    return nn.Sequential(*layers)
