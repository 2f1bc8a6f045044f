"""Which code made a run: `runs.git_revision` is the checkout's commit, marked dirty where tracked
files differ from it; where the code runs from no checkout (a Ray job's uploaded copy), the
revision the submitting side passed in HARNESS_GIT_REVISION; "unknown" only where neither says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.cluster.provenance import GIT_REVISION_VAR, git_revision


def _git(where: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=where, check=True, capture_output=True, text=True).stdout.strip()


def test_the_revision_is_the_commit_and_says_when_the_code_differs_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GIT_REVISION_VAR, "from-the-submitter")  # a checkout's own commit wins
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert git_revision(tmp_path) == head
    (tmp_path / "notes.txt").write_text("untracked: not the code that ran\n")
    assert git_revision(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_revision(tmp_path) == f"{head}-dirty"


def test_outside_a_checkout_the_submitter_s_revision_else_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no checkout above the folder either
    monkeypatch.setenv(GIT_REVISION_VAR, "0123abc-dirty")
    assert git_revision(tmp_path) == "0123abc-dirty"
    monkeypatch.delenv(GIT_REVISION_VAR)
    assert git_revision(tmp_path) == "unknown"
