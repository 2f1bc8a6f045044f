"""ARS: ARSPolicy (an MLP) and ARSLinearPolicy (one Linear, no bias by default).

`action_net` is flattened observations -> create_mlp, with Tanh after the last layer where
`squash_output` (ARSPolicy's default for a Box; ARSLinearPolicy's is off): the harness keeps the
last Linear as the head and squashes as SB3's predict does, tanh then `unscale_action`; an
unsquashed Box action is clipped to the bounds when an environment steps it. A Discrete action
is the argmax of the logits. SB3's predict ignores `deterministic`, so the sample is the action.

sb3-contrib before 1.7 built ARSLinearPolicy's unsquashed layer as a bare Linear, saved as
`action_net.weight` (and `action_net.bias` with with_bias) where 1.7 and later save the same
layer as `action_net.0.*`; its `ARS.set_parameters` renames the old keys on load, and this
reader takes them as that one layer too (the RL Zoo's ARS agents were saved by 1.3).
"""

from __future__ import annotations

from torch import nn

from harness.errors import PolicyLoadError
from harness.policies.base import Sampling, SamplingKind
from harness.policies.sb3.layers import linear, linear_chain, mlp_of
from harness.policies.sb3.save import Actor, Save

DEFAULT_ACTIVATION = "ReLU"
# Per class: (net_arch, squash_output) where data gives none; ARSLinearPolicy fixes net_arch [].
DEFAULTS = {"ARSPolicy": ([64, 64], True), "ARSLinearPolicy": ([], False)}


def build(save: Save) -> Actor:
    net_arch, squash = DEFAULTS[save.policy_class.name]
    features = save.features("features_extractor.")
    layers, layout = _action_net(save, features.size)
    if not layers or layers[-1].out_features != save.action.size:
        raise PolicyLoadError(save.path, f"action_net does not end in a layer of {save.action.size} actions")
    hidden = [layer.out_features for layer in layers[:-1]]
    save.check_hidden(hidden, net_arch, "action_net")
    activation = save.activation(DEFAULT_ACTIVATION)
    squashed = save.action.kind == "continuous" and save.flag("squash_output", squash)
    save.weights.check_all_taken((), "an ARS policy")
    bias = "" if layers[-1].bias is not None else ", no bias"
    detail = f"{save.policy_class.name}, action_net {hidden}, {activation}{bias}" + (", tanh-squashed" if squashed else "")
    detail += layout
    sampling = Sampling(SamplingKind.DETERMINISTIC)
    return Actor(features, mlp_of(layers[:-1], activation), layers[-1], sampling, squashed=squashed, detail=detail)


def _action_net(save: Save, n_in: int) -> tuple[list[nn.Linear], str]:
    """action_net's Linear layers, and what the detail says of an old layout. Both layouts at
    once is none that sb3-contrib wrote: refused, not guessed between."""
    weights, why = save.weights, f"action_net on {n_in} features"
    if not weights.has("action_net.weight"):
        return linear_chain(weights, "action_net.", n_in, why=why), ""
    if weights.indices("action_net."):
        problem = "policy.pth has both action_net.weight (sb3-contrib < 1.7) and action_net.0.weight (1.7 and later)"
        raise PolicyLoadError(save.path, f"{problem}: not one ARS layout")
    return [linear(weights, "action_net", n_in, why=why)], ", sb3-contrib < 1.7 layout (action_net.weight)"
