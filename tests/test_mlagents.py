"""ML-Agents loaders on real files: an export of 3DBall's shape written here and, where
../shared/cases is present, the real 3DBall export; our own multi-input exports and checkpoints,
each compared with onnxruntime; and the files they must refuse."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
import onnxruntime
import pytest
import torch
from onnx import numpy_helper

from harness.errors import PolicyLoadError
from harness.policies.export_onnx import export_onnx
from harness.policies import load_policy
from harness.policies.base import NORMALIZER_CLAMP, PolicyNet
from harness.policies.huggy import huggy_arch, huggy_state_dict
from harness.policies.mlagents_onnx import load_mlagents_onnx
from harness.policies.mlagents import HEAD, PROCESSORS
from harness.policies.mlagents_pt import load_mlagents_pt
from tests.builders import mlagents_layout_export, mlagents_state_dict, save_with_external_data
from tests.third_party import BALL, BALL_SHA256, BALL_TABLE

TOL = 1e-6


@pytest.fixture(params=["built", "3DBall"])
def ball(request: pytest.FixtureRequest) -> Path:
    """An ML-Agents v3 export of 8 observations, 2 x 128 Swish and 2 actions: the one written
    here, and the real 3DBall where ../shared/cases is present."""
    if request.param == "3DBall":
        return request.getfixturevalue("cases") / BALL
    return request.getfixturevalue("mlagents_export")


def act(policy: PolicyNet, *obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return policy.deterministic_action(policy(*map(torch.from_numpy, obs))).numpy()


def onnx_act(path: Path, *obs: np.ndarray) -> np.ndarray:
    feeds = {f"obs_{i}": x for i, x in enumerate(obs)}
    return onnxruntime.InferenceSession(str(path)).run(["deterministic_continuous_actions"], feeds)[0]


def observations(sizes: tuple[int, ...], seed: int = 0, rows: int = 256) -> list[np.ndarray]:
    # Scale 3 so that some values reach the normalizer clamp.
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, n)) * 3).astype(np.float32) for n in sizes]


def edited(model: onnx.ModelProto, initializer: str, value: np.ndarray, out: Path) -> Path:
    """A copy of `model` with one initializer replaced, saved to `out`."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    target = next(t for t in model.graph.initializer if t.name == initializer)
    target.CopyFrom(numpy_helper.from_array(value, initializer))
    onnx.save(model, out)
    return out


def producer(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    return next((node for node in model.graph.node if name in node.output), None)


def version_constant(model: onnx.ModelProto) -> str:
    """The initializer the version_number output is an Identity of."""
    node = producer(model, "version_number")
    assert node is not None and node.op_type == "Identity"
    return node.input[0]


def gemm_weights(model: onnx.ModelProto) -> list[str]:
    """The weight initializer of each Gemm, input to mu."""
    return [node.input[1] for node in model.graph.node if node.op_type == "Gemm"]


def normalizer_std(model: onnx.ModelProto) -> str:
    """The constant the normalizer divides by (3DBall: onnx::Div_51, folded by the exporter)."""
    return next(
        node.input[1]
        for node in model.graph.node
        if node.op_type == "Div" and getattr(producer(model, node.input[0]), "op_type", None) == "Sub"
    )


def test_3dball_reproduces_the_table(cases: Path) -> None:
    policy = load_mlagents_onnx(cases / BALL)
    obs = np.array([row for row, _ in BALL_TABLE], dtype=np.float32)
    expected = np.array([actions for _, actions in BALL_TABLE], dtype=np.float32)
    assert np.abs(act(policy, obs) - expected).max() <= TOL


def test_3dball_records_what_it_is(cases: Path) -> None:
    info = load_mlagents_onnx(cases / BALL).info
    assert (info.source, info.action_kind, info.obs_sizes, info.action_size) == ("mlagents-onnx", "continuous", (8,), 2)
    assert info.sha256 == BALL_SHA256
    assert info.onnx_path == str(cases / BALL)
    assert info.detail == "ML-Agents export v3, opset 9, 2 x 128 SiLU"
    assert not info.synthetic


def test_our_export_records_what_it_is(mlagents_export: Path) -> None:
    info = load_mlagents_onnx(mlagents_export).info
    assert (info.source, info.action_kind, info.obs_sizes, info.action_size) == ("mlagents-onnx", "continuous", (8,), 2)
    assert info.sha256 == hashlib.sha256(mlagents_export.read_bytes()).hexdigest()
    assert info.onnx_path == str(mlagents_export)
    assert info.detail == "harness export v3, opset 9, 2 x 128 SiLU"  # as ML-Agents writes it (tests/builders.py)


def test_matches_onnxruntime_and_the_check_catches_a_wrong_weight(ball: Path) -> None:
    policy = load_mlagents_onnx(ball)
    (obs,) = observations((8,), rows=2000)
    reference = onnx_act(ball, obs)
    assert np.abs(act(policy, obs) - reference).max() <= TOL
    with torch.no_grad():
        policy.body[0].weight[0, 0] += 1e-3
    assert np.abs(act(policy, obs) - reference).max() > TOL


def test_normalizer_is_the_folded_constant_not_a_guess(ball: Path) -> None:
    # The rebuilt std must be the graph's Div constant; sqrt(var + eps) is the classic wrong guess.
    policy = load_mlagents_onnx(ball)
    model = onnx.load(ball)
    std = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == normalizer_std(model))
    assert np.array_equal(policy.normalizer.std().numpy(), std)


def test_clip_bounds_given_as_inputs_load_the_same(ball: Path, tmp_path: Path) -> None:
    # From opset 11 on, Clip takes its bounds as inputs; onnx's own converter writes them so.
    converted = onnx.version_converter.convert_version(onnx.load(ball), 13)
    assert not any(a.name == "min" for node in converted.graph.node if node.op_type == "Clip" for a in node.attribute)
    path = tmp_path / "opset13.onnx"
    onnx.save(converted, path)
    (obs,) = observations((8,))
    assert np.array_equal(act(load_mlagents_onnx(path), obs), act(load_mlagents_onnx(ball), obs))
    assert "opset 13" in load_mlagents_onnx(path).info.detail


@pytest.mark.parametrize("obs_sizes", [(3, 5), (4, 1, 6)])
def test_multi_input_checkpoint_export_and_onnx_agree(obs_sizes: tuple[int, ...], tmp_path: Path) -> None:
    checkpoint = tmp_path / "policy.pt"
    torch.save({"Policy": mlagents_state_dict(obs_sizes, hidden=32, actions=3, seed=len(obs_sizes))}, checkpoint)
    from_pt = load_mlagents_pt(checkpoint)
    exported = tmp_path / "policy.onnx"
    export_onnx(from_pt, exported)
    from_onnx = load_mlagents_onnx(exported)

    assert from_pt.info.obs_sizes == from_onnx.info.obs_sizes == obs_sizes
    obs = observations(obs_sizes)
    reference = onnx_act(exported, *obs)
    assert np.abs(act(from_onnx, *obs) - reference).max() <= TOL
    assert np.abs(act(from_pt, *obs) - reference).max() <= TOL


def test_multi_input_normalizers_clamp_each_input(tmp_path: Path) -> None:
    checkpoint = tmp_path / "policy.pt"
    torch.save(mlagents_state_dict((2, 3), hidden=8, actions=2, seed=7), checkpoint)
    policy = load_mlagents_pt(checkpoint)
    far = [np.full((1, 2), 1e6, np.float32), np.full((1, 3), -1e6, np.float32)]
    with torch.no_grad():
        normalized = policy.normalizer(torch.cat([torch.from_numpy(x) for x in far], dim=-1))
    assert normalized.tolist() == [[NORMALIZER_CLAMP] * 2 + [-NORMALIZER_CLAMP] * 3]


def test_huggy_checkpoint_round_trip(tmp_path: Path) -> None:
    # The Huggy file layout: the Policy state dict beside optimizer state, as ML-Agents saves it.
    checkpoint = tmp_path / "Huggy-2000050.pt"
    torch.save({"Policy": huggy_state_dict(), "Optimizer:adam": {"state": {}, "param_groups": []}}, checkpoint)
    loaded = load_policy(str(checkpoint))
    reference = huggy_arch()
    (obs,) = observations((59,))
    assert np.array_equal(act(loaded, obs), act(reference, obs))
    assert loaded.normalizer.normalization_steps.item() == 2_000_050
    info = loaded.info
    assert (info.source, info.obs_sizes, info.action_size) == ("mlagents-pt", (59,), 21)
    assert info.sha256 == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert info.detail == "ML-Agents checkpoint, 3 x 512 SiLU"


def test_bare_state_dict_loads_too(tmp_path: Path) -> None:
    checkpoint = tmp_path / "bare.pt"
    torch.save(huggy_state_dict(), checkpoint)
    (obs,) = observations((59,), rows=8)
    assert np.array_equal(act(load_mlagents_pt(checkpoint), obs), act(huggy_arch(), obs))


def assert_one_line_error(error: pytest.ExceptionInfo[PolicyLoadError], path: Path, problem: str) -> None:
    message = str(error.value)
    assert message.startswith(f"{path}: ") and problem in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"this is not onnx at all", "not an ONNX model"),
        (b"", "no version_number output"),  # an empty protobuf parses as an empty model
    ],
)
def test_unreadable_onnx_is_refused(content: bytes, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_onnx(path)
    assert_one_line_error(error, path, problem)


def test_onnx_with_wrong_version_or_shapes_is_refused(ball: Path, tmp_path: Path) -> None:
    model = onnx.load(ball)
    bad_version = edited(model, version_constant(model), np.array([4.0], np.float32), tmp_path / "v4.onnx")
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_onnx(bad_version)
    assert_one_line_error(error, bad_version, "model version [4.0], supported: 2, 3")

    weight = np.zeros((128, 64), np.float32)
    bad_shape = edited(model, gemm_weights(model)[1], weight, tmp_path / "shape.onnx")
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_onnx(bad_shape)
    assert_one_line_error(error, bad_shape, "layer 1 has weight (128, 64)")

    std = normalizer_std(model)
    bad_std = edited(model, std, np.ones(7, np.float32), tmp_path / "std.onnx")
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_onnx(bad_std)
    assert_one_line_error(error, bad_std, f"normalizer std {std!r} is float32 [7], expected 8 floats")


def test_onnx_with_truncated_weights_is_refused(ball: Path, tmp_path: Path) -> None:
    model = onnx.load(ball)
    weight = next(t for t in model.graph.initializer if t.name == gemm_weights(model)[1])
    weight.raw_data = weight.raw_data[:100]
    path = tmp_path / "truncated.onnx"
    onnx.save(model, path)
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_onnx(path)
    assert_one_line_error(error, path, "malformed ONNX tensor (cannot reshape array of size 25 into shape (128,128))")


def test_onnx_with_another_activation_is_refused(ball: Path, tmp_path: Path) -> None:
    model = onnx.load(ball)
    next(node for node in model.graph.node if node.op_type == "Sigmoid").op_type = "Tanh"
    path = tmp_path / "tanh.onnx"
    onnx.save(model, path)
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_onnx(path)
    # Without a Swish after it the first Gemm reads as mu, and the action output does not fit.
    assert_one_line_error(error, path, "which feeds ['Tanh', 'Mul']")


def test_unreadable_checkpoints_are_refused(tmp_path: Path) -> None:
    text = tmp_path / "text.pt"
    text.write_text("not a checkpoint")
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_pt(text)
    assert_one_line_error(error, text, "not a readable torch checkpoint")

    module = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), module)  # a pickled object: weights_only must refuse it
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_pt(module)
    assert_one_line_error(error, module, "not a readable torch checkpoint")

    tensor = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), tensor)
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_pt(tensor)
    assert_one_line_error(error, tensor, "holds a Tensor, not an ML-Agents checkpoint dict")


def test_checkpoints_with_missing_keys_or_wrong_shapes_are_refused(tmp_path: Path) -> None:
    missing = huggy_state_dict()
    del missing[f"{HEAD}.mu.bias"]
    path = tmp_path / "missing.pt"
    torch.save({"Policy": missing}, path)
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_pt(path)
    assert_one_line_error(error, path, f"missing '{HEAD}.mu.bias'")

    wrong = huggy_state_dict()
    wrong[f"{HEAD}.mu.weight"] = torch.zeros(21, 256)
    path = tmp_path / "wrong.pt"
    torch.save({"Policy": wrong}, path)
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_pt(path)
    assert_one_line_error(error, path, "mu has weight (21, 256) and bias (21,), expected [out, 512] and [out]")

    stats = huggy_state_dict()
    stats[f"{PROCESSORS}.0.normalizer.running_variance"] = torch.ones(58)
    path = tmp_path / "stats.pt"
    torch.save({"Policy": stats}, path)
    with pytest.raises(PolicyLoadError) as error:
        load_mlagents_pt(path)
    assert_one_line_error(error, path, "processor 0 normalizer has running_mean (59,), running_variance (58,)")


def test_external_weights_are_part_of_the_export_identity(tmp_path: Path) -> None:
    """Two exports whose .onnx files are the same bytes and whose external weights differ: two
    policies, each with the sha256 of its .onnx and then its weights file."""
    checkpoint = tmp_path / "policy.pt"
    torch.save(mlagents_state_dict((4,), hidden=8, actions=2, seed=3), checkpoint)
    export_onnx(load_mlagents_pt(checkpoint), tmp_path / "policy.onnx")
    model = onnx.load(tmp_path / "policy.onnx")
    weight = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "head.weight"))
    paths = []
    for copy, scale in (("a", 1.0), ("b", 2.0)):
        edited(model, "head.weight", weight * scale, tmp_path / f"{copy}.onnx")
        paths.append(save_with_external_data(onnx.load(tmp_path / f"{copy}.onnx"), tmp_path / copy / "policy.onnx"))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    policies = [load_policy(str(path)) for path in paths]
    for path, policy in zip(paths, policies, strict=True):
        assert policy.info.source == "mlagents-onnx"
        assert policy.info.sha256 == hashlib.sha256(path.read_bytes() + (path.parent / "weights.bin").read_bytes()).hexdigest()
    assert policies[0].info.sha256 != policies[1].info.sha256
    assert torch.equal(2 * policies[0].head.weight, policies[1].head.weight)


def test_onnx_tensor_of_an_unknown_data_type_is_refused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "policy.pt"
    torch.save(mlagents_state_dict((4,), hidden=8, actions=2, seed=3), checkpoint)
    export_onnx(load_mlagents_pt(checkpoint), tmp_path / "policy.onnx")
    model = onnx.load(tmp_path / "policy.onnx")
    next(t for t in model.graph.initializer if t.name == "head.bias").data_type = 9999
    path = tmp_path / "unknown-type.onnx"
    onnx.save(model, path)
    with pytest.raises(PolicyLoadError) as error:
        load_policy(str(path))
    assert_one_line_error(
        error, path, "malformed ONNX tensor (tensor 'head.bias' has data type 9999, which has no numpy type)"
    )


def test_one_discrete_branch_reads_with_its_masks_as_onnxruntime_runs_it(tmp_path: Path) -> None:
    """One branch of 5 actions with action_masks: a masked policy whose batches draw masks; its
    masked logits and greedy actions are onnxruntime's on the file (the loader check's reference,
    the bool masks fed as ML-Agents' 1/0), no masked action is chosen, and the ignore-masks fault
    chooses some."""
    from harness.devices import cpu_reference
    from harness.inference.faults import ignore_masks
    from harness.inference.forward import run_batch
    from harness.judge.compare import compare_masks
    from harness.policies import cast_policy
    from harness.policies.base import ACTION_MASK
    from harness.policies.onnx_any import onnx_reference
    from harness.workloads import make_batch

    path = mlagents_layout_export(tmp_path / "discrete.onnx", branches=(5,))
    policy = load_policy(str(path))
    assert (policy.info.action_kind, policy.info.action_size, policy.info.masked) == ("discrete", 5, True)
    assert "5 discrete actions, action masks" in policy.info.detail
    batch = make_batch(policy.info, "normal", 256, 1)
    masks = batch.step_input(ACTION_MASK)
    assert masks is not None and not masks.all()
    ours = run_batch(policy, cpu_reference(), batch.obs, batch.noise)
    theirs = onnx_reference(policy.info, 1).run(batch.obs)
    assert set(theirs) == {"logits", "action"}
    np.testing.assert_allclose(theirs["logits"], ours["logits"], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(theirs["action"], ours["action"])
    assert compare_masks(ours["action"], masks).passed and compare_masks(ours["stochastic_action"], masks).passed
    broken = cast_policy(policy, "float32")
    ignore_masks(broken)
    assert not compare_masks(run_batch(broken, cpu_reference(), batch.obs, batch.noise)["action"], masks).passed
