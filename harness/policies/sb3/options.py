"""The `policy_kwargs` a save may hold, and what each one means to the acting network.

SB3 builds a policy from its class and `policy_kwargs`; the loader rebuilds the actor from the
weights and the keys that decide its forward. A key it does not know could change that forward
(a newer SB3's option, a fork's), so it is refused by name, never passed over: a network read
without it would be another network, and every card would agree on the wrong answer. A key known
not to change the forward (where training placed it, how it initialized or optimized) is taken,
and recorded in the policy's detail with its value, so that a result says what the save held.

The two lists are decided from the constructors: tests/test_sb3_families.py walks every
parameter of every policy class `sb3_zip.FAMILIES` reads and fails on one in neither, so a new
SB3 or sb3-contrib release's option cannot slip through either way.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from harness.errors import PolicyLoadError
from harness.policies.sb3.archive import shown

# What the SB3 and sb3-contrib of 1.x and 2.x serialize beside the readable keys.
SERIALIZED = (":type:", ":serialized:")

READ = {
    "net_arch": "the hidden layers, checked against the weights",
    "activation_fn": "the activation (harness.policies.sb3.archive.ACTIVATIONS)",
    "use_sde": "gSDE, checked against the log std's shape",
    "full_std": "gSDE's log std shape",
    "use_expln": "gSDE's std",
    "squash_output": "tanh, then the action bounds",
    "clip_mean": "SAC's gSDE mean clip, checked against the weights",
    "normalize_images": "images divided by 255",
    "features_extractor_class": "the features extractor (SB3's three)",
    "features_extractor_kwargs": "its sizes, which the weights give",
    "share_features_extractor": "which extractor the actor takes: the weights' names say",
    "n_quantiles": "QR-DQN's and TQC's quantiles, checked against the weights",
    "with_bias": "ARS's biases: the weights hold them or not",
    "batch_norm": "CrossQ's batch renormalization layers, checked against the weights",
    "batch_norm_eps": "the epsilon of CrossQ's batch renormalization",
    "lstm_hidden_size": "RecurrentPPO's LSTM width, checked against the weights",
    "n_lstm_layers": "RecurrentPPO's LSTM layers, checked against the weights",
    "lstm_kwargs": "RecurrentPPO's LSTM options: none is read, so only an empty one is taken",
}
"""Keys that decide the actor's forward, each read by the family that takes it."""

NOT_IN_THE_FORWARD = {
    "device": "where training placed the policy (the RL Zoo's SAC Pendulum holds it)",
    "ortho_init": "how the weights were initialized",
    "log_std_init": "the log std's first value (the weights hold the trained one)",
    "optimizer_class": "training",
    "optimizer_kwargs": "training",
    "n_critics": "the critics, which are not read",
    "batch_norm_momentum": "how CrossQ's statistics moved while training",
    "renorm_warmup_steps": "when CrossQ's training switched to its running statistics",
    "shared_lstm": "whether RecurrentPPO's critic reads the actor's LSTM",
    "enable_critic_lstm": "whether RecurrentPPO's critic has an LSTM of its own",
}
"""Keys a policy takes that do not change what its actor computes from an observation."""

EXTRACTOR_KWARGS = ("features_dim", "cnn_output_dim", "normalized_image")
"""features_extractor_kwargs of SB3's extractors: widths the weights give, and whether a float
Box counts as an image, which the weights say too (a key with convolutions is one)."""


def check_policy_kwargs(path: Path, kwargs: dict[str, Any]) -> tuple[str, ...]:
    """Refuse (PolicyLoadError, by name) any policy_kwargs key that is not known to leave the
    actor as the loader rebuilds it. Returns the keys taken without being read, as `key=value`."""
    unread = []
    for key, value in kwargs.items():
        if key in NOT_IN_THE_FORWARD:
            unread.append(f"{key}={shown(value, 40)}")
            continue
        if key in SERIALIZED or (key in READ and key != "lstm_kwargs"):
            continue
        if key == "sde_net_arch" and value is None:  # SB3 < 1.3: None is gSDE's plain latent
            continue
        if key == "lstm_kwargs" and not value:
            continue
        known = ", ".join([*READ, *NOT_IN_THE_FORWARD])
        raise PolicyLoadError(
            path,
            f"policy_kwargs {key}={shown(value, 60)} may change the network and is not read by this loader; known: {known}",
        )
    _check_extractor_kwargs(path, kwargs.get("features_extractor_kwargs"))
    return tuple(unread)


def _check_extractor_kwargs(path: Path, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, str):  # written as its str where JSON could not hold it
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, RecursionError):
            raise PolicyLoadError(path, f"cannot read features_extractor_kwargs {shown(value)}") from None
    if not isinstance(value, dict):
        raise PolicyLoadError(path, f"features_extractor_kwargs is {shown(value)}, expected an object")
    for key in value:
        if key not in EXTRACTOR_KWARGS:
            problem = f"features_extractor_kwargs {key} may change the features and is not read by this loader"
            raise PolicyLoadError(path, f"{problem}; known: {', '.join(EXTRACTOR_KWARGS)}")
