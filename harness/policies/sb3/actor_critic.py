"""PPO, A2C and TRPO: SB3's ActorCriticPolicy (MlpPolicy, CnnPolicy, MultiInputPolicy); and
sb3-contrib's two kinds of it, RecurrentPPO's and MaskablePPO's.

The actor path is features -> shared layers (SB3 1.x) -> policy layers -> `action_net`; the
critic (value_net, the value layers, a separate vf_features_extractor) is not read. A Box
action's log std is a free `log_std`: (actions,) for a Gaussian, (latent, actions or 1) with
gSDE, whose exploration matrix multiplies the policy layers' output; gSDE may squash with tanh.

RecurrentActorCriticPolicy puts an LSTM (`lstm_actor`) between the features and the policy
layers; the critic's (`lstm_critic` with enable_critic_lstm, the actor's own with shared_lstm,
else a Linear `critic`) is not read. MaskableActorCriticPolicy is the same network, its
Categorical told which actions are legal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from harness.errors import PolicyLoadError
from harness.policies.base import Sampling, SamplingKind
from harness.policies.sb3.archive import layer_sizes, net_arch, shown
from harness.policies.sb3.layers import NATURE, Weights, linear, mlp_of
from harness.policies.sb3.save import Actor, Save

# SB3's ActorCriticPolicy defaults (1.x and 2.x alike) when policy_kwargs leave them out; over
# NatureCNN's features the action layer comes straight after them.
DEFAULT_ACTIVATION = "Tanh"
DEFAULT_PI = [64, 64]
SHARED = "mlp_extractor.shared_net."
PI = "mlp_extractor.policy_net."
CRITIC = ("mlp_extractor.value_net.", "value_net.", "vf_features_extractor.")
LSTM = "lstm_actor."
RECURRENT_CRITIC = ("lstm_critic.", "critic.")
# sb3-contrib's RecurrentActorCriticPolicy's lstm_hidden_size when policy_kwargs leave it out.
DEFAULT_LSTM_HIDDEN = 256


@dataclass(frozen=True)
class Arch:
    """Hidden layer sizes of the actor path as the JSON declares them."""

    shared: list[int]  # SB3 1.x layers shared by actor and critic
    pi: list[int]

    @property
    def hidden(self) -> list[int]:
        return self.shared + self.pi

    def describe(self) -> str:
        return (f"shared {self.shared}, " if self.shared else "") + f"pi {self.pi}"


def build(save: Save) -> Actor:
    return _build(save, recurrent=False)


def recurrent(save: Save) -> Actor:
    return _build(save, recurrent=True)


def maskable(save: Save) -> Actor:
    save.check_actions("discrete")
    actor = _build(save, recurrent=False)
    return replace(actor, masked=True, detail=f"{actor.detail}, action masks")


def _build(save: Save, recurrent: bool) -> Actor:
    weights = save.weights
    # 2.x names the actor's extractor pi_features_extractor and keeps features_extractor, the
    # same module, beside it; 1.x has only features_extractor.
    pi_features = any(k.startswith("pi_features_extractor.") for k in weights.state)
    prefix = "pi_features_extractor." if pi_features else "features_extractor."
    features = save.features(prefix)
    activation = save.activation(DEFAULT_ACTIVATION)
    arch = _arch(save, has_shared=any(k.startswith(SHARED) for k in weights.state))
    memory = lstm(save, features.size) if recurrent else None
    sizes = [memory.hidden_size if memory is not None else features.size, *arch.hidden, save.action.size]
    layers = _actor_layers(weights, sizes, arch)
    body = mlp_of(layers[:-1], activation)
    head = layers[-1]
    sampling, log_sigma, squashed = _distribution(save, latent=sizes[-2])
    critic = (*CRITIC, *RECURRENT_CRITIC) if recurrent else CRITIC
    weights.check_all_taken((*critic, "features_extractor.") if pi_features else critic, "an actor-critic policy")
    parts = [save.policy_class.name, *([features.detail] if features.detail else []), activation]
    if memory is not None:
        parts.append(f"LSTM {memory.num_layers} x {memory.hidden_size}")
    parts.append(arch.describe())
    if squashed:
        parts.append("tanh-squashed")
    return Actor(features, body, head, sampling, log_sigma, squashed=squashed, detail=", ".join(parts), memory=memory)


def lstm(save: Save, n_in: int) -> nn.LSTM:
    """`lstm_actor`: its layers and width from policy.pth, checked against n_lstm_layers and
    lstm_hidden_size where data states them (sb3-contrib's defaults where it does not)."""
    weights, path = save.weights, save.path
    if not weights.has(f"{LSTM}weight_hh_l0"):
        raise PolicyLoadError(path, f"policy.pth has no {LSTM}weight_hh_l0: a recurrent policy without its LSTM")
    hidden = weights.state[f"{LSTM}weight_hh_l0"].shape[-1]
    layers = 0
    while weights.has(f"{LSTM}weight_ih_l{layers}"):
        layers += 1
    for name, held, default in (("lstm_hidden_size", hidden, DEFAULT_LSTM_HIDDEN), ("n_lstm_layers", layers, 1)):
        declared = save.number(name, default)
        if declared != held:
            raise PolicyLoadError(path, f"policy.pth's LSTM has {name} {held}, but data declares {declared:g}")
    module = nn.LSTM(n_in, hidden, num_layers=layers)
    why = f"an LSTM of {layers} layers, {n_in} features in, {hidden} wide"
    state = {}
    for k in range(layers):
        width = n_in if k == 0 else hidden
        for name, shape in (("weight_ih", (4 * hidden, width)), ("weight_hh", (4 * hidden, hidden))):
            state[f"{name}_l{k}"] = weights.take(f"{LSTM}{name}_l{k}", shape, why)
        for name in ("bias_ih", "bias_hh"):
            state[f"{name}_l{k}"] = weights.take(f"{LSTM}{name}_l{k}", (4 * hidden,), why)
    module.load_state_dict(state)
    return module


def _arch(save: Save, has_shared: bool) -> Arch:
    """Parse net_arch: 2.x dict(pi=, vf=); 1.x [shared ints..., dict(pi=, vf=)]; or a list of ints.

    A plain list of ints means shared layers in SB3 1.x and actor layers in 2.x; the network is
    the same, only the state-dict names differ, so `has_shared` (from policy.pth) picks the name.
    """
    path = save.path
    declared: Any = net_arch(path, save.kwargs)
    if declared is None:
        return Arch(shared=[], pi=[] if save.extractor == NATURE else list(DEFAULT_PI))
    if isinstance(declared, dict):
        return Arch(shared=[], pi=layer_sizes(path, declared.get("pi", [])))
    if not isinstance(declared, (list, tuple)):
        raise PolicyLoadError(path, f"cannot read net_arch {shown(declared)}")
    ints = [layer for layer in declared if not isinstance(layer, dict)]
    dicts = [layer for layer in declared if isinstance(layer, dict)]
    if len(dicts) > 1 or (dicts and declared[-1] is not dicts[0]):
        raise PolicyLoadError(path, f"cannot read net_arch {shown(declared)}: at most one dict, and it must come last")
    pi = layer_sizes(path, dicts[0].get("pi", [])) if dicts else []
    if dicts or has_shared:
        return Arch(shared=layer_sizes(path, ints), pi=pi)
    return Arch(shared=[], pi=layer_sizes(path, ints))


def _actor_layers(weights: Weights, sizes: list[int], arch: Arch) -> list[nn.Linear]:
    """The actor's Linear layers, shared, policy, then action_net, each checked against `sizes`."""
    names = _indexed(weights, SHARED) + _indexed(weights, PI) + ["action_net"]
    if len(names) != len(sizes) - 1:
        raise PolicyLoadError(
            weights.path,
            f"policy.pth has {len(names) - 1} hidden layers on the actor path but data's net_arch "
            f"({arch.describe()}) declares {len(sizes) - 2}",
        )
    why = f"data ({arch.describe()}, its observation and action spaces)"
    return [linear(weights, name, n_in, n_out, why) for name, n_in, n_out in zip(names, sizes[:-1], sizes[1:], strict=True)]


def _indexed(weights: Weights, prefix: str) -> list[str]:
    return [f"{prefix}{i}" for i in weights.indices(prefix)]


def _distribution(save: Save, latent: int) -> tuple[Sampling, torch.Tensor | None, bool]:
    """How a Box policy samples (Gaussian, or gSDE), its log std, and whether it squashes."""
    if save.action.kind in ("discrete", "multi_discrete"):
        return Sampling(), None, False
    weights, size = save.weights, save.action.size
    shape = weights.shape("log_std")
    use_sde = save.data.get("use_sde")
    if not isinstance(use_sde, bool):  # saves before SB3 recorded it: the log std's shape tells
        use_sde = shape is not None and len(shape) == 2
    if not use_sde:
        return Sampling(), weights.take("log_std", (size,), "a Gaussian policy without gSDE"), False
    full_std = save.flag("full_std", True)
    log_std = weights.take("log_std", (latent, size if full_std else 1), f"gSDE (full_std {full_std})")
    sampling = Sampling(SamplingKind.STATE_DEPENDENT, latent_size=latent, expln=save.flag("use_expln", False))
    return sampling, log_std, save.flag("squash_output", False)
