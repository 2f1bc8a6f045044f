"""The one table of policy formats: a new format is one class and one registration; a file that
no format claims, that two claim, or that is the wrong kind of `.pt` is refused by name; folders
resolve through the same table; and the import graph has no cycle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grimp
import pytest
import torch
from torch import nn

from harness.errors import PolicyLoadError, UsageError
from harness.policies import CARTPOLE_ZIP, load_policy, registry
from harness.policies.base import ObsInput, PolicyInfo, PolicyNet, mlp
from harness.policies.loader import Peek, PolicyFormat, PolicySpec
from harness.registry import Registry


class ToyFormat(PolicyFormat):
    """A JSON file of one Linear layer's weights: `TOY1` then {"weight": [[...]], "bias": [...]}."""

    name = "toy"
    suffixes = (".toy",)
    what = "a TOY1 header"

    @classmethod
    def claims(cls, peek: Peek) -> bool:
        return peek.head.startswith(b"TOY1")

    @classmethod
    def load(cls, path: Path, spec: PolicySpec) -> PolicyNet:
        layer = json.loads(path.read_bytes()[4:])
        weight, bias = torch.tensor(layer["weight"]), torch.tensor(layer["bias"])
        inputs = (ObsInput("obs", (weight.shape[1],)),)
        info = PolicyInfo(str(path), cls.name, "discrete", inputs, weight.shape[0], sha256="toy")
        head = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            head.weight.copy_(weight)
            head.bias.copy_(bias)
        return PolicyNet(info, mlp([weight.shape[1]], nn.ReLU), head)


@pytest.fixture
def formats(monkeypatch: pytest.MonkeyPatch) -> Registry[type[PolicyFormat]]:
    """The registry's table, restored after the test."""
    monkeypatch.setattr(registry, "FORMATS", registry.FORMATS.copy())
    return registry.FORMATS


def _toy(path: Path) -> Path:
    path.write_bytes(b"TOY1" + json.dumps({"weight": [[1.0, -1.0], [0.5, 0.5]], "bias": [0.0, 0.1]}).encode())
    return path


def test_a_new_format_is_one_class_and_one_registration(formats: Registry[type[PolicyFormat]], tmp_path: Path) -> None:
    toy = _toy(tmp_path / "policy.toy")
    with pytest.raises(UsageError, match="unknown policy"):
        load_policy(str(toy))
    registry.register_format(ToyFormat)
    policy = load_policy(str(toy))
    assert policy.info.source == "toy"
    logits = policy(torch.tensor([[2.0, 1.0]]))
    assert torch.allclose(logits, torch.tensor([[1.0, 1.6]]))
    # Folders resolve through the same table.
    assert load_policy(str(tmp_path)).info.name == str(toy)


def test_a_file_two_formats_claim_is_refused_naming_both(formats: Registry[type[PolicyFormat]], tmp_path: Path) -> None:
    class Twin(ToyFormat):
        name = "twin"

    registry.register_format(ToyFormat)
    registry.register_format(Twin)
    with pytest.raises(PolicyLoadError, match=r"is claimed by several formats \(toy, twin\)"):
        load_policy(str(_toy(tmp_path / "policy.toy")))


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("model.onnx", b"PK\x03\x04 not onnx", "is none of the formats read as .onnx: expected a serialized ONNX ModelProto"),
        ("model.zip", b"\x08\x03 an onnx file named zip", "is none of the formats read as .zip: expected a zip with data and"),
        ("model.pt", b"{not a checkpoint}", "is none of the formats read as .pt: expected a torch.save checkpoint"),
    ],
)
def test_content_that_no_format_claims_is_refused_by_what_was_expected(
    tmp_path: Path, name: str, content: bytes, expected: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(PolicyLoadError, match=expected):
        load_policy(str(path))


def test_a_torchscript_pt_is_refused_by_name_never_read_as_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "actor.pt"
    torch.jit.save(torch.jit.script(nn.Linear(4, 2)), str(path))
    with pytest.raises(PolicyLoadError, match=r"is a TorchScript module \(torch.jit.save\): loading it would run its code"):
        load_policy(str(path))


def test_an_rl_zoo_run_folder_resolves_to_its_zip_and_two_candidates_must_be_named(tmp_path: Path) -> None:
    run = tmp_path / "ppo" / "CartPole-v1_1"
    (run / "CartPole-v1").mkdir(parents=True)
    shutil.copy(CARTPOLE_ZIP, run / "CartPole-v1.zip")
    (run / "CartPole-v1" / "notes.txt").write_text("not a policy")
    assert load_policy(PolicySpec(str(run))).info.name == str(run / "CartPole-v1.zip")
    shutil.copy(CARTPOLE_ZIP, run / "best_model.zip")
    with pytest.raises(UsageError, match=r"several policy files \(CartPole-v1.zip, best_model.zip\); name one"):
        load_policy(str(run))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="holds no policy file"):
        load_policy(str(empty))


def test_the_import_graph_has_no_cycle_package_inits_included() -> None:
    graph = grimp.build_graph("harness", "actors")
    cycles = sorted(
        {
            tuple(sorted((module, imported)))
            for module in graph.modules
            for imported in graph.find_modules_directly_imported_by(module)
            if graph.chain_exists(importer=imported, imported=module)
        }
    )
    assert cycles == []
