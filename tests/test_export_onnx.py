"""export_onnx against onnxruntime: the two layouts, every activation a loader reads, the opsets,
and what it refuses. Every SB3 family's export is checked in tests/test_sb3_families.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from torch import nn

from harness.cli import export_onnx as export_command
from harness.errors import PolicyLoadError, UsageError
from harness.policies.base import BatchNorm, ObsInput, PolicyInfo, PolicyNet, mlp
from harness.policies.export_onnx import ACTIVATIONS, DEFAULT_OPSET, OPSETS, export_onnx
from harness.policies.huggy import huggy_arch
from harness.policies.mlagents_onnx import load_mlagents_onnx
from harness.policies.sb3.archive import ACTIVATIONS as READ_ACTIVATIONS
from harness.policies import PolicySpec, load_policy
from tests.builders import tiny_graph
from tests.helpers import cli

TOL = 1e-6
MLAGENTS_OUTPUTS = [
    "version_number",
    "memory_size",
    "continuous_actions",
    "continuous_action_output_shape",
    "deterministic_continuous_actions",
]


def discrete_policy(activation: type[nn.Module], seed: int = 0, body: nn.Module | None = None) -> PolicyNet:
    info = PolicyInfo(
        name="tiny-discrete",
        source="synthetic",
        action_kind="discrete",
        inputs=(ObsInput("obs", (4,)),),
        action_size=3,
        sha256="0" * 64,
    )
    with torch.random.fork_rng():  # seeded PyTorch default init, without touching the global RNG
        torch.manual_seed(seed)
        return PolicyNet(info, body if body is not None else mlp([4, 64, 64], activation), nn.Linear(64, 3))


def run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = onnxruntime.InferenceSession(str(path))
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def test_every_activation_a_loader_reads_is_written() -> None:
    assert set(READ_ACTIVATIONS.values()) <= set(ACTIVATIONS), set(READ_ACTIVATIONS.values()) - set(ACTIVATIONS)


@pytest.mark.parametrize("activation", list(ACTIVATIONS), ids=lambda cls: cls.__name__)
def test_discrete_export_matches_torch(activation: type[nn.Module], tmp_path: Path) -> None:
    policy = discrete_policy(activation)
    path = tmp_path / "discrete.onnx"
    export_onnx(policy, path)
    session = onnxruntime.InferenceSession(str(path))
    assert [i.name for i in session.get_inputs()] == ["obs"]
    assert [o.name for o in session.get_outputs()] == ["logits", "deterministic_actions"]
    for rows in (1, 300):  # the batch axis is dynamic
        # Wide enough to reach every piece of every activation (Softplus's threshold at 20 included).
        obs = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32) * 30
        logits, actions = session.run(None, {"obs": obs})
        with torch.no_grad():
            expected = policy(torch.from_numpy(obs))
        scale = max(1.0, float(expected.abs().max()))
        assert np.abs(logits - expected.numpy()).max() <= TOL * scale
        assert np.array_equal(actions, policy.deterministic_action(expected).numpy())


@pytest.mark.parametrize("opset", [OPSETS.start, DEFAULT_OPSET, OPSETS.stop - 1])
def test_each_opset_writes_the_same_function(opset: int, tmp_path: Path) -> None:
    """The ops whose form changed across opsets (Clip's bounds, ReduceMean's axes) are written in
    each one's form: a body of ReLU6 and a batch norm, checked by onnx's checker and onnxruntime."""
    norm = BatchNorm(torch.randn(64), torch.rand(64) + 0.5, 1e-3, torch.randn(64), torch.randn(64))
    body = nn.Sequential(nn.Linear(4, 64), nn.ReLU6(), norm, nn.Linear(64, 64), nn.Hardtanh(-0.5, 0.5))
    policy = discrete_policy(nn.ReLU, body=body)
    path = tmp_path / f"opset{opset}.onnx"
    export_onnx(policy, path, opset=opset)
    model = onnx.load(path)
    assert [o.version for o in model.opset_import] == [opset]
    assert model.ir_version == onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)])
    obs = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32) * 3
    with torch.no_grad():
        expected = policy(torch.from_numpy(obs)).numpy()
    assert np.abs(run(path, {"obs": obs})["logits"] - expected).max() <= TOL * max(1.0, float(np.abs(expected).max()))


def test_an_opset_outside_the_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="opset 8 is not one this exporter writes"):
        export_onnx(discrete_policy(nn.ReLU), tmp_path / "old.onnx", opset=8)


def test_continuous_export_matches_torch_with_mlagents_names(tmp_path: Path) -> None:
    policy = huggy_arch()
    path = tmp_path / "huggy.onnx"
    export_onnx(policy, path)
    obs = np.random.default_rng(0).standard_normal((256, 59)).astype(np.float32)
    out = run(path, {"obs_0": obs})
    assert list(out) == MLAGENTS_OUTPUTS
    with torch.no_grad():
        expected = policy.deterministic_action(policy(torch.from_numpy(obs))).numpy()
    assert np.abs(out["deterministic_continuous_actions"] - expected).max() <= TOL
    assert (out["version_number"], out["memory_size"], out["continuous_action_output_shape"]) == ([3.0], [0.0], [21.0])
    # The stochastic output samples in the graph (RandomNormalLike), as ML-Agents' does.
    sampled = out["continuous_actions"]
    assert sampled.shape == expected.shape and np.abs(sampled).max() <= 1.0
    assert not np.allclose(sampled, expected)


def test_continuous_sample_uses_log_sigma(tmp_path: Path) -> None:
    policy = huggy_arch()
    assert policy.log_sigma is not None
    policy.log_sigma.fill_(-30.0)  # sigma ~ 1e-13: the sample collapses onto the mean
    path = tmp_path / "narrow.onnx"
    export_onnx(policy, path)
    out = run(path, {"obs_0": np.random.default_rng(1).standard_normal((64, 59)).astype(np.float32)})
    assert np.abs(out["continuous_actions"] - out["deterministic_continuous_actions"]).max() <= TOL


def test_export_weights_are_float32_and_load_back_labelled(tmp_path: Path) -> None:
    path = tmp_path / "huggy.onnx"
    export_onnx(huggy_arch(), path)
    assert {t.data_type for t in onnx.load(path).graph.initializer} == {onnx.TensorProto.FLOAT}
    info = load_mlagents_onnx(path).info
    assert info.synthetic and info.detail.startswith("SYNTHETIC weights")
    assert info.detail.endswith(f"harness export v3, opset {DEFAULT_OPSET}, 3 x 512 SiLU")


def test_a_module_it_does_not_write_is_refused_by_name(tmp_path: Path) -> None:
    body = nn.Sequential(nn.Linear(4, 64), nn.Softmax(dim=1))
    with pytest.raises(UsageError, match=r"cannot export Softmax at body.1; activations written: Identity, ReLU"):
        export_onnx(discrete_policy(nn.ReLU, body=body), tmp_path / "softmax.onnx")
    with pytest.raises(UsageError, match=r"cannot export GELU\(approximate='tanh'\)"):
        export_onnx(discrete_policy(nn.ReLU, body=nn.Sequential(nn.Linear(4, 64), nn.GELU("tanh"))), tmp_path / "g.onnx")


def test_a_graph_rebuilt_from_onnx_is_refused_naming_its_own_file(tmp_path: Path) -> None:
    path = tiny_graph("Relu", tmp_path / "relu.onnx")
    policy = load_policy(PolicySpec(str(path), action_kind="continuous"))
    with pytest.raises(UsageError) as refused:
        export_onnx(policy, tmp_path / "again.onnx")
    assert f"cannot export GraphModule at body (it came as ONNX: {path} is its graph already)" in str(refused.value)


def test_discrete_export_is_not_taken_for_an_mlagents_one(tmp_path: Path) -> None:
    path = tmp_path / "discrete.onnx"
    export_onnx(discrete_policy(nn.ReLU), path)
    with pytest.raises(PolicyLoadError, match="not an ML-Agents export this reader reads: no version_number output"):
        load_mlagents_onnx(path)


def test_the_commands_opsets_are_the_exporters() -> None:
    """The command repeats them so that --help imports no torch."""
    assert (export_command.DEFAULT_OPSET, export_command.OPSETS) == (DEFAULT_OPSET, OPSETS)


def test_export_command_takes_an_opset_and_refuses_one_outside_the_range(tmp_path: Path) -> None:
    out = tmp_path / "cartpole.onnx"
    proc = cli("export-onnx", "cartpole", str(out), "--opset", "13")
    assert proc.returncode == 0 and "opset 13" in proc.stdout, proc.stderr
    assert [o.version for o in onnx.load(out).opset_import] == [13]
    refused = cli("export-onnx", "cartpole", str(tmp_path / "x.onnx"), "--opset", "19")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "argument --opset: invalid choice: 19" in refused.stderr and not (tmp_path / "x.onnx").exists()
