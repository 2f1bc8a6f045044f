"""What every run records about itself: when, which code, which torch, which policy bytes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import ray
import torch

from harness import __version__
from harness.judge.outcome import RunStatus
from harness.policies import PolicyNet
from harness.store.schema import RunRow


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def torch_version() -> str:
    return str(torch.__version__)


# The submitting side's commit, where the code runs from no git checkout: `ray job submit` uploads
# the working dir without .git, so the job is told (docs/clusters.md: `--runtime-env-json` with env_vars).
GIT_REVISION_VAR = "HARNESS_GIT_REVISION"
# Tracked files that differ from the commit: the code that ran is not the commit alone.
DIRTY = "-dirty"
UNKNOWN_REVISION = "unknown"


def git_revision(checkout: Path = Path(__file__).parent) -> str:
    """The commit of the checkout `checkout` is in, DIRTY after it where tracked files differ
    from it; where it is in no checkout, HARNESS_GIT_REVISION as the submitting side set it;
    else UNKNOWN_REVISION, never an empty string that reads as nothing to say."""
    head = _git(checkout, "rev-parse", "HEAD")
    if head is None:
        return os.environ.get(GIT_REVISION_VAR, "").strip() or UNKNOWN_REVISION
    changed = _git(checkout, "status", "--porcelain", "--untracked-files=no")
    return head + (DIRTY if changed else "")


def _git(where: Path, *args: str) -> str | None:
    """`git ARGS`' output in `where`; None where git is missing, slow or says no."""
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=where)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def new_run_row(
    *,
    started_at: str,
    status: RunStatus,
    accelerator: str,
    n_cards: int,
    devices: list[dict[str, object]],
    config_json: str,
    policies: dict[str, PolicyNet],
    command: str,
    faults: str = "",
) -> RunRow:
    """A `runs` row with everything that says which code, versions and bytes produced the run."""
    return RunRow(
        started_at=started_at,
        finished_at=None,
        status=status,
        accelerator=accelerator,
        n_cards=n_cards,
        devices=json.dumps(devices),
        harness_version=__version__,
        torch_version=torch_version(),
        ray_version=ray.__version__,
        config_json=config_json,
        faults=faults,
        git_revision=git_revision(),
        hostname=platform.node(),
        policies=describe_policies(policies),
        command=command,
    )


def describe_policies(policies: dict[str, PolicyNet]) -> str:
    """JSON list: each policy's name, format, sha256 of its bytes, whether it is synthetic, its
    environment, where that came from (and the id its files named, where gymnasium renamed it),
    how it is made (keyword arguments, wrappers, frames stacked), what normalizes its
    observations, its inputs, how its stochastic actions are drawn, and the score it was
    published with."""
    return json.dumps(
        [
            {
                "name": k,
                "source": p.info.source,
                "sha256": p.info.sha256,
                "synthetic": p.info.synthetic,
                "detail": p.info.detail,
                "env_id": p.info.env_id,
                "env_source": p.info.env_source,
                "obs_normalization": p.info.obs_normalization,
                "inputs": [i.describe() for i in p.info.inputs],
                "env_renamed_from": p.info.env_renamed_from or None,
                "env_setup": p.info.env_setup.describe() or None,
                "env_setup_source": p.info.env_setup.source or None,
                "published_return": p.info.published.describe() if p.info.published is not None else None,
                "sampling": p.info.sampling.describe(),
            }
            for k, p in policies.items()
        ]
    )
