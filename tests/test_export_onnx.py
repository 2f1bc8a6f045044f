"""export_onnx against onnxruntime: discrete and continuous layouts, names, and the float32 rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from torch import nn

from harness.errors import PolicyLoadError, UsageError
from harness.policies.export_onnx import export_onnx
from harness.policies.base import ObsInput, PolicyInfo, PolicyNet, mlp
from harness.policies.huggy import huggy_arch
from harness.policies.mlagents_onnx import load_mlagents_onnx

TOL = 1e-6
MLAGENTS_OUTPUTS = [
    "version_number",
    "memory_size",
    "continuous_actions",
    "continuous_action_output_shape",
    "deterministic_continuous_actions",
]


def discrete_policy(activation: type[nn.Module], seed: int = 0) -> PolicyNet:
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
        return PolicyNet(info, mlp([4, 64, 64], activation), nn.Linear(64, 3))


def run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = onnxruntime.InferenceSession(str(path))
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


@pytest.mark.parametrize("activation", [nn.ReLU, nn.Tanh, nn.SiLU, nn.ELU, nn.LeakyReLU])
def test_discrete_export_matches_torch(activation: type[nn.Module], tmp_path: Path) -> None:
    policy = discrete_policy(activation)
    path = tmp_path / "discrete.onnx"
    export_onnx(policy, path)
    session = onnxruntime.InferenceSession(str(path))
    assert [i.name for i in session.get_inputs()] == ["obs"]
    assert [o.name for o in session.get_outputs()] == ["logits", "deterministic_actions"]
    for rows in (1, 300):  # the batch axis is dynamic
        obs = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32) * 2
        logits, actions = session.run(None, {"obs": obs})
        with torch.no_grad():
            expected = policy(torch.from_numpy(obs))
        assert np.abs(logits - expected.numpy()).max() <= TOL
        assert np.array_equal(actions, policy.deterministic_action(expected).numpy())


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
    assert info.detail.endswith("harness export v3, opset 9, 3 x 512 SiLU")


def test_unknown_activation_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot export GELU"):
        export_onnx(discrete_policy(nn.GELU), tmp_path / "gelu.onnx")


def test_discrete_export_is_not_taken_for_an_mlagents_one(tmp_path: Path) -> None:
    path = tmp_path / "discrete.onnx"
    export_onnx(discrete_policy(nn.ReLU), path)
    with pytest.raises(PolicyLoadError, match="not an ML-Agents continuous-action export: no version_number output"):
        load_mlagents_onnx(path)
