"""hf:// resolution against a real huggingface_hub cache layout, offline.

huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when it is imported, so each case runs in a
fresh interpreter with those variables set, as a user's shell would have them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import HF_COMMIT as COMMIT
from tests.builders import cache_repo

RESOLVE = """
import json, sys
from harness.errors import UsageError
from harness.policies import load_policy
from harness.policies.hub import resolve_hf
from harness.policies.registry import find_policy_file
results = {}
for uri in sys.argv[1:]:
    try:
        path = resolve_hf(uri)
        path = find_policy_file(path, uri) if path.is_dir() else path
        results[uri] = {"path": str(path), "sha256": load_policy(uri).info.sha256}
    except UsageError as error:
        results[uri] = {"error": str(error)}
print(json.dumps(results))
"""


def resolve(hf_home: Path, *uris: str) -> dict[str, dict[str, str]]:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run([sys.executable, "-c", RESOLVE, *uris], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def results(mlagents_export: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    hf_home = tmp_path_factory.mktemp("hf_home")
    ball = mlagents_export.read_bytes()
    cache_repo(hf_home, "unity/Ball", {"Ball.onnx": ball, "README.md": b"# Ball\n"})
    cache_repo(hf_home, "unity/two", {"Ball.onnx": ball, "run/Ball-500.onnx": ball})
    uris = ["hf://unity/Ball", "hf://unity/two", "hf://unity/two/run/Ball-500.onnx"]
    uris += ["hf://unity/absent", "hf://unity"]
    return resolve(hf_home, *uris) | {"ball_sha256": {"sha256": hashlib.sha256(ball).hexdigest()}}


def test_cached_repo_resolves_to_its_policy_file(results: dict[str, dict[str, str]]) -> None:
    found = results["hf://unity/Ball"]
    assert found["path"].endswith(f"models--unity--Ball/snapshots/{COMMIT}/Ball.onnx")
    assert found["sha256"] == results["ball_sha256"]["sha256"]


def test_several_policy_files_must_be_named(results: dict[str, dict[str, str]]) -> None:
    assert results["hf://unity/two"]["error"] == (
        "hf://unity/two: several policy files (Ball.onnx, run/Ball-500.onnx); name one, e.g. hf://unity/two/Ball.onnx"
    )
    assert results["hf://unity/two/run/Ball-500.onnx"]["path"].endswith("run/Ball-500.onnx")


def test_offline_uncached_names_the_download_command(results: dict[str, dict[str, str]]) -> None:
    assert results["hf://unity/absent"]["error"] == (
        "hf://unity/absent is not in the local Hugging Face cache; download it first with: hf download unity/absent"
    )


def test_malformed_uri_is_a_usage_error(results: dict[str, dict[str, str]]) -> None:
    assert results["hf://unity"]["error"] == "hf://unity: expected hf://owner/name or hf://owner/name/file.onnx"
