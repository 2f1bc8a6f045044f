"""What a family's builder is handed (`Save`: the parsed save) and what it gives back (`Actor`:
the parts of a PolicyNet). `sb3_zip` makes the one and assembles the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.errors import PolicyLoadError
from harness.policies.base import ActionKind, Sampling
from harness.policies.sb3 import archive
from harness.policies.sb3.archive import PolicyClass
from harness.policies.sb3.layers import Features, Weights, features
from harness.policies.sb3.spaces import ActionSpace, ObservationSpace


@dataclass(frozen=True)
class Save:
    """An SB3 save as a family reads it: `data`'s readable fields, the weights, the spaces."""

    path: Path
    data: dict[str, Any]
    kwargs: dict[str, Any]  # policy_kwargs
    policy_class: PolicyClass
    extractor: str  # the features extractor class, "module.Name"
    weights: Weights
    observation: ObservationSpace
    action: ActionSpace

    def features(self, prefix: str) -> Features:
        normalize_images = self.flag("normalize_images", True)
        return features(self.weights, prefix, self.extractor, self.observation, normalize_images)

    def activation(self, default: str) -> str:
        return archive.activation(self.path, self.kwargs, default)

    def flag(self, name: str, default: bool) -> bool:
        return archive.flag(self.path, self.kwargs, name, default)

    def number(self, name: str, default: float) -> float:
        return archive.number(self.path, self.kwargs, name, default)

    def check_actions(self, kind: ActionKind) -> None:
        """A family that acts in one kind of action space only, refusing the other."""
        if self.action.kind != kind:
            space = "a Discrete action space" if kind == "discrete" else "a Box action space"
            raise PolicyLoadError(self.path, f"{self.policy_class.name} acts in {space}, but the save's is not one")

    def check_hidden(self, hidden: list[int], default: list[int], where: str) -> None:
        """The hidden layer sizes policy.pth holds at `where` against net_arch's (a list, or a
        dict's `pi`; SB3's `default` where data declares none): SB3 would not load them apart."""
        declared: Any = archive.net_arch(self.path, self.kwargs)
        if isinstance(declared, dict):
            declared = declared.get("pi", [])
        sizes = default if declared is None else archive.layer_sizes(self.path, declared)
        if sizes != hidden:
            said = f"net_arch {sizes}" if declared is not None else f"no net_arch (SB3's default {sizes})"
            raise PolicyLoadError(self.path, f"policy.pth has hidden layers {hidden} at {where}, but data declares {said}")


@dataclass(frozen=True)
class Actor:
    """A family's rebuild of the policy's acting path, as PolicyNet's parts."""

    features: Features
    body: nn.Sequential
    head: nn.Module
    sampling: Sampling = field(default_factory=Sampling)
    log_sigma: torch.Tensor | None = None  # a free log std: (actions,), or gSDE's (latent, actions or 1)
    log_std: nn.Module | None = None  # SAC's: a layer of the body's output
    squashed: bool = False  # tanh, then rescaled to the action space's bounds (SB3's unscale_action)
    detail: str = ""  # e.g. "DQN q_net, ReLU, [64, 64]"
    memory: nn.LSTM | None = None  # RecurrentPPO's LSTM, between the features and the body
    masked: bool = False  # MaskablePPO's: chooses among the actions a mask allows
