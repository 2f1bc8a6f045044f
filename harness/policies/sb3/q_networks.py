"""DQN and QR-DQN: a Q-network, argmax over its Q-values; epsilon-greedy when sampled.

DQN's `q_net` is features -> an MLP whose last layer gives one Q-value per action. QR-DQN's
`quantile_net` gives n_quantiles per action; its Q-values are their mean, as its `_predict`
takes them. The target networks are not read. The stochastic action explores with the save's
`exploration_final_eps`, the rate a finished training run leaves behind.
"""

from __future__ import annotations

import torch
from torch import nn

from harness.errors import PolicyLoadError
from harness.policies.base import Sampling, SamplingKind
from harness.policies.sb3.layers import NATURE, Features, linear_chain, mlp_of
from harness.policies.sb3.save import Actor, Save

DEFAULT_ACTIVATION = "ReLU"
# SB3's default net_arch: none over NatureCNN's features, two layers of 64 otherwise.
DEFAULT_NET_ARCH = [64, 64]


class QuantileMean(nn.Module):
    """QR-DQN's Q-values: the quantiles, (n_quantiles, actions) per row, averaged."""

    def __init__(self, n_quantiles: int, n_actions: int) -> None:
        super().__init__()
        self.n_quantiles, self.n_actions = n_quantiles, n_actions

    def forward(self, quantiles: torch.Tensor) -> torch.Tensor:
        return quantiles.view(-1, self.n_quantiles, self.n_actions).mean(dim=1)

    def extra_repr(self) -> str:
        return f"n_quantiles={self.n_quantiles}, n_actions={self.n_actions}"


def dqn(save: Save) -> Actor:
    features, layers, activation = _network(save, "q_net", save.action.size)
    save.weights.check_all_taken(("q_net_target.",), "a DQN policy")
    return _actor(save, features, mlp_of(layers[:-1], activation), layers[-1], f"q_net, {activation}")


def qrdqn(save: Save) -> Actor:
    n_actions = save.action.size
    features, layers, activation = _network(save, "quantile_net", None)
    outputs = layers[-1].out_features
    declared = save.data.get("n_quantiles", save.kwargs.get("n_quantiles"))
    if outputs % n_actions or (isinstance(declared, int) and declared * n_actions != outputs):
        said = f"{declared} quantiles" if isinstance(declared, int) else "its quantiles"
        problem = f"quantile_net's last layer gives {outputs} values, not {said} for each of {n_actions} actions"
        raise PolicyLoadError(save.path, problem)
    n_quantiles = outputs // n_actions
    head = nn.Sequential(layers[-1], QuantileMean(n_quantiles, n_actions))
    save.weights.check_all_taken(("quantile_net_target.",), "a QR-DQN policy")
    what = f"quantile_net ({n_quantiles} quantiles), {activation}"
    return _actor(save, features, mlp_of(layers[:-1], activation), head, what)


def _network(save: Save, name: str, n_out: int | None) -> tuple[Features, list[nn.Linear], str]:
    """The network `name` (q_net, quantile_net): its features and its MLP's Linear layers, the
    last giving `n_out` values where that is known."""
    save.check_actions("discrete")
    features = save.features(f"{name}.features_extractor.")
    layers = linear_chain(save.weights, f"{name}.{name}.", features.size, why=f"{name} on {features.size} features")
    if not layers:
        raise PolicyLoadError(save.path, f"policy.pth has no {name}.{name} layers")
    if n_out is not None and layers[-1].out_features != n_out:
        problem = f"{name}'s last layer gives {layers[-1].out_features} values, not one for each of {n_out} actions"
        raise PolicyLoadError(save.path, problem)
    hidden = [layer.out_features for layer in layers[:-1]]
    save.check_hidden(hidden, [] if save.extractor == NATURE else DEFAULT_NET_ARCH, name)
    return features, layers, save.activation(DEFAULT_ACTIVATION)


def _actor(save: Save, features: Features, body: nn.Sequential, head: nn.Module, what: str) -> Actor:
    epsilon = save.data.get("exploration_final_eps")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0.0 <= epsilon <= 1.0:
        raise PolicyLoadError(save.path, f"data's exploration_final_eps is {epsilon!r}, expected a number in [0, 1]")
    sampling = Sampling(SamplingKind.EPSILON_GREEDY, epsilon=float(epsilon), source="exploration_final_eps")
    hidden = [m.out_features for m in body if isinstance(m, nn.Linear)]
    parts = [save.policy_class.name, *([features.detail] if features.detail else []), f"{what} {hidden}"]
    return Actor(features, body, head, sampling, detail=", ".join(parts))
