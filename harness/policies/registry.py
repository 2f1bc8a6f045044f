"""Which loader reads a policy: the one table of built-in names and file formats.

`--policy` takes a built-in name, a file, a folder (an RL Zoo run folder, a Hugging Face
snapshot: the one policy file in it) or `hf://owner/name[/file]` (the same, from the local
Hugging Face cache). A file is read by the one format whose suffix it has and whose content check
it passes (`PolicyFormat.claims`); a file that no format claims, or that two formats claim, is
refused by name, never handed to a loader that guesses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from harness.errors import PolicyLoadError, UsageError
from harness.policies.base import PolicyNet
from harness.policies.hub import SCHEME, resolve_hf
from harness.policies.huggy import huggy_arch
from harness.policies.loader import Peek, PolicyFormat, PolicySpec
from harness.policies.mlagents_pt import MLAgentsCheckpoint, TorchScript
from harness.policies.onnx_any import Onnx
from harness.policies.sb3_zip import Sb3Zip, load_sb3_zip
from harness.registry import Registry

CARTPOLE_ZIP = Path(__file__).parent / "data" / "cartpole.zip"
# A folder is searched for its policy file this deep in entries, no further: a snapshot or a run
# folder holds dozens; a user who names their home folder gets an answer, not a minute's walk.
MAX_FOLDER_ENTRIES = 10_000


def _cartpole() -> PolicyNet:
    policy = load_sb3_zip(CARTPOLE_ZIP, name="cartpole")
    policy.info = replace(policy.info, env_id="seals/CartPole-v0", env_source="built in")
    return policy


BUILTINS: Registry[Callable[[], PolicyNet]] = Registry("policy", {"cartpole": _cartpole, "huggy-arch": huggy_arch})
FORMATS: Registry[type[PolicyFormat]] = Registry(
    "policy format", {fmt.name: fmt for fmt in (Sb3Zip, Onnx, MLAgentsCheckpoint, TorchScript)}
)


def register_format(fmt: type[PolicyFormat]) -> type[PolicyFormat]:
    """Add a format to the table (usable as a class decorator); a format's name taken already is refused."""
    return FORMATS.register(fmt.name, fmt)


def suffixes() -> list[str]:
    return sorted({suffix for fmt in FORMATS.values() for suffix in fmt.suffixes})


def load_source(spec: PolicySpec) -> PolicyNet:
    """The float32 policy `spec.source` names."""
    source = spec.source
    if source in BUILTINS:
        return BUILTINS.get(source)()
    path = resolve_hf(source) if source.startswith(SCHEME) else Path(source)
    if path.suffix not in suffixes() and _is_folder(path):  # a folder named like a file is refused as one
        path = find_policy_file(path, source)
    elif path.suffix not in suffixes():
        close = BUILTINS.nearest(source)
        hint = f"did you mean {close!r}? " if close else ""
        raise UsageError(
            f"unknown policy {source!r}: {hint}available: {', '.join(BUILTINS)}, or a path ending in "
            f"{', '.join(suffixes())}, a folder holding one, or {SCHEME}owner/name"
        )
    return format_of(path).load(path, spec)


def _is_folder(path: Path) -> bool:
    """Whether `path` is a folder; one that cannot be looked at (a name too long) is refused in one line."""
    try:
        return path.is_dir()
    except OSError as exc:
        raise PolicyLoadError(path, f"cannot read: {exc.strerror or exc}") from None


def format_of(path: Path) -> type[PolicyFormat]:
    """The one format that reads `path`; PolicyLoadError when none or several claim it."""
    peek = Peek.of(path)
    candidates = [fmt for fmt in FORMATS.values() if path.suffix in fmt.suffixes]
    claiming = [fmt for fmt in candidates if fmt.claims(peek)]
    if len(claiming) == 1:
        return claiming[0]
    if claiming:
        names = ", ".join(fmt.name for fmt in claiming)
        raise PolicyLoadError(path, f"is claimed by several formats ({names}): rename it to the suffix of the one it is")
    expected = "; or ".join(fmt.what for fmt in candidates)
    raise PolicyLoadError(path, f"is none of the formats read as {path.suffix}: expected {expected}")


def find_policy_file(folder: Path, shown: str) -> Path:
    """The one file in `folder` (and below) that a format claims: an RL Zoo run folder holds
    `<Env>.zip` beside `<Env>/`, a Hugging Face snapshot its zip or .onnx beside the model card."""
    known = set(suffixes())
    found = []
    for seen, path in enumerate(folder.rglob("*")):
        if seen >= MAX_FOLDER_ENTRIES:
            raise UsageError(f"{shown}: over {MAX_FOLDER_ENTRIES} entries to search for a policy file; name the file")
        if path.suffix in known and path.is_file() and _claimed(path):
            found.append(path)
    found.sort()
    if len(found) == 1:
        return found[0]
    names = [str(p.relative_to(folder)) for p in found]
    if not names:
        raise UsageError(f"{shown}: holds no policy file ({', '.join(suffixes())} that a format reads)")
    raise UsageError(f"{shown}: several policy files ({', '.join(names)}); name one, e.g. {shown.rstrip('/')}/{names[0]}")


def _claimed(path: Path) -> bool:
    try:
        format_of(path)
    except UsageError:
        return False
    return True
