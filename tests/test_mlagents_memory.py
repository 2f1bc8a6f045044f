"""ML-Agents exports with a memory (`recurrent_in` / `recurrent_out`, an LSTM's [h | c]), built
node by node in ML-Agents' layout (tests/builders.py) and read as a recurrent policy.

A batch is one sequence with a reset in mid-sequence: the policy stepped over it gives, step by
step, what onnxruntime gives stepping the file with its memory fed back (the loader check's
reference, and a plain session here); a policy that forgets its state, reads the gates in ONNX's
order or holds one LSTM weight off fails the loader check; the same weights in a `.pt` checkpoint
read the same; what the reader does not recognise in the memory's layout is refused by name; and
`harness export-onnx` writes the discrete one with its state explicit and refuses the continuous
one (ML-Agents' recurrent layout) by name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import helper, numpy_helper

from harness.devices import cpu_reference
from harness.dtypes import GOLDEN_DTYPE
from harness.errors import PolicyLoadError
from harness.inference.forward import run_batch
from harness.judge.golden import RatioLimits
from harness.judge.verdicts import Rules, judge_onnx, tolerance_of
from harness.outputs import Outputs
from harness.policies import PolicyNet, cast_policy, load_policy
from harness.policies.base import ACTION_MASK, EPISODE_START, Memory
from harness.policies.export_onnx import export_onnx
from harness.policies.mlagents import BODY, HEAD
from harness.policies.mlagents_pt import load_mlagents_pt
from harness.policies.onnx_any import onnx_reference
from harness.workloads import ObsBatch, make_batch
from tests.builders import mlagents_layout_export

DEVICE = cpu_reference()
ATOL = 1e-5  # float32 on the same CPU: the same operations, equal but for rounding
MEMORY_SIZE = 16  # an LSTM of 8 units over the builder's 16-wide Swish layer
VARIANTS: dict[str, dict[str, Any]] = {
    "continuous": {},
    "one-branch": {"branches": (5,)},
    "two-branches": {"branches": (3, 2)},
}
# ONNX stacks an LSTM's gates as (input, output, forget, cell), torch as (input, forget, cell, output).
TORCH_FROM_ONNX = [0, 2, 3, 1]


@pytest.fixture(scope="module", params=list(VARIANTS))
def export(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PolicyNet]:
    folder = tmp_path_factory.mktemp("memory")
    path = mlagents_layout_export(folder / f"{request.param}.onnx", memory_size=MEMORY_SIZE, **VARIANTS[request.param])
    return path, load_policy(str(path))


def sequence(policy: PolicyNet) -> ObsBatch:
    """32 steps, episodes starting at the first and at the 29th: the harness's own sequence batch."""
    batch = make_batch(policy.info, "normal", 32, 0)
    assert np.flatnonzero(batch.step_input(EPISODE_START)).tolist() == [0, 28]  # type: ignore[arg-type]
    return batch


def session_steps(path: Path, batch: ObsBatch, starts: np.ndarray) -> list[dict[str, np.ndarray]]:
    """The file stepped by a plain onnxruntime session over the batch's rows: `recurrent_in` the
    `recurrent_out` of the step before, zeros where `starts` says an episode starts."""
    session = onnxruntime.InferenceSession(str(path))
    masks = batch.step_input(ACTION_MASK)
    memory, got = np.zeros((1, 1, MEMORY_SIZE), np.float32), []
    for t in range(len(starts)):
        feed = {"obs_0": batch.obs[0][t : t + 1], "recurrent_in": np.zeros_like(memory) if starts[t] else memory}
        if masks is not None:
            feed["action_masks"] = masks[t : t + 1].astype(np.float32)
        out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True))
        memory = out["recurrent_out"]
        got.append(out)
    return got


def test_a_memory_export_steps_as_onnxruntime_steps_the_file(export: tuple[Path, PolicyNet]) -> None:
    """The reader's float32 policy over a 32-step sequence with a reset at step 29: its action and
    its state (h, c) after every step are onnxruntime's on the file (the loader check's reference
    and a plain session stepping the file alike), within 1e-5; the reset is read (without it, the
    state after it is another one)."""
    path, policy = export
    info = policy.info
    assert info.memory == Memory(1, MEMORY_SIZE // 2) and info.step_inputs[0] == EPISODE_START
    assert "1 x 16 SiLU, LSTM 1 x 8 (memory_size 16)" in info.detail, info.detail
    batch = sequence(policy)
    starts = batch.step_input(EPISODE_START)
    assert starts is not None
    ours = run_batch(policy, DEVICE, batch.obs, batch.noise)
    reference = onnx_reference(info, 1).run(batch.obs)
    assert set(reference) == {"action", "state_h", "state_c"} | ({"logits"} if info.masked else set())
    for name, value in reference.items():
        assert value.shape == ours[name].shape, name
        np.testing.assert_allclose(value, ours[name], atol=ATOL, rtol=0, err_msg=name)
    steps = session_steps(path, batch, starts)
    action = "deterministic_discrete_actions" if info.masked else "deterministic_continuous_actions"
    for t, out in enumerate(steps):
        memory = out["recurrent_out"][0, 0]
        np.testing.assert_allclose(memory, np.concatenate([ours["state_h"][t, 0], ours["state_c"][t, 0]]), atol=ATOL, rtol=0)
        np.testing.assert_allclose(out[action].reshape(ours["action"][t].shape), ours["action"][t], atol=ATOL, rtol=0)
    assert np.abs(ours["state_c"]).max() > 0.1  # a state that matters, not one near zero
    unreset = session_steps(path, batch, np.eye(1, len(starts), dtype=bool)[0])
    assert not np.allclose(unreset[28]["recurrent_out"][0, 0, 8:], ours["state_c"][28, 0], atol=ATOL, rtol=0)


def loader_check(policy: PolicyNet, batch: ObsBatch, fault: Callable[[PolicyNet], None] | None = None) -> dict[str, bool]:
    """The loader check (onnx_reference) on one batch: onnxruntime against the golden, relative to
    the rebuild's float32 error; passed per output. `fault` is done to the rebuild in both dtypes,
    as a misread would be."""
    rebuilt = {dtype: cast_policy(policy, dtype) for dtype in ("float32", GOLDEN_DTYPE)}
    for copy in rebuilt.values():
        if fault is not None:
            fault(copy)
    ours, golden = (run_batch(p, DEVICE, batch.obs, batch.noise) for p in rebuilt.values())
    theirs = onnx_reference(policy.info, 1).run(batch.obs)
    rules = Rules("float32", RatioLimits(), *tolerance_of("float32", {}), frozenset())
    return {c.output: c.passed for c in judge_onnx(rules, theirs, ours, golden)}


def forgetful(policy: PolicyNet) -> None:
    """Starts every step anew: the memory is never carried."""
    step = policy.step

    def anew(obs: tuple[torch.Tensor, ...], state: Any, starts: torch.Tensor) -> Any:
        return step(obs, state, torch.ones_like(starts))

    policy.step = anew  # type: ignore[method-assign]


def onnx_gate_order(policy: PolicyNet) -> None:
    """The LSTM's gates left in ONNX's order (i, o, f, c) where torch reads (i, f, g, o)."""
    assert policy.memory is not None
    back = np.argsort(TORCH_FROM_ONNX).tolist()
    with torch.no_grad():
        for param in policy.memory.parameters():
            param.copy_(param.reshape(4, 8, -1)[back].reshape(param.shape))


def one_weight_off(policy: PolicyNet) -> None:
    assert policy.memory is not None
    with torch.no_grad():
        policy.memory.weight_hh_l0[3, 2] += 0.05


def test_the_loader_check_fails_a_policy_that_forgets_or_misreads_its_memory(export: tuple[Path, PolicyNet]) -> None:
    """The honest rebuild passes the loader check on every output, state included; one that
    forgets its state, reads the gates in ONNX's order or holds one recurrent weight off by 0.05
    fails it on the state (and the continuous action)."""
    _, policy = export
    batch = sequence(policy)
    assert all(loader_check(policy, batch).values())
    for fault in (forgetful, onnx_gate_order, one_weight_off):
        passed = loader_check(policy, batch, fault)
        assert not passed["state_h"] and not passed["state_c"], (fault.__name__, passed)
        if not policy.info.masked:
            assert not passed["action"], (fault.__name__, passed)


def edit(path: Path, out: Path, change: Any) -> Path:
    model = onnx.load(path)
    change(model.graph)
    onnx.save(model, out)
    return out


def _node(graph: onnx.GraphProto, name: str) -> onnx.NodeProto:
    return next(node for node in graph.node if node.name == name)


def _set_initializer(graph: onnx.GraphProto, name: str, value: np.ndarray) -> None:
    index = next(i for i, tensor in enumerate(graph.initializer) if tensor.name == name)
    graph.initializer[index].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))


LAYOUT_FAULTS: dict[str, tuple[Any, str]] = {
    "memory-size": (
        lambda g: _set_initializer(g, "memory", np.array([12.0])),
        "memory_size is [12.0], expected [16] for an LSTM of 8 units",
    ),
    "halves-swapped": (
        lambda g: _node(g, "c0").input.__setitem__(1, "h.start"),
        "the LSTM's c0 'c0' is not recurrent_in's [8, 16) on axis 2",
    ),
    "reverse": (
        lambda g: _node(g, "lstm").attribute.append(helper.make_attribute("direction", "reverse")),
        "is not one plain forward layer",
    ),
    "recurrence-shape": (
        lambda g: _set_initializer(g, "lstm.R", np.zeros((1, 32, 4))),
        "the LSTM's R is [1, 32, 4], expected [1, 32, 8] for hidden_size 8",
    ),
    "no-memory-size": (
        lambda g: _set_initializer(g, "memory", np.array([0.0])),
        "a memory is read with its recurrent_in and a memory_size, not one without the other",
    ),
}


@pytest.mark.parametrize("fault", list(LAYOUT_FAULTS))
def test_a_memory_layout_it_does_not_recognise_is_refused_by_name(fault: str, tmp_path: Path) -> None:
    change, problem = LAYOUT_FAULTS[fault]
    path = edit(mlagents_layout_export(tmp_path / "memory.onnx", memory_size=MEMORY_SIZE), tmp_path / f"{fault}.onnx", change)
    with pytest.raises(PolicyLoadError) as error:
        load_policy(str(path))
    message = str(error.value)
    assert message.startswith(f"{path}: not an ML-Agents export this reader reads: ") and "\n" not in message, message
    assert problem in message, message


def checkpoint_of(path: Path, extra: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The continuous export's weights as ML-Agents' SimpleActor state dict holds them: its LSTM
    `network_body.lstm.lstm` a torch LSTM (gates in torch's order, ih and hh biases apart)."""
    weights = {tensor.name: numpy_helper.to_array(tensor).astype(np.float32) for tensor in onnx.load(path).graph.initializer}

    def torch_rows(rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(rows.reshape(4, 8, -1)[TORCH_FROM_ONNX].reshape(32, -1).copy()).squeeze(-1)

    state = {name: torch.from_numpy(weights[name]) for name in (f"{BODY}.0.weight", f"{BODY}.0.bias")}
    state |= {f"{HEAD}.mu.{part}": torch.from_numpy(weights[f"{HEAD}.mu.{part}"]) for part in ("weight", "bias")}
    state |= {
        "network_body.lstm.lstm.weight_ih_l0": torch_rows(weights["lstm.W"][0]),
        "network_body.lstm.lstm.weight_hh_l0": torch_rows(weights["lstm.R"][0]),
        "network_body.lstm.lstm.bias_ih_l0": torch_rows(weights["lstm.B"][0, :32]),
        "network_body.lstm.lstm.bias_hh_l0": torch_rows(weights["lstm.B"][0, 32:]),
        f"{HEAD}.log_sigma": torch.zeros(1, 2),
        "memory_size_vector": torch.tensor([float(MEMORY_SIZE)]),
    }
    return state | (extra or {})


def test_a_checkpoint_with_a_memory_reads_as_its_export_steps(tmp_path: Path) -> None:
    """The continuous export's weights saved as an ML-Agents `.pt` (its LSTM under
    `network_body.lstm.lstm`): the checkpoint's policy, stepped over the sequence, is onnxruntime
    on the export; an LSTM key it does not read, or a memory_size_vector that does not fit, is
    refused by name."""
    path = mlagents_layout_export(tmp_path / "memory.onnx", memory_size=MEMORY_SIZE)
    exported = load_policy(str(path))
    checkpoint = tmp_path / "memory.pt"
    torch.save({"Policy": checkpoint_of(path)}, checkpoint)
    policy = load_mlagents_pt(checkpoint)
    assert policy.info.memory == Memory(1, 8) and "LSTM 1 x 8 (memory_size 16)" in policy.info.detail
    batch = sequence(policy)
    ours: Outputs = run_batch(policy, DEVICE, batch.obs, batch.noise)
    theirs = onnx_reference(exported.info, 1).run(batch.obs)
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, atol=ATOL, rtol=0, err_msg=name)
    for extra, problem in (
        ({"network_body.lstm.lstm.weight_ih_l1": torch.zeros(32, 8)}, "one LSTM layer (network_body.lstm.lstm.weight_ih_l0"),
        ({"memory_size_vector": torch.tensor([32.0])}, "memory_size_vector is 32, but the LSTM has 8 units"),
    ):
        torch.save({"Policy": checkpoint_of(path, extra)}, checkpoint)
        with pytest.raises(PolicyLoadError, match=r"^[^\n]*$") as error:
            load_mlagents_pt(checkpoint)
        assert problem in str(error.value), str(error.value)


@pytest.mark.parametrize("branches", [(), (5,), (3, 2)], ids=["continuous", "one-branch", "two-branches"])
def test_export_onnx_writes_the_memory_with_its_state_explicit(branches: tuple[int, ...], tmp_path: Path) -> None:
    """The memory export, continuous or with one branch or two, written again by `export_onnx` in
    the harness's recurrent layout (state_h, state_c, episode_start and any action_mask in;
    next_state_h, next_state_c out): stepped by onnxruntime with its state fed back it gives the
    harness's head (masked logits or mu), actions and state after every step."""
    path = mlagents_layout_export(tmp_path / "memory.onnx", memory_size=MEMORY_SIZE, branches=branches)
    policy = load_policy(str(path))
    out = tmp_path / "again.onnx"
    export_onnx(policy, out)
    batch = sequence(policy)
    starts, masks = batch.step_input(EPISODE_START), batch.step_input(ACTION_MASK)
    assert starts is not None and (masks is not None) == bool(branches)
    ours = run_batch(policy, DEVICE, batch.obs, batch.noise)
    head = policy.head_output()
    session = onnxruntime.InferenceSession(str(out))
    state = [np.zeros((1, 1, 8), np.float32)] * 2
    for t in range(len(starts)):
        feed = {"obs_0": batch.obs[0][t : t + 1], "state_h": state[0], "state_c": state[1]}
        feed["episode_start"] = starts[t : t + 1].astype(np.float32)
        if masks is not None:
            feed["action_mask"] = masks[t : t + 1]
        scores, action, h, c = session.run([head, "deterministic_actions", "next_state_h", "next_state_c"], feed)
        np.testing.assert_allclose(scores[0], ours[head][t], atol=ATOL, rtol=0, err_msg=str(t))
        np.testing.assert_allclose(h[:, 0], ours["state_h"][t], atol=ATOL, rtol=0, err_msg=str(t))
        np.testing.assert_allclose(c[:, 0], ours["state_c"][t], atol=ATOL, rtol=0, err_msg=str(t))
        np.testing.assert_allclose(action[0], ours["action"][t], atol=ATOL, rtol=0, err_msg=str(t))
        state = [h, c]
