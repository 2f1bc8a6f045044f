"""`hf://owner/name[/file]`: a policy file from the local Hugging Face cache, never the network.

A validation run must be reproducible on machines without internet (cluster nodes often are),
so the download is an explicit step the user runs first; here we only look in the cache and,
when the files are not there, say exactly which command puts them there.
"""

from __future__ import annotations

import re
from pathlib import Path

from harness.errors import UsageError

SCHEME = "hf://"
HF_CLI_SINCE = (0, 34)  # huggingface_hub 0.34 introduced `hf`, replacing `huggingface-cli`
# A Hugging Face owner or repository name, as the hub allows them.
HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def resolve_hf(uri: str) -> Path:
    """The cached snapshot folder of `hf://owner/name` (the registry finds its policy file in it),
    or the cached file of `hf://owner/name/file`."""
    repo_id, filename = _parse(uri)
    try:
        import huggingface_hub
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:
        raise UsageError(f"{uri}: hf:// policies need huggingface_hub: pip install 'harness[hub]'") from None
    try:
        if filename:
            return Path(huggingface_hub.hf_hub_download(repo_id, filename, local_files_only=True))
        return Path(huggingface_hub.snapshot_download(repo_id, local_files_only=True))
    except HFValidationError as error:
        raise UsageError(f"{uri}: {error}") from None
    except LocalEntryNotFoundError:
        command = " ".join([_download_command(huggingface_hub.__version__), repo_id, *filter(None, [filename])])
        raise UsageError(f"{uri} is not in the local Hugging Face cache; download it first with: {command}") from None


def _parse(uri: str) -> tuple[str, str | None]:
    """(repo id, file in the repo or None); the file is a path inside the repository, never out of it."""
    parts = uri.removeprefix(SCHEME).split("/", 2)
    if len(parts) < 2 or not all(parts):
        raise UsageError(f"{uri}: expected hf://owner/name or hf://owner/name/file.onnx")
    if not all(HUB_NAME.fullmatch(part) for part in parts[:2]):
        raise UsageError(f"{uri}: owner and name are letters, digits, '-', '_' and '.', e.g. hf://sb3/ppo-CartPole-v1")
    filename = parts[2] if len(parts) == 3 else None
    if filename is not None and any(segment in ("", ".", "..") or "\\" in segment for segment in filename.split("/")):
        raise UsageError(f"{uri}: the file must be a plain path inside the repository (no '.', '..' or empty parts)")
    return f"{parts[0]}/{parts[1]}", filename


def _download_command(version: str) -> str:
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    return "hf download" if major_minor >= HF_CLI_SINCE else "huggingface-cli download"
