"""Policy registry: a name or a path in, a `PolicyNet` out.

Built-in names: `cartpole` (the project's own SB3 PPO for seals/CartPole-v0, shipped in the
package) and `huggy-arch` (the Huggy architecture with seeded synthetic weights). Paths:
`*.zip` (Stable-Baselines3), `*.onnx` (an ML-Agents export, or any graph with a float input
and a logits or action output), `*.pt` (ML-Agents checkpoint), and `hf://owner/name[/file]`
from the local Hugging Face cache.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from harness.errors import PolicyLoadError, UsageError
from harness.dtypes import GOLDEN
from harness.policies.base import DTYPES, ActionKind, PolicyInfo, PolicyNet, cast_policy
from harness.files import regular_file_size

BUILTIN = ("cartpole", "huggy-arch")
SUFFIXES = (".zip", ".onnx", ".pt")
CARTPOLE_ZIP = Path(__file__).parent / "data" / "cartpole.zip"

__all__ = [
    "BUILTIN",
    "DTYPES",
    "GOLDEN",
    "PolicyInfo",
    "PolicyNet",
    "PolicySpec",
    "cast_policy",
    "load_policy",
    "with_found_env",
]


@dataclass(frozen=True)
class PolicySpec:
    """What the user asked for and how to load it; the driver and every actor load from the same spec.

    `source` is a registry name, a path or hf://...: the policy's name in every result row. The
    rest says what the policy's own files may not: its environment (`env_id`, used where the
    policy declares none, or always with `env_overrides`, and then the files beside the policy
    are not read for one), and for an ONNX graph of no known layout the output to read and
    whether its actions are discrete or continuous.
    """

    source: str
    env_id: str | None = None
    env_source: str = ""  # the option that named env_id, e.g. "--env"
    env_overrides: bool = False
    onnx_output: str | None = None
    action_kind: ActionKind | None = None


def load_policy(spec: str | PolicySpec) -> PolicyNet:
    """Load a float32 policy; raise UsageError (exit 2) with one line for anything unusable."""
    spec = spec if isinstance(spec, PolicySpec) else PolicySpec(spec)
    policy = _load(spec)
    _refuse_non_finite(policy)
    if spec.env_id is not None and (policy.info.env_id is None or spec.env_overrides):
        policy.info = replace(policy.info, env_id=spec.env_id, env_source=spec.env_source)
    return policy


def with_found_env(spec: PolicySpec, policy: PolicyNet) -> PolicySpec:
    """`spec` carrying the environment loading it found (`policy`), so that a later load from it,
    each actor's, takes the environment from the spec instead of parsing the files beside the
    policy again. The policy's own bytes are still read, and hashed, by every load."""
    return replace(spec, env_id=policy.info.env_id, env_source=policy.info.env_source, env_overrides=True)


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


def _load(spec: PolicySpec) -> PolicyNet:
    name_or_path = spec.source
    if name_or_path == "cartpole":
        from harness.policies.sb3_zip import load_sb3_zip

        policy = load_sb3_zip(CARTPOLE_ZIP, name="cartpole")
        policy.info = replace(policy.info, env_id="seals/CartPole-v0", env_source="built in")
        return policy
    if name_or_path == "huggy-arch":
        from harness.policies.huggy import huggy_arch

        return huggy_arch()
    if name_or_path.startswith("hf://"):
        from harness.policies.hub import resolve_hf

        return _load(replace(spec, source=str(resolve_hf(name_or_path))))
    path = Path(name_or_path)
    if path.suffix not in SUFFIXES:
        close = difflib.get_close_matches(name_or_path, BUILTIN, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(
            f"unknown policy {name_or_path!r}: {hint}available: {', '.join(BUILTIN)}, "
            f"or a path ending in {', '.join(SUFFIXES)}, or hf://owner/name"
        )
    if regular_file_size(path, "a policy file", PolicyLoadError) == 0:
        raise PolicyLoadError(path, "is empty (0 bytes)")
    if path.suffix == ".zip":
        from harness.policies.sb3_zip import load_sb3_zip

        return load_sb3_zip(path, env_files=not spec.env_overrides)
    if path.suffix == ".onnx":
        from harness.policies.onnx_any import load_onnx

        return load_onnx(path, spec.onnx_output, spec.action_kind)
    from harness.policies.mlagents_pt import load_mlagents_pt

    return load_mlagents_pt(path)
