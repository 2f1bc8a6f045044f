"""SAC, TQC and CrossQ: their actor, a squashed Gaussian.

`actor.latent_pi` (features -> MLP, an activation after every layer) is the body; `actor.mu`
the head. CrossQ's latent_pi puts a batch renormalization before each Linear and one after the
last activation, computed from its running statistics as in eval mode (`BatchNorm`), unless it
was built with `batch_norm=False`. Without gSDE the log std is a layer too, `actor.log_std`,
clamped to [-20, 2]; with gSDE it is a free (latent, actions or 1) parameter and `mu` is clipped
to +-clip_mean (SB3 2.0 default 2). Actions are tanh-squashed, then rescaled to the action
space's bounds as SB3's `unscale_action` does. The critics and their targets are not read.
"""

from __future__ import annotations

from torch import nn

from harness.errors import PolicyLoadError
from harness.policies.base import Sampling, SamplingKind
from harness.policies.sb3.layers import Features, linear, linear_chain, mlp_of, renormalized_chain
from harness.policies.sb3.save import Actor, Save

DEFAULT_ACTIVATION = "ReLU"
DEFAULT_NET_ARCH = [256, 256]
# SB3's LOG_STD_MIN and LOG_STD_MAX (sac/policies.py), the clamp of the log std layer.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
DEFAULT_CLIP_MEAN = 2.0
NOT_ACTOR = ("critic.", "critic_target.")
# CrossQ's BatchRenorm defaults (sb3_contrib/crossq/policies.py) where policy_kwargs say none.
CROSSQ_EPS = 0.001
LATENT = "actor.latent_pi."


def build(save: Save) -> Actor:
    """SAC's and TQC's actor."""
    save.check_actions("continuous")
    features = save.features("actor.features_extractor.")
    return _plain(save, features, save.activation(DEFAULT_ACTIVATION))


def crossq(save: Save) -> Actor:
    """CrossQ's actor: SAC's, its latent_pi batch-renormalized."""
    save.check_actions("continuous")
    features = save.features("actor.features_extractor.")
    activation = save.activation(DEFAULT_ACTIVATION)
    declared = save.flag("batch_norm", True)
    if declared != save.weights.has(f"{LATENT}0.ra_mean"):
        held = "holds" if not declared else "holds no"
        raise PolicyLoadError(
            save.path, f"data says batch_norm {declared}, but policy.pth {held} batch renormalization layers"
        )
    if not declared:
        return _plain(save, features, activation)
    eps = save.number("batch_norm_eps", CROSSQ_EPS)
    body, hidden = renormalized_chain(save.weights, LATENT, features.size, activation, eps)
    return _squashed_gaussian(save, features, body, hidden, f"actor.latent_pi {hidden}, {activation}, BatchRenorm eps {eps:g}")


def _plain(save: Save, features: Features, activation: str) -> Actor:
    """The actor over latent_pi as SB3's create_mlp lays it out: Linear, activation, ..."""
    layers = linear_chain(save.weights, LATENT, features.size, why=f"actor.latent_pi on {features.size} features")
    hidden = [layer.out_features for layer in layers]
    return _squashed_gaussian(save, features, mlp_of(layers, activation), hidden, f"actor.latent_pi {hidden}, {activation}")


def _squashed_gaussian(save: Save, features: Features, body: nn.Sequential, hidden: list[int], what: str) -> Actor:
    """The actor over `body` (the latent_pi whose hidden sizes are `hidden`): mu, its log std
    (a layer, or gSDE's parameter), tanh-squashed actions."""
    path, weights, actions = save.path, save.weights, save.action.size
    save.check_hidden(hidden, DEFAULT_NET_ARCH, "actor.latent_pi")
    latent = hidden[-1] if hidden else features.size
    use_sde = weights.has("actor.log_std")  # a parameter with gSDE, a layer (log_std.weight) without
    declared = save.data.get("use_sde")
    if isinstance(declared, bool) and declared != use_sde:
        held = "a gSDE parameter" if use_sde else "a layer"
        raise PolicyLoadError(path, f"data says use_sde {declared}, but policy.pth's actor.log_std is {held}")
    parts = [save.policy_class.name, *([features.detail] if features.detail else []), what]
    if use_sde:
        full_std = save.flag("full_std", True)
        log_sigma = weights.take("actor.log_std", (latent, actions if full_std else 1), f"gSDE (full_std {full_std})")
        clipped = not weights.has("actor.mu.weight")
        head: nn.Module = _clipped_mu(save, latent) if clipped else linear(weights, "actor.mu", latent, actions)
        sampling = Sampling(SamplingKind.STATE_DEPENDENT, latent_size=latent, expln=save.flag("use_expln", False))
        weights.check_all_taken(NOT_ACTOR, "a SAC actor")
        parts.append("gSDE")
        return Actor(features, body, head, sampling, log_sigma, squashed=True, detail=", ".join(parts))
    log_std = nn.Sequential(linear(weights, "actor.log_std", latent, actions), nn.Hardtanh(LOG_STD_MIN, LOG_STD_MAX))
    head = linear(weights, "actor.mu", latent, actions)
    weights.check_all_taken(NOT_ACTOR, "a SAC actor")
    return Actor(features, body, head, log_std=log_std, squashed=True, detail=", ".join(parts))


def _clipped_mu(save: Save, latent: int) -> nn.Sequential:
    """gSDE's mu with clip_mean > 0: Linear, then Hardtanh(-clip_mean, clip_mean), as SB3 builds it."""
    clip_mean = save.number("clip_mean", DEFAULT_CLIP_MEAN)
    if not clip_mean > 0:
        raise PolicyLoadError(save.path, f"actor.mu is clipped in policy.pth, but data's clip_mean is {clip_mean:g}")
    return nn.Sequential(linear(save.weights, "actor.mu.0", latent, save.action.size), nn.Hardtanh(-clip_mean, clip_mean))
