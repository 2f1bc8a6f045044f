"""TD3 and DDPG: TD3Policy's deterministic actor.

`actor.mu` is features -> an MLP -> Tanh; the harness keeps the last Linear as the head (`mu`,
before the tanh) and squashes as SB3 does: tanh, then `unscale_action` to the action space's
bounds. SB3's predict ignores `deterministic` here (exploration noise is added only while
training), so the sampled action is the action. The critics and target networks are not read.
"""

from __future__ import annotations

from harness.errors import PolicyLoadError
from harness.policies.base import Sampling, SamplingKind
from harness.policies.sb3.layers import NATURE, linear_chain, mlp_of
from harness.policies.sb3.save import Actor, Save

DEFAULT_ACTIVATION = "ReLU"
# TD3Policy's default net_arch: [256, 256] over NatureCNN's features, [400, 300] otherwise.
DEFAULT_NET_ARCH = [400, 300]
CNN_NET_ARCH = [256, 256]
NOT_ACTOR = ("actor_target.", "critic.", "critic_target.")


def build(save: Save) -> Actor:
    save.check_actions("continuous")
    features = save.features("actor.features_extractor.")
    layers = linear_chain(save.weights, "actor.mu.", features.size, why=f"actor.mu on {features.size} features")
    if not layers or layers[-1].out_features != save.action.size:
        raise PolicyLoadError(save.path, f"actor.mu does not end in a layer of {save.action.size} actions")
    hidden = [layer.out_features for layer in layers[:-1]]
    save.check_hidden(hidden, CNN_NET_ARCH if save.extractor == NATURE else DEFAULT_NET_ARCH, "actor.mu")
    activation = save.activation(DEFAULT_ACTIVATION)
    save.weights.check_all_taken(NOT_ACTOR, "a TD3 actor")
    parts = [save.policy_class.name, *([features.detail] if features.detail else []), f"actor.mu {hidden}, {activation}"]
    sampling = Sampling(SamplingKind.DETERMINISTIC)
    return Actor(features, mlp_of(layers[:-1], activation), layers[-1], sampling, squashed=True, detail=", ".join(parts))
