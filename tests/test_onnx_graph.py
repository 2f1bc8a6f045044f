"""Any ONNX graph, rebuilt by onnx2torch: SB3's documented export, a CleanRL-style MLP, two inputs,
an in-graph normalizer, MatMul layers; the dtype rule on every activation; onnxruntime on the
original file as the reference (ML-Agents included), and a rebuild it must catch; the graphs it
must refuse."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from harness.errors import PolicyLoadError
from harness.judge.compare import TOLERANCES, compare_tolerance
from harness.policies import PolicySpec, cast_policy, load_policy
from harness.policies.base import PolicyNet
from harness.policies.onnx_any import onnx_reference
from harness.policies.onnx_graph import _check_operators, _newest_opset, _torchvision_loads
from harness.policies.onnx_model import BUILD_BUDGET, read_model
from tests.builders import OnnxableSB3Policy, save_with_external_data, tiny_graph
from tests.helpers import assert_usage_error, cli
from tests.third_party import BALL, BALL_TABLE

TOL = 1e-6  # the rebuild against the torch module it was exported from
REF_TOL = 1e-5  # the rebuild against onnxruntime
ROWS = 256


def observations(*sizes: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple((rng.standard_normal((ROWS, n)) * 2).astype(np.float32) for n in sizes)


def head_out(policy: PolicyNet, obs: tuple[np.ndarray, ...]) -> np.ndarray:
    with torch.inference_mode():
        return policy(*map(torch.from_numpy, obs)).numpy()


def export(module: nn.Module, path: Path, sizes: tuple[int, ...], outputs: list[str]) -> Path:
    """torch.onnx.export with a dynamic batch, TorchScript exporter (the dynamo one needs onnxscript)."""
    names = [f"obs_{i}" for i in range(len(sizes))] if len(sizes) > 1 else ["obs"]
    args = tuple(torch.zeros(1, n) for n in sizes)
    axes = {name: {0: "batch"} for name in [*names, *outputs]}
    torch.onnx.export(
        module.eval(),
        args,
        str(path),
        input_names=names,
        output_names=outputs,
        dynamic_axes=axes,
        opset_version=17,
        dynamo=False,
    )
    return path


def one_line_refusal(spec: PolicySpec | str, *words: str) -> None:
    with pytest.raises(PolicyLoadError) as error:
        load_policy(spec)
    message = str(error.value)
    path = spec.source if isinstance(spec, PolicySpec) else spec
    assert "\n" not in message and message.startswith(f"{path}: "), message
    for word in words:
        assert word in message, message


class CleanRLActor(nn.Module):
    """CleanRL's continuous actor mean: Linear, Tanh, Linear, Tanh, Linear."""

    def __init__(self, obs: int, actions: int) -> None:
        super().__init__()
        self.actor_mean = nn.Sequential(nn.Linear(obs, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.actor_mean(x)


class TwoInputs(nn.Module):
    """Two observation inputs, concatenated; discrete logits and their ArgMax."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(torch.cat([a, b], dim=1))
        return logits, torch.argmax(logits, dim=1)


class Normalized(nn.Module):
    """Observation normalization in the graph, before the first layer: Sub, Div, Clip."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.linspace(-1, 1, 6))
        self.register_buffer("std", torch.linspace(0.5, 3, 6))
        self.actor = CleanRLActor(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.actor(torch.clamp((x - self.mean) / self.std, -5.0, 5.0))


class MatMuls(nn.Module):
    """Layers written as x @ W + b, as TensorFlow and JAX exports write them: MatMul and Add."""

    def __init__(self) -> None:
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(4, 32) / 2), nn.Parameter(torch.randn(32))
        self.w2, self.b2 = nn.Parameter(torch.randn(32, 2) / 6), nn.Parameter(torch.randn(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w1 + self.b1) @ self.w2 + self.b2


class MeanAndValue(nn.Module):
    """Two float outputs and no ArgMax: which one is the head, only the user can say."""

    def __init__(self) -> None:
        super().__init__()
        self.mu, self.value = nn.Linear(4, 2), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mu(x), self.value(x)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx_graph")


@pytest.fixture(scope="module")
def sb3(folder: Path) -> tuple[object, Path]:
    """A PPO trained for 256 steps on CartPole-v1, exported with SB3's recipe (batch fixed at 1)."""
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu")
    model.learn(total_timesteps=256)
    path = folder / "sb3-ppo.onnx"
    torch.onnx.export(
        OnnxableSB3Policy(model.policy), torch.randn(1, 4), str(path), opset_version=17, input_names=["input"], dynamo=False
    )
    return model, path


def seeded(cls: type[nn.Module], *args: int) -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return cls(*args)


@pytest.fixture(scope="module")
def cleanrl(folder: Path) -> tuple[nn.Module, Path]:
    actor = seeded(CleanRLActor, 4, 2)
    return actor, export(actor, folder / "cleanrl.onnx", (4,), ["mu"])


@pytest.fixture(scope="module")
def two_inputs(folder: Path) -> tuple[nn.Module, Path]:
    module = seeded(TwoInputs)
    return module, export(module, folder / "two-inputs.onnx", (3, 2), ["logits", "action"])


@pytest.fixture(scope="module")
def normalized(folder: Path) -> tuple[nn.Module, Path]:
    module = seeded(Normalized)
    return module, export(module, folder / "normalized.onnx", (6,), ["mu"])


@pytest.fixture(scope="module")
def matmuls(folder: Path) -> tuple[nn.Module, Path]:
    module = seeded(MatMuls)
    return module, export(module, folder / "matmuls.onnx", (4,), ["mu"])


def sb3_logits(model: object, obs: np.ndarray) -> np.ndarray:
    policy = model.policy  # type: ignore[attr-defined]
    with torch.no_grad():
        latent = policy.mlp_extractor.forward_actor(policy.extract_features(torch.from_numpy(obs)))
        return policy.action_net(latent).numpy()


def test_sb3_export_matches_sb3(sb3: tuple[object, Path]) -> None:
    model, path = sb3
    policy = load_policy(str(path))
    info = policy.info
    assert (info.source, info.action_kind, info.obs_sizes, info.action_size) == ("onnx-graph", "discrete", (4,), 2)
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and info.onnx_path == str(path)
    assert "opset 17" in info.detail and "feeds ArgMax" in info.detail, info.detail
    (obs,) = observations(4)
    logits = head_out(policy, (obs,))
    assert np.abs(logits - sb3_logits(model, obs)).max() <= TOL
    actions, _ = model.predict(obs, deterministic=True)  # type: ignore[attr-defined]
    assert np.array_equal(policy.deterministic_action(torch.from_numpy(logits)).numpy(), actions)


def test_cleanrl_mlp_needs_and_takes_the_action_kind(cleanrl: tuple[nn.Module, Path]) -> None:
    actor, path = cleanrl
    one_line_refusal(str(path), "'mu'", "pass --action-kind discrete|continuous")
    assert_usage_error(cli("export-onnx", str(path), str(path.with_suffix(".out.onnx"))), f"{path}:", "--action-kind")
    policy = load_policy(PolicySpec(str(path), action_kind="continuous"))
    assert (policy.info.action_kind, policy.info.obs_sizes, policy.info.action_size) == ("continuous", (4,), 2)
    assert policy.normalizer is None and "only float output" in policy.info.detail
    (obs,) = observations(4)
    mu = head_out(policy, (obs,))
    with torch.no_grad():
        assert np.abs(mu - actor(torch.from_numpy(obs)).numpy()).max() <= TOL
    assert np.array_equal(policy.deterministic_action(torch.from_numpy(mu)).numpy(), mu)  # SB3/CleanRL Box: the action is mu


def test_two_float_inputs_are_concatenated_in_order(two_inputs: tuple[nn.Module, Path]) -> None:
    module, path = two_inputs
    policy = load_policy(str(path))
    assert (policy.info.action_kind, policy.info.obs_sizes, policy.info.action_size) == ("discrete", (3, 2), 3)
    obs = observations(3, 2)
    with torch.no_grad():
        expected, actions = module(*map(torch.from_numpy, obs))
    logits = head_out(policy, obs)
    assert np.abs(logits - expected.numpy()).max() <= TOL
    assert np.array_equal(policy.deterministic_action(torch.from_numpy(logits)).numpy(), actions.numpy())


def test_normalization_before_the_first_layer_is_the_float32_normalizer(normalized: tuple[nn.Module, Path]) -> None:
    module, path = normalized
    policy = load_policy(PolicySpec(str(path), action_kind="continuous"))
    assert policy.normalizer is not None
    assert "Sub, Div, Clip" in policy.info.obs_normalization, policy.info.obs_normalization
    body_ops = {type(m).__name__ for m in policy.body.modules()}
    assert "Linear" in body_ops and "OnnxClip" not in body_ops  # the cut is at the Clip's output
    (obs,) = observations(6)
    obs[:8] *= 20  # beyond the clamp
    with torch.no_grad():
        assert np.abs(head_out(policy, (obs,)) - module(torch.from_numpy(obs)).numpy()).max() <= TOL


def test_matmul_on_constant_weights_becomes_a_linear(matmuls: tuple[nn.Module, Path]) -> None:
    module, path = matmuls
    assert [n.op_type for n in onnx.load(path).graph.node].count("MatMul") == 2
    policy = load_policy(PolicySpec(str(path), action_kind="continuous"))
    layers = [type(m).__name__ for m in policy.body.modules()]
    assert layers.count("Linear") == 2 and "OnnxMatMul" not in layers, layers
    (obs,) = observations(4)
    with torch.no_grad():
        assert np.abs(head_out(policy, (obs,)) - module(torch.from_numpy(obs)).numpy()).max() <= TOL


def leaf_outputs(policy: PolicyNet, obs: tuple[np.ndarray, ...]) -> dict[str, set[torch.dtype]]:
    """The dtypes of the floating tensors each leaf module returns, in one forward."""
    seen: dict[str, set[torch.dtype]] = {}
    leaves = {m: name for name, m in policy.named_modules() if name and next(m.children(), None) is None}

    def record(module: nn.Module, _inputs: object, output: object) -> None:
        for t in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                seen.setdefault(leaves[module], set()).add(t.dtype)

    handles = [m.register_forward_hook(record) for m in leaves]
    try:
        head_out(policy, obs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


GRAPHS = ["sb3", "cleanrl", "two_inputs", "normalized", "matmuls"]
KINDS = {"cleanrl": "continuous", "normalized": "continuous", "matmuls": "continuous"}


def load(request: pytest.FixtureRequest, graph: str) -> PolicyNet:
    _, path = request.getfixturevalue(graph)
    return load_policy(PolicySpec(str(path), action_kind=KINDS.get(graph)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("graph", GRAPHS)
def test_every_activation_after_the_normalizer_is_in_the_card_dtype(
    graph: str, dtype: str, request: pytest.FixtureRequest
) -> None:
    policy = load(request, graph)
    cast = cast_policy(policy, dtype)
    card = cast.compute_dtype
    floats = [t for part in (cast.body, cast.head) for t in (*part.parameters(), *part.buffers()) if t.is_floating_point()]
    assert floats and {t.dtype for t in floats} == {card}
    seen = leaf_outputs(cast, observations(*policy.info.obs_sizes))
    body = {name: dtypes for name, dtypes in seen.items() if not name.startswith("normalizer.")}
    assert len(body) >= 5 and set().union(*body.values()) == {card}, body  # Casts in the graph included
    assert set().union(*(d for name, d in seen.items() if name.startswith("normalizer."))) <= {torch.float32}
    assert head_out(cast, observations(*policy.info.obs_sizes)).dtype == np.float32


@pytest.mark.parametrize("graph", GRAPHS)
def test_float64_golden_is_float64_throughout(graph: str, request: pytest.FixtureRequest) -> None:
    policy = load(request, graph)
    golden = cast_policy(policy, "float64")
    assert {t.dtype for t in (*golden.parameters(), *golden.buffers()) if t.is_floating_point()} == {torch.float64}
    obs = observations(*policy.info.obs_sizes)
    assert set().union(*leaf_outputs(golden, obs).values()) == {torch.float64}
    out = head_out(golden, obs)
    assert out.dtype == np.float64 and np.abs(out - head_out(policy, obs)).max() <= REF_TOL


@pytest.mark.parametrize("graph", GRAPHS)
def test_onnxruntime_on_the_original_file_agrees(graph: str, request: pytest.FixtureRequest) -> None:
    policy = load(request, graph)
    obs = observations(*policy.info.obs_sizes)
    ref = onnx_reference(policy.info, threads=1).run(obs)  # SB3's batch-1 graph: 256 runs of one row
    head = "logits" if policy.info.action_kind == "discrete" else "mu"
    out = head_out(policy, obs)
    assert np.abs(ref[head] - out).max() <= REF_TOL
    if policy.info.action_kind == "discrete":  # the graph's own int64 ArgMax output
        assert np.array_equal(ref["action"], policy.deterministic_action(torch.from_numpy(out)).numpy())
    else:
        assert set(ref) == {"mu"}


@pytest.mark.parametrize("which", ["built", "3DBall"])
def test_mlagents_export_goes_through_the_same_reference(which: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue("mlagents_export") if which == "built" else request.getfixturevalue("cases") / BALL
    policy = load_policy(str(path))
    assert policy.info.source == "mlagents-onnx"
    obs = observations(8)
    obs[0][0] = 0.0
    ref = onnx_reference(policy.info, threads=1).run(obs)
    assert set(ref) == {"action"}
    with torch.inference_mode():
        action = policy.deterministic_action(policy(torch.from_numpy(obs[0]))).numpy()
    assert np.abs(ref["action"] - action).max() <= REF_TOL
    if which == "3DBall":  # deterministic_continuous_actions of a zero observation, from its table
        assert np.abs(ref["action"][0] - BALL_TABLE[0][1]).max() <= 1e-7


def test_onnxruntime_catches_a_changed_weight(sb3: tuple[object, Path]) -> None:
    _, path = sb3
    policy = load_policy(str(path))
    (obs,) = observations(4)
    ref = onnx_reference(policy.info, threads=1).run((obs,))
    assert compare_tolerance(head_out(policy, (obs,)), ref["logits"], TOLERANCES["float32"]).passed
    first = next(m for m in policy.body.modules() if isinstance(m, nn.Linear))
    with torch.no_grad():
        first.weight[0, 0] += 0.05
    result = compare_tolerance(head_out(policy, (obs,)), ref["logits"], TOLERANCES["float32"])
    assert not result.passed and result.max_abs > 10 * REF_TOL, result


def test_onnx_output_picks_the_head_and_must_exist(folder: Path) -> None:
    path = export(seeded(MeanAndValue), folder / "mean-and-value.onnx", (4,), ["mu", "value"])
    one_line_refusal(
        PolicySpec(str(path), action_kind="continuous"), "2 float outputs (mu, value) and no ArgMax", "--onnx-output"
    )
    one_line_refusal(
        PolicySpec(str(path), onnx_output="actions", action_kind="continuous"), "--onnx-output 'actions' is not a tensor"
    )
    policy = load_policy(PolicySpec(str(path), onnx_output="mu", action_kind="continuous"))
    assert policy.info.action_size == 2 and "named by --onnx-output" in policy.info.detail


def test_argmax_head_is_not_continuous(sb3: tuple[object, Path]) -> None:
    one_line_refusal(PolicySpec(str(sb3[1]), action_kind="continuous"), "--action-kind continuous", "feeds ArgMax")


def test_newer_opset_is_refused(cleanrl: tuple[nn.Module, Path], folder: Path) -> None:
    model = onnx.load(cleanrl[1])
    newer = _newest_opset() + 1
    model.opset_import[0].version = newer
    path = folder / "newer-opset.onnx"
    onnx.save(model, path)
    one_line_refusal(PolicySpec(str(path), action_kind="continuous"), f"opset {newer} is newer than onnx2torch converts")


def test_unsupported_operator_is_refused_by_name(folder: Path) -> None:
    path = tiny_graph("Shrink", folder / "shrink.onnx")
    one_line_refusal(
        PolicySpec(str(path), action_kind="continuous"), "operator Shrink (node 'odd') has no onnx2torch converter at opset 17"
    )


def test_onnx2torch_loads_without_torchvision(folder: Path) -> None:
    """Beside this torch, PyPI's torchvision cannot load; onnx2torch still does, through a stand-in
    that is gone from sys.modules afterwards, and torchvision's two operators are refused."""
    load_policy(PolicySpec(str(tiny_graph("Relu", folder / "relu.onnx")), action_kind="continuous"))
    if _torchvision_loads():
        pytest.skip("torchvision loads here: onnx2torch uses it untouched")
    assert "torchvision" not in sys.modules and "torchvision.ops" not in sys.modules
    nms = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["picked"], name="nms")
    with pytest.raises(ValueError, match="operator NonMaxSuppression \\(node 'nms'\\) needs torchvision"):
        _check_operators(helper.make_graph([nms], "nms", [], []), 17)


@contextlib.contextmanager
def files_opened() -> Iterator[list[str]]:
    """Every path this process opens meanwhile, by any Python call (the `open` audit event)."""
    opened: list[str] = []
    recording = True

    def hook(event: str, args: tuple[object, ...]) -> None:
        if recording and event == "open":
            opened.append(str(args[0]))

    sys.addaudithook(hook)
    try:
        yield opened
    finally:
        recording = False  # an audit hook cannot be removed: this one stops recording


def test_external_weights_are_part_of_the_policy_identity(tmp_path: Path) -> None:
    """Two models whose .onnx files are the same bytes and whose external weights differ are two
    policies: the sha256 covers the .onnx, then its external data files."""
    model = onnx.load(tiny_graph("Relu", tmp_path / "relu.onnx"))
    paths = []
    for scale in (1.0, 2.0):
        weight = next(t for t in model.graph.initializer if t.name == "weight")
        weight.CopyFrom(numpy_helper.from_array(np.full((4, 2), scale, np.float32), "weight"))
        paths.append(save_with_external_data(model, tmp_path / f"scale-{scale:g}" / "policy.onnx"))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    policies = [load_policy(PolicySpec(str(path), action_kind="continuous")) for path in paths]
    for path, policy in zip(paths, policies, strict=True):
        expected = hashlib.sha256(path.read_bytes() + (path.parent / "weights.bin").read_bytes()).hexdigest()
        assert policy.info.sha256 == expected
    assert policies[0].info.sha256 != policies[1].info.sha256
    (obs,) = observations(4)
    assert np.array_equal(2 * head_out(policies[0], (obs,)), head_out(policies[1], (obs,)))
    assert set(onnx_reference(policies[1].info, threads=1).run((obs,))) == {"mu"}  # onnxruntime reads it too


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_external_data_outside_the_model_folder_is_refused_and_never_opened(where: str, tmp_path: Path) -> None:
    path = save_with_external_data(onnx.load(tiny_graph("Relu", tmp_path / "relu.onnx")), tmp_path / "model" / "policy.onnx")
    outside = tmp_path / "outside.bin"
    (path.parent / "weights.bin").rename(outside)  # the data is there, and readable: only its place is wrong
    location = str(outside) if where == "absolute" else "../outside.bin"
    model = onnx.load(path, load_external_data=False)
    for tensor in model.graph.initializer:
        next(entry for entry in tensor.external_data if entry.key == "location").value = location
    onnx.save(model, path)
    with files_opened() as opened, pytest.raises(PolicyLoadError) as caught:
        load_policy(PolicySpec(str(path), action_kind="continuous"))
    problem = f"external data of tensor 'weight' is at {location!r}, outside the model's folder: refused, not opened"
    assert str(caught.value) == f"{path}: {problem}"
    assert str(path) in opened and not any(Path(name).name == outside.name for name in opened), opened


def test_external_data_that_is_missing_short_or_a_fifo_is_refused(tmp_path: Path) -> None:
    path = save_with_external_data(onnx.load(tiny_graph("Relu", tmp_path / "relu.onnx")), tmp_path / "model" / "policy.onnx")
    data = path.parent / "weights.bin"
    whole = data.read_bytes()
    spec = PolicySpec(str(path), action_kind="continuous")
    data.write_bytes(whole[:-4])
    one_line_refusal(
        spec, f"external data of tensor 'weight' is bytes 0 to {len(whole)} of weights.bin, which holds {len(whole) - 4}"
    )
    data.unlink()
    with pytest.raises(PolicyLoadError, match=f"^{data}: no such file$"):
        load_policy(spec)
    os.mkfifo(data)
    with pytest.raises(PolicyLoadError, match=re.escape(f"{data}: is not a regular file (a FIFO)")):
        load_policy(spec)


def graph_with(path: Path, nodes: list[onnx.NodeProto], functions: tuple[onnx.FunctionProto, ...] = ()) -> Path:
    """obs [batch, 4] -> Identity -> out, with `nodes` beside, in a file of a few hundred bytes."""
    graph = helper.make_graph(
        [*nodes, helper.make_node("Identity", ["obs"], ["out"])],
        "hostile",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, functions=list(functions)), path)
    return path


def constant(name: str, value: object) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value), name), name=name)


BILLIONS = np.array([2, 2, 10**9], np.int64)  # 4e9 float32 zeros: 16 GB

# Bombs of every kind the check reads, each with the node and shape its refusal names.
BOMBS: dict[str, tuple[list[onnx.NodeProto], str]] = {
    "expand-by-a-constant-shape": (
        [
            constant("axes", [1]),
            helper.make_node("ReduceSum", ["obs", "axes"], ["row"], keepdims=1, name="sum"),  # [batch, 1]
            constant("shape", [10**5, 1, 10**5]),
            helper.make_node("Expand", ["row", "shape"], ["big"], name="expand"),  # [100000, batch, 100000]
        ],
        "node 'expand' (Expand) builds a [100000, 1, 100000] tensor (10000000000 elements)",
    ),
    "tile-by-constant-repeats": (
        [
            constant("repeats", [10**5, 10**5]),
            helper.make_node("Tile", ["obs", "repeats"], ["big"], name="tile"),  # [100000 batch, 400000]
        ],
        "node 'tile' (Tile) builds a [100000, 100000] tensor (10000000000 elements)",
    ),
    "range-of-constants": (
        [constant(n, np.float32(v)) for n, v in (("start", 0), ("limit", 4e9), ("delta", 1))]
        + [helper.make_node("Range", ["start", "limit", "delta"], ["big"], name="range")],
        "node 'range' (Range) builds a [4000000000] tensor (4000000000 elements)",
    ),
    "shape-computed-from-constants": (
        [
            constant("two", [2, 2]),
            constant("billion", [10**9]),
            helper.make_node("Concat", ["two", "billion"], ["shape"], axis=0, name="concat"),
            helper.make_node("ConstantOfShape", ["shape"], ["big"], name="bomb"),
        ],
        "node 'bomb' (ConstantOfShape) builds a [2, 2, 1000000000] tensor (4000000000 elements), after 3 built before it",
    ),
    "many-small-ones": (
        [constant("shape", [4000, 4000])]
        + [helper.make_node("ConstantOfShape", ["shape"], [f"zeros{i}"], name=f"zeros{i}") for i in range(10)],
        "node 'zeros4' (ConstantOfShape) builds a [4000, 4000] tensor (16000000 elements), after 64000000 built before it",
    ),
    "in-an-if-branch": (
        [
            constant("always", True),
            helper.make_node(
                "If",
                ["always"],
                ["big"],
                name="if",
                then_branch=helper.make_graph(
                    [constant("shape", BILLIONS), helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="inner")],
                    "then",
                    [],
                    [helper.make_tensor_value_info("zeros", TensorProto.FLOAT, None)],
                ),
                else_branch=helper.make_graph(
                    [constant("nothing", np.float32(0))],
                    "else",
                    [],
                    [helper.make_tensor_value_info("nothing", TensorProto.FLOAT, [])],
                ),
            ),
        ],
        "node 'inner' (ConstantOfShape) builds a [2, 2, 1000000000] tensor (4000000000 elements)",
    ),
    "sparse-constant": (
        [
            helper.make_node(
                "Constant",
                [],
                ["big"],
                name="sparse",
                sparse_value=helper.make_sparse_tensor(
                    numpy_helper.from_array(np.ones(1, np.float32), "values"),
                    numpy_helper.from_array(np.zeros(1, np.int64), "indices"),
                    [10**5, 10**5],
                ),
            )
        ],
        "node 'sparse' (Constant) builds a [100000, 100000] tensor (10000000000 elements)",
    ),
}


@pytest.mark.parametrize("case", list(BOMBS))
def test_graphs_that_build_huge_tensors_from_constants_are_refused_when_read(case: str, tmp_path: Path) -> None:
    """read_model only reads: it returns or refuses, and nothing here could allocate the bomb."""
    nodes, problem = BOMBS[case]
    path = graph_with(tmp_path / f"{case}.onnx", nodes)
    assert path.stat().st_size < 1000
    with pytest.raises(PolicyLoadError) as caught:
        read_model(path)
    bound = path.stat().st_size + BUILD_BUDGET
    limit = f"over the {bound} elements a graph may build from constants ({path.stat().st_size} bytes read + {BUILD_BUDGET})"
    assert str(caught.value) == f"{path}: {problem}: {limit}"


LOAD_UNDER_A_MEMORY_LIMIT = """
import resource, sys
from harness.errors import PolicyLoadError
from harness.policies import PolicySpec, load_policy
# What the process maps once torch is in (0.7 GB for the CPU build, 3.4 to 4.6 GB for PyPI's CUDA
# builds of torch 2.6 and 2.9, which CI also runs), and 4 GB more: the bomb needs 16 GB more.
mapped = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (mapped + (4 << 30), mapped + (4 << 30)))
try:
    load_policy(PolicySpec(sys.argv[1], action_kind="continuous"))
except PolicyLoadError as error:
    print(error)
"""


def test_a_constant_of_shape_bomb_is_refused_by_name_before_anything_allocates(tmp_path: Path) -> None:
    """The issue's bomb: a file of a few hundred bytes whose ConstantOfShape makes 16 GB of zeros,
    wired into the head so that the rebuild and onnxruntime would both build it. Loaded in a
    process that cannot have more than 4 GB, it is refused by name, in seconds."""
    nodes = [
        constant("shape", BILLIONS),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="bomb"),
        helper.make_node("ReduceSum", ["zeros"], ["total"], keepdims=0, name="sum"),
        helper.make_node("Add", ["obs", "total"], ["head"], name="add"),
    ]
    path = graph_with(tmp_path / "bomb.onnx", nodes)
    assert path.stat().st_size < 400
    done = subprocess.run(
        [sys.executable, "-c", LOAD_UNDER_A_MEMORY_LIMIT, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"{path}: node 'bomb' (ConstantOfShape) builds a [2, 2, 1000000000] tensor"), done.stdout
