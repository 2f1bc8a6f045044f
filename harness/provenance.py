"""What every run records about itself: when, which code, which torch, which policy bytes."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from harness.policies import PolicyNet


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def torch_version() -> str:
    import torch

    return torch.__version__


def git_revision() -> str:
    """The checkout's commit, or "" where the package is not in a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def describe_policies(policies: dict[str, PolicyNet]) -> str:
    """JSON list: each policy's name, format, sha256 of its bytes, and whether it is synthetic."""
    return json.dumps([
        {"name": k, "source": p.info.source, "sha256": p.info.sha256, "synthetic": p.info.synthetic, "detail": p.info.detail}
        for k, p in policies.items()
    ])
