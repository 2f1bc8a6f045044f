"""Installing next to the torch a host has: the dependency set leaves torch alone (no torchvision,
so onnx2torch comes without its dependencies), and the support matrix the Makefile tests is the
one pyproject.toml declares and docs/versions.md states. `scripts/install_venv.sh` proves the first on
every CI venv by installing for real; these are the checks that need no install."""

from __future__ import annotations

import re
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.helpers import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
MAKEFILE = (REPO / "Makefile").read_text()
# The support matrix and the host install lines live on the documentation site's versions page.
VERSIONS = (REPO / "docs" / "versions.md").read_text()


def requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    listed = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        listed += extra
    return [Requirement(r) for r in listed]


def makefile_pairs() -> dict[str, str]:
    return dict(re.findall(r"^TORCH_NPU_(\d+\.\d+\.\d+) := (\S+)$", MAKEFILE, flags=re.M))


def test_nothing_installed_with_the_harness_asks_for_torchvision() -> None:
    """torchvision's newest release pins the newest torch: depending on it (or on onnx2torch,
    whose metadata asks for it) replaces the torch a host has."""
    names = {r.name.lower() for r in requirements()}
    assert not names & {"torchvision", "onnx2torch"}


def test_the_torch_range_is_the_tested_support_matrix() -> None:
    torch = next(r for r in requirements() if r.name == "torch")
    npu = next(r for r in requirements() if r.name == "torch-npu")
    pairs = makefile_pairs()
    assert set(pairs.values()) == set(re.search(r"^SUPPORTED_TORCH_NPU := (.+)$", MAKEFILE, flags=re.M)[1].split())  # type: ignore[index]
    ci = re.search(r"^CI_TORCH := (.+)$", MAKEFILE, flags=re.M)[1].split()  # type: ignore[index]
    assert set(ci) <= set(pairs) and {"2.6.0", "2.9.0"} <= set(ci)
    for torch_version, npu_version in pairs.items():
        assert Version(npu_version).release[:2] == Version(torch_version).release[:2], (torch_version, npu_version)
        assert torch.specifier.contains(torch_version) and npu.specifier.contains(npu_version, prereleases=False)
        assert f"`{npu_version}`" in VERSIONS, f"docs/versions.md's support matrix does not name torch-npu {npu_version}"
    assert not torch.specifier.contains("2.5.1") and not torch.specifier.contains("2.14.0")  # no wider than tested


def test_the_documented_host_install_is_what_every_ci_venv_runs() -> None:
    """The documented lines (docs/versions.md) that install the extras next to a host's torch, held
    where it is, are the ones scripts/install_venv.sh runs for every CI venv (torch 2.6.0 and 2.9.0
    among them), which then fails if torch moved: CI runs the documented command."""
    script = (REPO / "scripts" / "install_venv.sh").read_text()
    [held] = re.findall(r'^\.venv/bin/python -c "(.+)" > held\.txt$', VERSIONS, flags=re.M)
    assert f'"$py" -c "{held}" > "$venv/held.txt"' in script
    assert re.search(r"^\.venv/bin/pip install -e '\.\[atari,dev\]' -c held\.txt ", VERSIONS, flags=re.M)
    assert '"$py" -m pip install -q -e ".[$extras]" -c "$venv/held.txt"' in script
    assert re.search(r"^extras=dev$", script, flags=re.M), "the dev extra, which takes atari with it"
    [extras] = [d for d in PYPROJECT["project"]["optional-dependencies"]["dev"] if d.startswith("harness[")]
    assert "atari" in extras.removeprefix("harness[").removesuffix("]").split(","), extras


def test_without_onnx2torch_a_graph_is_refused_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.policies import onnx_graph

    onnx_graph._onnx2torch.cache_clear()
    monkeypatch.setitem(sys.modules, "onnx2torch", None)  # `import onnx2torch` raises ModuleNotFoundError
    try:
        with pytest.raises(onnx_graph.GraphError, match=r"onnx2torch is not installed; pip install --no-deps 'onnx2torch"):
            onnx_graph._onnx2torch()
    finally:
        onnx_graph._onnx2torch.cache_clear()
    monkeypatch.undo()
    assert onnx_graph._onnx2torch().__name__ == "onnx2torch"
