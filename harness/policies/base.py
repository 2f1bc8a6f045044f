"""The one torch module every loader produces, and the dtype rule applied to it.

A policy is: an optional observation normalizer -> optional features (a CNN, a dict observation's
extractors) -> a body -> a head. The head output is `logits` for a categorical policy, `q_values`
for a Q-network and `mu` for continuous actions; actions come from it by one rule per kind of
sampling (`SamplingKind`). Loaders only fill in weights; how a forward runs in float16, bfloat16
or the float64 golden is decided here, once, for every format.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, assert_never

import numpy as np
import torch
from torch import nn

from harness.dtypes import CARD_DTYPES, GOLDEN_DTYPE, REDUCED_FLOAT32, split_kept
from harness.policies.policy_files import PLAIN, EnvSetup, PublishedScore

ActionKind = Literal["discrete", "multi_discrete", "continuous"]
"""One discrete choice among `action_size` actions; several at once, one per branch
(`PolicyInfo.branches`: ML-Agents' discrete branches, gymnasium's MultiDiscrete); or a vector."""

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in CARD_DTYPES}
"""The dtypes a card computes in, as torch dtypes."""


# ML-Agents clamps normalized observations to this range (ml-agents/trainers/torch/networks.py).
NORMALIZER_CLAMP = 5.0
# SB3's StateDependentNoiseDistribution `epsilon`, which its expln std adds to the positive part.
SDE_EPSILON = 1e-6
# SB3's preprocess_obs divides image observations by this when normalize_images is set.
IMAGE_SCALE = 255.0
# sb3-contrib's MaskableCategorical puts this logit on a masked action (`HUGE_NEG`): finite, so a
# masked row's scores stay numbers the judge can measure, and below any logit a policy computes.
MASKED_LOGIT = -1e8

# What a batch feeds a policy besides its observations, after them, in this order
# (`PolicyInfo.step_inputs`): where a recurrent policy's episodes start (bool, (rows,)), and which
# actions a masked policy may take (bool, (rows, actions)).
EPISODE_START = "episode_start"
ACTION_MASK = "action_mask"


class SamplingKind(StrEnum):
    """How a policy's stochastic action is drawn, and so which noise the CPU draws for each row
    (harness/workloads.py `make_noise`)."""

    DISTRIBUTION = "distribution"
    """The head's own distribution: categorical over the logits (Gumbel-max), Gaussian around mu."""
    EPSILON_GREEDY = "epsilon-greedy"
    """A Q-network's: a uniform random action with probability epsilon, else the greedy one."""
    STATE_DEPENDENT = "gsde"
    """SB3's gSDE: mu + latent @ (E * std), with E ~ N(0, I) an exploration matrix per row."""
    DETERMINISTIC = "deterministic"
    """None: SB3's predict ignores `deterministic` for TD3, DDPG and ARS, so the sample is the action."""


@dataclass(frozen=True)
class Sampling:
    """A policy's stochastic action rule, with what its noise needs to know."""

    kind: SamplingKind = SamplingKind.DISTRIBUTION
    epsilon: float = 0.0  # EPSILON_GREEDY: the probability of a uniform random action
    latent_size: int = 0  # STATE_DEPENDENT: rows of each exploration matrix (the body's output size)
    expln: bool = False  # STATE_DEPENDENT: SB3's use_expln std in place of exp(log_std)
    source: str = ""  # where a parameter came from, e.g. "exploration_final_eps"

    def describe(self) -> str:
        match self.kind:
            case SamplingKind.DISTRIBUTION:
                return "sampled from the head's distribution"
            case SamplingKind.EPSILON_GREEDY:
                return f"epsilon-greedy, epsilon {self.epsilon:g}" + (f" ({self.source})" if self.source else "")
            case SamplingKind.STATE_DEPENDENT:
                return f"gSDE, exploration matrix {self.latent_size} x actions" + (", expln std" if self.expln else "")
            case SamplingKind.DETERMINISTIC:
                return "deterministic (the sampled action is the action, as SB3's predict gives it)"
            case _:
                assert_never(self.kind)


ObsDtype = Literal["float32", "uint8", "int64"]


@dataclass(frozen=True)
class Memory:
    """A recurrent policy's LSTM state, (h, c), each (layers, rows, hidden): carried from step to
    step of an episode and reset to zeros where one starts, as sb3-contrib's predict does."""

    layers: int
    hidden: int

    def describe(self) -> str:
        return f"LSTM {self.layers} x {self.hidden}"


@dataclass(frozen=True)
class ObsInput:
    """One observation input, as the environment gives it and the policy takes it: a vector of
    floats, an image of uint8 (SB3's CnnPolicy; channels first, as the policy sees them), a
    vector of integers (int64: gymnasium's Discrete, MultiDiscrete or MultiBinary values, which
    the policy encodes itself, `encode_integers`), or one key of a dict observation. Batches are
    drawn inside its bounds, in its dtype."""

    name: str  # "obs", ML-Agents' "obs_0".., or the key of a dict observation
    shape: tuple[int, ...]  # of one row, e.g. (4,) or (4, 84, 84)
    dtype: ObsDtype = "float32"
    low: tuple[float, ...] | None = None  # flattened (size values), inf allowed; None: unbounded (int64: `value_range`)
    high: tuple[float, ...] | None = None
    classes: tuple[int, ...] = ()  # int64: each value's classes, one-hot encoded; () for zeros and ones as floats

    def __post_init__(self) -> None:
        if self.classes and (self.dtype != "int64" or self.shape != (len(self.classes),)):
            wanted = f"int64 values of shape ({len(self.classes)},)"
            raise ValueError(f"input {self.name}: one-hot classes {list(self.classes)} need {wanted}")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def width(self) -> int:
        """The values the network takes of it: its one-hot encodings' where it has classes, else its size."""
        return sum(self.classes) if self.classes else self.size

    def value_range(self) -> tuple[np.ndarray, np.ndarray]:
        """An int64 input's least and greatest values, int64 (size,): 0 to its classes - 1, or 0
        to 1 (zeros and ones). Made when asked, not at load: a MultiBinary's size comes from the
        file, and only the weights, checked first, bound it."""
        high = np.asarray(self.classes, dtype=np.int64) - 1 if self.classes else np.ones(self.size, dtype=np.int64)
        return np.zeros(self.size, dtype=np.int64), high

    def one_hot(self) -> tuple[np.ndarray, np.ndarray]:
        """(the value each one-hot column reads, the class it stands for), int64, the columns of
        every value side by side in order: column j is 1 where value columns[j] equals classes[j]."""
        columns = np.repeat(np.arange(len(self.classes), dtype=np.int64), self.classes)
        values = np.concatenate([np.arange(n, dtype=np.int64) for n in self.classes])
        return columns, values

    def zeros(self, rows: int) -> np.ndarray:
        return np.zeros((rows, *self.shape), dtype=self.dtype)

    def describe(self) -> dict[str, object]:
        classes = {"one_hot_classes": list(self.classes)} if self.classes else {}
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, **classes}


def encode_integers(x: torch.Tensor, one_hot: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """An int64 input as SB3's `preprocess_obs` gives it to the network, float32: a Discrete's
    value one-hot over its classes (a MultiDiscrete's each over its own, side by side, in axis
    order; `one_hot`: `ObsInput.one_hot` on x's device), a MultiBinary's zeros and ones as they
    are (`one_hot` None). One-hot as a comparison with the classes, which every backend and ONNX
    opset has (`export_onnx` writes the same Gather and Equal)."""
    if one_hot is None:
        return x.to(torch.float32)
    columns, values = one_hot
    return (x.index_select(1, columns) == values).to(torch.float32)


def branch_starts(branches: tuple[int, ...]) -> tuple[int, ...]:
    """Each discrete branch's first column, where the branches' actions (logits, masks) lie side
    by side in the order of `branches`."""
    return tuple(int(first) for first in np.cumsum((0, *branches[:-1])))


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
    onnx_outputs: tuple[tuple[str, str], ...] = ()  # (graph tensor, "logits" | "mu" | "action" | "memory") the reference reads
    onnx_memory: tuple[str, str] | None = None  # a recurrent graph's (state input, state output), fed back by the reference
    detail: str = ""  # e.g. "SB3 1.0rc0, Tanh, pi [64, 64]"
    env_source: str = ""  # where env_id came from: "built in", "RL Zoo args.yml", "model card", "--env", ...
    obs_normalization: str = ""  # what normalizes observations inside the policy, e.g. "VecNormalize (vecnormalize.pkl)"
    env_setup: EnvSetup = PLAIN  # how env_id is made: its keyword arguments, wrappers, frames stacked
    published: PublishedScore | None = None  # the score the policy's files say it was published with on env_id
    env_renamed_from: str = ""  # the id the files named, where gymnasium renamed it env_id (harness/envs/renames.py)
    sampling: Sampling = field(default_factory=Sampling)  # how its stochastic action is drawn
    memory: Memory | None = None  # a recurrent policy's state
    masked: bool = False  # takes action masks: a masked action is never chosen
    branches: tuple[int, ...] = ()  # multi_discrete: each branch's actions (they sum to action_size)

    def __post_init__(self) -> None:
        several = self.action_kind == "multi_discrete"
        if several != bool(self.branches) or (several and (len(self.branches) < 2 or sum(self.branches) != self.action_size)):
            raise ValueError(
                f"{self.name}: a multi_discrete policy has two branches or more, summing to its {self.action_size} "
                f"actions, and only it has branches; got {self.action_kind} with branches {list(self.branches)}"
            )

    @property
    def branch_sizes(self) -> tuple[int, ...]:
        """The head's logits split by choice: the branches, or one branch of every action (discrete)."""
        return self.branches or (self.action_size,)

    @property
    def step_inputs(self) -> tuple[str, ...]:
        """What a batch feeds besides the observations, after them (`EPISODE_START`, `ACTION_MASK`)."""
        return ((EPISODE_START,) if self.memory is not None else ()) + ((ACTION_MASK,) if self.masked else ())

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


class KeptFloat32(nn.Module):
    """A layer of the body whose tensors (buffers, never parameters) stay float32 on a card
    (float64 in the golden), as the observation normalizer's do: it computes in its tensors'
    dtype and hands its output back in the dtype it was given. `cast_policy` keeps every such
    layer so."""


class BatchNorm(KeptFloat32):
    """Batch normalization in eval mode, from its running statistics: (x - mean) / sqrt(var + eps)
    * scale + bias, in the order sb3-contrib's BatchRenorm computes it (CrossQ's actor).

    Its statistics and affine stay float32 on a card, for two reasons. The statistics are
    those of the layer's input, and CrossQ's first one sits on the raw observation, whose
    variance can pass float16's 65504 (a MuJoCo humanoid's contact forces): a variance that
    overflows to inf zeroes its feature without a trace, the normalizer's failure. And it is how
    mixed precision runs a batch norm: cuDNN takes half inputs with float32 scale, bias and
    statistics, and NVIDIA's apex keeps batch norms in float32 under O2 (`keep_batchnorm_fp32`).
    """

    running_mean: torch.Tensor
    running_var: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor

    def __init__(self, mean: torch.Tensor, var: torch.Tensor, eps: float, scale: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        # Buffers, not parameters: constants of inference, and cast_policy's rule reads them so.
        for name, value in (("running_mean", mean), ("running_var", var), ("scale", scale), ("bias", bias)):
            self.register_buffer(name, value.detach().clone().float())
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x.to(self.running_mean.dtype) - self.running_mean) / (self.running_var + self.eps).sqrt()
        return (self.scale * y + self.bias).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.running_mean.numel()}, eps={self.eps:g}"


class PolicyNet(nn.Module):
    """Observations in (one tensor per input: float32, or uint8 images), float32 head outputs out
    (float64 in the golden).

    Named children (`normalizer`, `features`, `body.0`, `body.1`, ..., `head`) are what a
    layer-by-layer divergence search hooks into, so they are part of the contract. The body is
    any module: an MLP built by `mlp()`, or a graph rebuilt from ONNX. Without `features` the
    inputs are vectors, concatenated; with it, each input goes to the features as itself.
    """

    log_sigma: torch.Tensor | None
    action_low: torch.Tensor | None
    action_high: torch.Tensor | None

    def __init__(
        self,
        info: PolicyInfo,
        body: nn.Module,
        head: nn.Module,
        normalizer: nn.Module | None = None,
        log_sigma: torch.Tensor | None = None,
        action_clip: float | None = None,
        *,
        features: nn.Module | None = None,
        log_std: nn.Module | None = None,
        normalize_images: bool = False,
        action_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
        memory: nn.LSTM | None = None,
    ) -> None:
        super().__init__()
        if (memory is None) != (info.memory is None):
            raise ValueError("a recurrent policy's info describes its LSTM, and only a recurrent policy's does")
        if action_clip is not None and action_bounds is not None:
            raise ValueError("a policy squashes its actions one way: ML-Agents' clip or SB3's tanh, not both")
        self.info = info
        # Registered in the order they run, as the layer search reads them.
        self.normalizer = normalizer
        self.features = features
        # RecurrentPPO: an LSTM between the features and the body, stepped once per observation.
        self.memory = memory
        self.body = body
        self.head = head
        # SAC and TQC: the Gaussian's log std is a layer of the body's output (clamped inside it).
        self.log_std = log_std
        # The Gaussian's free log std: (actions,), or gSDE's (latent, actions or 1). Float32 always.
        self._float32_buffer("log_sigma", log_sigma)
        # ML-Agents: action = clip(mu, -3, 3) / 3. None: the action is mu itself (SB3 Box).
        self.action_clip = action_clip
        # SB3's squashed policies: tanh, then unscale_action to the action space's [low, high].
        low, high = action_bounds if action_bounds is not None else (None, None)
        self._float32_buffer("action_low", low)
        self._float32_buffer("action_high", high)
        # SB3's preprocess_obs: uint8 image inputs divided by 255, in float32 before the features.
        self.normalize_images = normalize_images
        # What the body and head compute in, and what goes in and comes out: float32, or the
        # golden's float64 throughout. Set by `cast_policy`, never guessed from a weight.
        self.compute_dtype = torch.float32
        self.io_dtype = torch.float32
        # What the body (or the features) is fed: the compute dtype, or under a precision plan
        # (harness/policies/keep_float32.py) the io dtype, each layer casting its own input.
        self.feed_dtype: torch.dtype | None = None
        # The integer inputs' one-hot columns and classes by (input, device) (`_one_hot_on`).
        self._one_hot: dict[tuple[ObsInput, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        # Inference only: no autograd graph behind the outputs, whoever calls forward.
        self.requires_grad_(False)
        self.eval()

    def _float32_buffer(self, name: str, value: torch.Tensor | None) -> None:
        if value is not None:
            self.register_buffer(name, value.detach().clone().float())
        else:
            setattr(self, name, None)

    def forward(self, *obs: torch.Tensor) -> torch.Tensor:
        return self.latent_and_head(*obs)[1]

    def latent_and_head(self, *obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The body's output (what gSDE and SAC's log std read, in the compute dtype) and the head's.
        A recurrent policy takes each row as the first step of an episode (zero state), as
        sb3-contrib's predict does without a state."""
        if self.memory is None:
            return self._body_and_head(self._features_of(obs))
        rows = obs[0].shape[0]
        starts = torch.ones(rows, dtype=torch.bool, device=obs[0].device)
        latent, head, _ = self.step(obs, self.zero_state(rows), starts)
        return latent, head

    def zero_state(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A recurrent policy's state before any step: (h, c) zeros, (layers, rows, hidden), in the compute dtype."""
        if self.memory is None or self.info.memory is None:
            raise ValueError(f"{self.info.name} is not recurrent: it has no state")
        shape = (self.info.memory.layers, rows, self.info.memory.hidden)
        device = next(self.memory.parameters()).device
        zeros = torch.zeros(shape, dtype=self.compute_dtype, device=device)
        return zeros, zeros.clone()

    def step(
        self, obs: tuple[torch.Tensor, ...], state: tuple[torch.Tensor, torch.Tensor], starts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One step of a recurrent policy for each row: the latent, the head and the state after it.
        The state of a row whose episode starts (`starts`, bool (rows,)) is zeroed first, as
        sb3-contrib's _process_sequence does it: multiplied by (1 - episode_start)."""
        if self.memory is None:
            raise ValueError(f"{self.info.name} is not recurrent: it has no state to step")
        h, c = state
        keep = (~starts).to(h.dtype).view(1, -1, 1)
        x = self._features_of(obs).to(self.compute_dtype)
        out, (h, c) = self.memory(x.unsqueeze(0), (keep * h, keep * c))
        latent, head = self._body_and_head(out[0])
        return latent, head, (h, c)

    def _features_of(self, obs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if len(obs) != len(self.info.inputs):
            raise ValueError(f"{self.info.name} takes {len(self.info.inputs)} observation inputs, got {len(obs)}")
        obs = tuple(
            encode_integers(o, self._one_hot_on(inp, o.device)) if inp.dtype == "int64" else o
            for o, inp in zip(obs, self.info.inputs, strict=True)
        )
        if self.features is None:
            x = (torch.cat(obs, dim=-1) if len(obs) > 1 else obs[0]).to(self.io_dtype)
            if self.normalizer is not None:
                x = self.normalizer(x)
            return x
        out: torch.Tensor = self.features(*self._preprocessed(obs))
        return out

    def _one_hot_on(self, inp: ObsInput, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`inp`'s one-hot columns and classes on `device` (None: zeros and ones, no one-hot),
        made once per input and device: a forward then moves nothing to the card but its inputs,
        as the bench times it."""
        if not inp.classes:
            return None
        if (inp, device) not in self._one_hot:
            columns, values = inp.one_hot()
            self._one_hot[inp, device] = (torch.from_numpy(columns).to(device), torch.from_numpy(values).to(device))
        return self._one_hot[inp, device]

    def _body_and_head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        latent = self.body(x.to(self.feed_dtype or self.compute_dtype))
        out: torch.Tensor = self.head(latent)
        return latent, out.to(self.io_dtype)

    def masked_scores(self, head_out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """A masked policy's logits with `MASKED_LOGIT` on every action its row's mask forbids, as
        sb3-contrib's MaskableCategorical holds them; unmasked policies' head as it is."""
        if mask is None:
            return head_out
        return torch.where(mask, head_out, torch.tensor(MASKED_LOGIT, dtype=head_out.dtype, device=head_out.device))

    def _preprocessed(self, obs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """Each input as the features take it, in the compute dtype. Before that, in the io dtype:
        the float inputs through the normalizer, which sees them flattened and concatenated as a
        vector policy's, and the images divided by 255 where the policy says so."""
        x = [o.to(self.io_dtype) for o in obs]
        floats = [i for i, inp in enumerate(self.info.inputs) if inp.dtype == "float32"]
        if self.normalizer is not None:
            flat = self.normalizer(torch.cat([x[i].flatten(1) for i in floats], dim=1))
            for i, part in zip(floats, flat.split([self.info.inputs[i].size for i in floats], dim=1), strict=True):
                x[i] = part.reshape(x[i].shape)
        if self.normalize_images:
            x = [t / IMAGE_SCALE if inp.dtype == "uint8" else t for t, inp in zip(x, self.info.inputs, strict=True)]
        return [t.to(self.feed_dtype or self.compute_dtype) for t in x]

    def head_output(self) -> str:
        """The head's output, named for what it is: a Box policy's `mu`, a Q-network's `q_values`
        (the discrete policies that explore epsilon-greedily), a categorical policy's `logits`
        (a multi-discrete policy's: its branches' concatenated)."""
        kind = self.info.action_kind
        match kind:
            case "continuous":
                return "mu"
            case "discrete" | "multi_discrete":
                return "q_values" if self.info.sampling.kind is SamplingKind.EPSILON_GREEDY else "logits"
            case _:
                assert_never(kind)

    def bounded_outputs(self) -> frozenset[str]:
        """Outputs whose range the policy itself bounds: ML-Agents' clipped actions lie in [-1, 1],
        SB3's squashed ones in the action space's bounds."""
        if self.action_clip is not None or self.action_low is not None:
            return frozenset({"action", "stochastic_action"})
        return frozenset()

    def deterministic_action(self, head_out: torch.Tensor) -> torch.Tensor:
        """The argmax (discrete: (rows,); multi-discrete: one per branch, (rows, branches)), or the squashed mean."""
        kind = self.info.action_kind
        match kind:
            case "discrete":
                return torch.argmax(head_out, dim=-1)
            case "multi_discrete":
                return self._branch_argmax(head_out)
            case "continuous":
                return self._squash(head_out)
            case _:
                assert_never(kind)

    def _branch_argmax(self, scores: torch.Tensor) -> torch.Tensor:
        """Each branch's argmax, (rows, branches): SB3's MultiCategoricalDistribution.mode, ML-Agents' ArgMax per branch."""
        return torch.stack(
            [torch.argmax(part, dim=-1) for part in torch.split(scores, list(self.info.branches), dim=-1)], dim=-1
        )

    def stochastic_action(
        self, head_out: torch.Tensor, noise: torch.Tensor, latent: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sample with noise the caller made on the CPU, so every card draws the same sample.

        Discrete: argmax(head + noise). With Gumbel(0, 1) noise that samples the categorical
        exactly (Gumbel-max); epsilon-greedy noise is 0, or a score beyond any Q-value on the
        row's random action. Multi-discrete: the same per branch. Continuous: mu + z * sigma,
        z ~ N(0, I), sigma from `log_sigma` or SAC's `log_std` layer; gSDE: mu + latent @ (E * std).
        `latent` is the body's output.
        """
        if self.info.sampling.kind is SamplingKind.DETERMINISTIC:
            return self.deterministic_action(head_out)
        kind = self.info.action_kind
        match kind:
            case "discrete":
                return torch.argmax(head_out + noise, dim=-1)
            case "multi_discrete":
                return self._branch_argmax(head_out + noise)
            case "continuous":
                return self._squash(head_out + self._continuous_noise(head_out, noise, latent))
            case _:
                assert_never(kind)

    def _continuous_noise(self, head_out: torch.Tensor, noise: torch.Tensor, latent: torch.Tensor | None) -> torch.Tensor:
        kind = self.info.sampling.kind
        match kind:
            case SamplingKind.DISTRIBUTION:
                return noise * self._sigma(head_out, latent)
            case SamplingKind.STATE_DEPENDENT:
                # SB3's get_noise with one exploration matrix per row: bmm(latent, E * std).
                rows = self._latent(latent).to(self.io_dtype).unsqueeze(1)
                return torch.bmm(rows, noise * self._sde_std()).squeeze(1)
            case SamplingKind.EPSILON_GREEDY | SamplingKind.DETERMINISTIC:
                raise ValueError(f"{self.info.name}: {kind} sampling adds no noise to continuous actions")
            case _:
                assert_never(kind)

    def _sigma(self, head_out: torch.Tensor, latent: torch.Tensor | None) -> torch.Tensor:
        if self.log_std is not None:
            return torch.exp(self.log_std(self._latent(latent)).to(self.io_dtype))
        if self.log_sigma is not None:
            return torch.exp(self.log_sigma)
        return torch.ones_like(head_out)

    def _sde_std(self) -> torch.Tensor:
        """SB3's StateDependentNoiseDistribution.get_std, (latent, actions or 1)."""
        log_std = self.log_sigma
        if log_std is None:
            raise ValueError(f"{self.info.name}: gSDE sampling without a log std")
        if not self.info.sampling.expln:
            return torch.exp(log_std)
        # expln keeps the std above zero and growing slowly: exp below 0, log1p(x) + 1 above.
        below = torch.exp(log_std) * (log_std <= 0)
        safe = log_std * (log_std > 0) + SDE_EPSILON
        return below + (torch.log1p(safe) + 1.0) * (log_std > 0)

    def _latent(self, latent: torch.Tensor | None) -> torch.Tensor:
        if latent is None:
            raise ValueError(f"{self.info.name}: its sampling reads the body's output; pass latent")
        return latent

    def _squash(self, x: torch.Tensor) -> torch.Tensor:
        if self.action_clip is not None:
            return torch.clamp(x, -self.action_clip, self.action_clip) / self.action_clip
        if self.action_low is not None and self.action_high is not None:
            # SB3's unscale_action, in its order of operations: low + 0.5 * (a + 1) * (high - low).
            return self.action_low + 0.5 * (torch.tanh(x) + 1.0) * (self.action_high - self.action_low)
        return x


def cast_policy(policy: PolicyNet, dtype: str) -> PolicyNet:
    """A copy that computes in `dtype`.

    A card dtype: every parameter and constant of the layers (features, convolutions included,
    body, head, SAC's log std) takes it; the normalizer, `log_sigma`, the action bounds and every
    `KeptFloat32` layer (batch norms) stay float32, as do image scaling and the sampling
    arithmetic, and observations go in and outputs come out as float32 (a naive `.to(float16)`
    of the whole model overflows ML-Agents' normalizer sums to inf). The golden (`GOLDEN_DTYPE`,
    float64): everything, normalizer and head included, and the output too.
    `REDUCED_FLOAT32`: float32 with its matmul inputs rounded as TF32, HF32, ... do.
    A plan (`float16+fp32[body.0]`): the dtype, with those layers computed in float32.
    """
    base, float32_layers = split_kept(dtype)
    if float32_layers:
        from harness.policies.keep_float32 import keep_float32

        mixed = keep_float32(cast_policy(policy, base), policy, float32_layers)
        mixed.feed_dtype = mixed.io_dtype
        return mixed
    if dtype in REDUCED_FLOAT32:
        from harness.policies.matmul_precision import reduce_float32_matmuls

        return reduce_float32_matmuls(cast_policy(policy, "float32"), REDUCED_FLOAT32[dtype])
    cast = copy.deepcopy(policy)
    if dtype == GOLDEN_DTYPE:
        cast.double()
        cast.compute_dtype = cast.io_dtype = torch.float64
        return cast
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join([*DTYPES, *REDUCED_FLOAT32, GOLDEN_DTYPE])}")
    # The float32 tensors themselves, put back after the cast: cast to float16 and back, a
    # statistic past 65504 would come back inf.
    kept = [
        (module, dict(module.named_buffers(recurse=False))) for module in cast.modules() if isinstance(module, KeptFloat32)
    ]
    for name, part in cast.named_children():
        if name != "normalizer":
            part.to(DTYPES[dtype])
    for module, buffers in kept:
        for key, tensor in buffers.items():
            setattr(module, key, tensor)
    cast.compute_dtype = DTYPES[dtype]
    return cast


def mlp(sizes: list[int], activation: type[nn.Module]) -> nn.Sequential:
    """Linear, activation, Linear, activation, ... for consecutive `sizes` (the body, no head)."""
    layers: list[nn.Module] = []
    for n_in, n_out in itertools.pairwise(sizes):
        layers += [nn.Linear(n_in, n_out), activation()]
    return nn.Sequential(*layers)
