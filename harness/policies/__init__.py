"""Policies: a name or a path in, a float32 `PolicyNet` out, checked before anything runs it.

Built-in names: `cartpole` (the project's own SB3 PPO for seals/CartPole-v0, shipped in the
package) and `huggy-arch` (the Huggy architecture with seeded synthetic weights). Paths: a
Stable-Baselines3 zip, an ONNX graph (an ML-Agents export, or any graph with a float input and a
logits or action output), an ML-Agents `.pt` checkpoint, a folder holding one, and
`hf://owner/name[/file]` from the local Hugging Face cache. Which loader reads what is one table,
`harness/policies/registry.py`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from harness.dtypes import GOLDEN_DTYPE
from harness.errors import PolicyLoadError
from harness.policies.base import DTYPES, PolicyInfo, PolicyNet, cast_policy
from harness.policies.loader import PolicySpec
from harness.policies.registry import BUILTINS, CARTPOLE_ZIP, load_source

__all__ = [
    "BUILTINS",
    "CARTPOLE_ZIP",
    "DTYPES",
    "GOLDEN_DTYPE",
    "PolicyInfo",
    "PolicyNet",
    "PolicySpec",
    "cast_policy",
    "load_policy",
    "with_found_env",
]


def load_policy(spec: str | PolicySpec) -> PolicyNet:
    """Load a float32 policy; raise UsageError (exit 2) with one line for anything unusable."""
    spec = spec if isinstance(spec, PolicySpec) else PolicySpec(spec)
    policy = load_source(spec)
    _refuse_non_finite(policy)
    if spec.env_id is not None and (policy.info.env_id is None or spec.env_overrides):
        policy.info = replace(policy.info, env_id=spec.env_id, env_source=spec.env_source, env_setup=spec.env_setup)
    return policy


def with_found_env(spec: PolicySpec, policy: PolicyNet) -> PolicySpec:
    """`spec` carrying the environment loading it found (`policy`), so that a later load from it,
    each actor's, takes the environment from the spec instead of parsing the files beside the
    policy again. The policy's own bytes are still read, and hashed, by every load."""
    info = policy.info
    return replace(spec, env_id=info.env_id, env_source=info.env_source, env_setup=info.env_setup, env_overrides=True)


def _refuse_non_finite(policy: PolicyNet) -> None:
    """NaN or inf in a weight makes every output of every card NaN or inf: a broken file, which a
    sweep would report as a failed port. Weights, log_sigma and normalizer statistics (large in
    ML-Agents, never infinite) must be finite; a rebuilt graph's other constants may hold -inf or
    inf on purpose (a mask, a bound), never NaN."""
    constants = {f"{part}.{name}" for part in ("body", "head") for name, _ in getattr(policy, part).named_buffers()}
    for name, tensor in (*policy.named_parameters(), *policy.named_buffers()):
        if not tensor.is_floating_point():
            continue
        counts = {"NaN": int(torch.isnan(tensor).sum())}
        if name not in constants:
            counts["inf"] = int(torch.isinf(tensor).sum())
        found = " and ".join(f"{n} {what}" for what, n in counts.items() if n)
        if found:
            raise PolicyLoadError(policy.info.name, f"{name} holds {found}")
