"""Policy registry: a name or a path in, a `PolicyNet` out.

Built-in names: `cartpole` (the project's own SB3 PPO for seals/CartPole-v0, shipped in the
package) and `huggy-arch` (the Huggy architecture with seeded synthetic weights). Paths:
`*.zip` (Stable-Baselines3), `*.onnx` (ML-Agents export), `*.pt` (ML-Agents checkpoint), and
`hf://owner/name[/file]` from the local Hugging Face cache.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from harness.errors import PolicyLoadError, UsageError
from harness.policies.base import DTYPES, PolicyInfo, PolicyNet, cast_policy

BUILTIN = ("cartpole", "huggy-arch")
SUFFIXES = (".zip", ".onnx", ".pt")
CARTPOLE_ZIP = Path(__file__).parent / "data" / "cartpole.zip"

__all__ = ["BUILTIN", "DTYPES", "PolicyInfo", "PolicyNet", "cast_policy", "load_policy"]


def load_policy(name_or_path: str) -> PolicyNet:
    """Load a float32 policy; raise UsageError (exit 2) with one line for anything unusable."""
    if name_or_path == "cartpole":
        from harness.policies.sb3_zip import load_sb3_zip

        return load_sb3_zip(CARTPOLE_ZIP, name="cartpole", env_id="seals/CartPole-v0")
    if name_or_path == "huggy-arch":
        from harness.policies.huggy import huggy_arch

        return huggy_arch()
    if name_or_path.startswith("hf://"):
        from harness.policies.hub import resolve_hf

        return load_policy(str(resolve_hf(name_or_path)))
    path = Path(name_or_path)
    if path.suffix not in SUFFIXES:
        close = difflib.get_close_matches(name_or_path, BUILTIN, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(
            f"unknown policy {name_or_path!r}: {hint}available: {', '.join(BUILTIN)}, "
            f"or a path ending in {', '.join(SUFFIXES)}, or hf://owner/name"
        )
    if not path.is_file():
        raise PolicyLoadError(path, "no such file")
    if path.suffix == ".zip":
        from harness.policies.sb3_zip import load_sb3_zip

        return load_sb3_zip(path)
    if path.suffix == ".onnx":
        from harness.policies.mlagents_onnx import load_mlagents_onnx

        return load_mlagents_onnx(path)
    from harness.policies.mlagents_pt import load_mlagents_pt

    return load_mlagents_pt(path)
