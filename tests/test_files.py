"""Paths that are not regular files: a folder or a FIFO named like a policy or a side file, and an
empty policy file. Each is refused by what it is, and a FIFO is never opened: opening one for
reading waits for a writer, so a test that opened it would hang until its timeout."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from harness.errors import PolicyLoadError
from harness.policies import CARTPOLE_ZIP, load_policy
from tests.helpers import assert_usage_error, cli

pytestmark = pytest.mark.timeout(60)

SUFFIXES = [".zip", ".onnx", ".pt"]


def refused(source: Path, path: Path, problem: str) -> None:
    """load_policy(source) fails with one line: `path: problem`."""
    with pytest.raises(PolicyLoadError) as caught:
        load_policy(str(source))
    assert str(caught.value) == f"{path}: {problem}"


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_folder_named_like_a_policy_is_a_folder(suffix: str, tmp_path: Path) -> None:
    folder = tmp_path / f"x{suffix}"
    folder.mkdir()
    refused(folder, folder, "is a folder, not a policy file")


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_fifo_named_like_a_policy_is_never_opened(suffix: str, tmp_path: Path) -> None:
    fifo = tmp_path / f"x{suffix}"
    os.mkfifo(fifo)
    refused(fifo, fifo, "is not a regular file (a FIFO)")


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_an_empty_policy_file_says_it_is_empty(suffix: str, tmp_path: Path) -> None:
    empty = tmp_path / f"x{suffix}"
    empty.touch()
    refused(empty, empty, "is empty (0 bytes)")


def test_the_command_line_refuses_a_fifo_before_ray_starts(tmp_path: Path) -> None:
    fifo = tmp_path / "x.zip"
    os.mkfifo(fifo)
    proc = cli("sweep", "--policy", str(fifo), "--accelerator", "cpu", "--results", str(tmp_path / "results"))
    assert_usage_error(proc, f"{fifo}: is not a regular file (a FIFO)")
    assert not (tmp_path / "results").exists()


# Each file beside a policy, and what it should be.
SIDE_FILES = {
    "CartPole-v1/args.yml": "a run file",
    "README.md": "a model card",
    "CartPole-v1/vecnormalize.pkl": "VecNormalize statistics",
    "vec_normalize.pkl": "VecNormalize statistics",
}


@pytest.mark.parametrize("side", list(SIDE_FILES))
def test_a_side_file_that_is_a_fifo_or_a_folder_is_refused(side: str, tmp_path: Path) -> None:
    policy = tmp_path / "CartPole-v1.zip"
    shutil.copy(CARTPOLE_ZIP, policy)
    path = tmp_path / side
    path.parent.mkdir(exist_ok=True)
    os.mkfifo(path)
    refused(policy, path, "is not a regular file (a FIFO)")
    path.unlink()
    path.mkdir()
    refused(policy, path, f"is a folder, not {SIDE_FILES[side]}")
