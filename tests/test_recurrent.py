"""sb3-contrib's RecurrentPPO, loaded from its save and played against its own `predict(obs,
state, episode_start)`: whole episodes step by step (the LSTM state carried per episode, in both
batchings), a batch read as one sequence with episode starts in it (MLP, CNN and dict
observations; `n_lstm_layers`, `shared_lstm`, `enable_critic_lstm`), the state after each step
as an output; an LSTM option the loader does not read is refused by name.

Models are built untrained and tiny by the installed sb3-contrib, their weights redrawn from
N(0, 1) (tests/builders.py) so every gate matters.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime
import pytest
import torch
from sb3_contrib import RecurrentPPO

from harness.devices import cpu_reference
from harness.dtypes import GOLDEN_DTYPE
from harness.errors import PolicyLoadError
from harness.inference.episodes import run_episodes
from harness.inference.forward import run_batch
from harness.outputs import STATE_OUTPUTS
from harness.policies import PolicyNet, cast_policy
from harness.policies.base import EPISODE_START
from harness.policies.export_onnx import export_onnx
from harness.policies.sb3_zip import load_sb3_zip
from harness.workloads import make_batch
from tests.builders import save_sb3
from tests.test_sb3_families import ON, DictEnv, ImageEnv, VectorEnv

DEVICE = cpu_reference()
ATOL = 1e-5  # float32 on the same CPU: SB3's operations, so equal but for rounding
SEEDS = [3, 1, 2]
LSTM = {"lstm_hidden_size": 8, "net_arch": [8]}

AGENTS: dict[str, tuple[str, Any, dict[str, Any]]] = {
    # name: (policy, environment, policy_kwargs)
    "mlp-two-layers": ("MlpLstmPolicy", "CartPole-v1", {**LSTM, "n_lstm_layers": 2}),
    "mlp-shared": ("MlpLstmPolicy", "Pendulum-v1", {**LSTM, "shared_lstm": True, "enable_critic_lstm": False}),
    "mlp-critic-linear": ("MlpLstmPolicy", VectorEnv, {**LSTM, "enable_critic_lstm": False}),
    "cnn": ("CnnLstmPolicy", ImageEnv, {**LSTM, "features_extractor_kwargs": {"features_dim": 8}}),
    "multi-input": ("MultiInputLstmPolicy", DictEnv, {**LSTM, "features_extractor_kwargs": {"cnn_output_dim": 4}}),
}


@functools.cache
def agent(name: str, folder: Path) -> tuple[RecurrentPPO, PolicyNet]:
    policy, env, kwargs = AGENTS[name]
    model = RecurrentPPO(policy, env if isinstance(env, str) else env(), policy_kwargs=dict(kwargs), **ON)
    path = save_sb3(model, folder / f"{name}.zip")
    return model, load_sb3_zip(path)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recurrent")


def sb3_episode(model: RecurrentPPO, env_id: str, seed: int) -> np.ndarray:
    """One deterministic episode as sb3-contrib plays it: predict with the state it returned,
    episode_start True at the first step only."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    state, start, actions = None, np.ones(1, dtype=bool), []
    while True:
        action, state = model.predict(obs[None], state=state, episode_start=start, deterministic=True)
        actions.append(action[0])
        obs, _, terminated, truncated, _ = env.step(action[0])
        start = np.zeros(1, dtype=bool)
        if terminated or truncated:
            return np.asarray(actions)


def test_episodes_match_sb3_predict_step_by_step(folder: Path) -> None:
    """CartPole's episodes, in both batchings. (Pendulum's, continuous with shared_lstm, took 20 s
    more: the sequences below check those step by step, and the forgetful policy plays one.)"""
    model, policy = agent("mlp-two-layers", folder)
    for batching in ("lockstep", "single"):
        episodes = run_episodes(policy, DEVICE, "CartPole-v1", SEEDS, False, batching)
        for episode in episodes:
            theirs = sb3_episode(model, "CartPole-v1", episode.episode_seed)
            assert episode.length == len(theirs), (batching, episode.episode_seed)
            np.testing.assert_array_equal(episode.actions, theirs)


def test_a_policy_that_forgets_its_state_between_steps_plays_other_episodes(folder: Path) -> None:
    """The check above can fail: a policy that starts every step anew (SB3's predict without a
    state) parts from sb3-contrib's episode."""
    model, policy = agent("mlp-shared", folder)
    forgetful = cast_policy(policy, "float32")
    step = forgetful.step

    def anew(obs: tuple[torch.Tensor, ...], state: Any, starts: torch.Tensor) -> Any:
        return step(obs, state, torch.ones_like(starts))

    forgetful.step = anew  # type: ignore[method-assign]
    got = run_episodes(forgetful, DEVICE, "Pendulum-v1", [SEEDS[0]], False, "lockstep")[0]
    assert not np.allclose(got.actions, sb3_episode(model, "Pendulum-v1", SEEDS[0]), atol=ATOL, rtol=0)


def sb3_sequence(model: RecurrentPPO, obs: tuple[np.ndarray, ...], starts: np.ndarray, keys: list[str]) -> list[Any]:
    """sb3-contrib's predict over the rows of a batch, one step each, with its state carried and
    the batch's episode starts: the action and the state after each step."""
    state, got = None, []
    for t in range(len(starts)):
        row: Any = {k: o[t : t + 1] for k, o in zip(keys, obs, strict=True)} if keys else obs[0][t : t + 1]
        action, state = model.predict(row, state=state, episode_start=starts[t : t + 1], deterministic=True)
        got.append((action[0], state[0][:, 0].copy(), state[1][:, 0].copy()))
    return got


@pytest.mark.parametrize("name", list(AGENTS))
def test_a_batch_is_a_sequence_whose_state_matches_sb3_predict(name: str, folder: Path) -> None:
    model, policy = agent(name, folder)
    batch = make_batch(policy.info, "normal", 24, 5)
    starts = batch.step_input(EPISODE_START)
    assert starts is not None and np.flatnonzero(starts).tolist() == [0, 21]  # its last eighth starts anew
    outputs = run_batch(policy, DEVICE, batch.obs, batch.noise)
    n_obs = len(policy.info.inputs)
    keys = [i.name for i in policy.info.inputs] if len(policy.info.inputs) > 1 else []
    # SB3 takes images channels last where the environment gives them so; the harness, as the policy sees them.
    obs = tuple(np.moveaxis(o, 1, -1) if name == "cnn" else o for o in batch.obs[:n_obs])
    theirs = sb3_sequence(model, obs, starts, keys)
    for t, (action, h, c) in enumerate(theirs):
        if policy.info.action_kind == "discrete":
            assert outputs["action"][t] == action, t
        else:
            # predict clips to the Box's bounds, as an episode steps it; the `action` output is the mean itself.
            low, high = model.action_space.low, model.action_space.high
            np.testing.assert_allclose(np.clip(outputs["action"][t], low, high), action, atol=ATOL, rtol=0)
        np.testing.assert_allclose(outputs["state_h"][t], h, atol=ATOL, rtol=0)
        np.testing.assert_allclose(outputs["state_c"][t], c, atol=ATOL, rtol=0)
    assert outputs["state_h"].shape == (24, model.policy.lstm_actor.num_layers, 8)


@pytest.mark.parametrize("size, starts_at", [(1, [0]), (2, [0, 1]), (7, [0, 6]), (8, [0, 7]), (16, [0, 14])])
def test_a_batch_of_few_rows_starts_anew_at_its_last_row_and_a_batch_of_one_once(
    size: int, starts_at: list[int], folder: Path
) -> None:
    """A batch too short for a last eighth (the latency a user measures at batch 1) is still a
    sequence SB3's predict steps: one first step, or a reset at its last row."""
    model, policy = agent("mlp-two-layers", folder)
    batch = make_batch(policy.info, "normal", size, 5)
    starts = batch.step_input(EPISODE_START)
    assert starts is not None and np.flatnonzero(starts).tolist() == starts_at
    outputs = run_batch(policy, DEVICE, batch.obs, batch.noise)
    for t, (action, h, c) in enumerate(sb3_sequence(model, batch.obs[:1], starts, [])):
        assert outputs["action"][t] == action, t
        np.testing.assert_allclose(outputs["state_h"][t], h, atol=ATOL, rtol=0)
        np.testing.assert_allclose(outputs["state_c"][t], c, atol=ATOL, rtol=0)


def test_the_state_is_an_output_in_every_dtype_and_the_golden(folder: Path) -> None:
    _, policy = agent("mlp-two-layers", folder)
    batch = make_batch(policy.info, "uniform", 32, 0)
    golden = run_batch(cast_policy(policy, GOLDEN_DTYPE), DEVICE, batch.obs, batch.noise)
    for dtype in ("float32", "float16", "bfloat16"):
        outputs = run_batch(cast_policy(policy, dtype), DEVICE, batch.obs, batch.noise)
        for name in STATE_OUTPUTS:
            assert outputs[name].dtype == np.float32 and golden[name].dtype == np.float64
            assert np.abs(outputs[name] - golden[name]).max() < {"float32": 1e-5, "float16": 0.05, "bfloat16": 0.3}[dtype]


def test_lstm_options_it_does_not_read_are_refused_by_name(folder: Path) -> None:
    model = RecurrentPPO("MlpLstmPolicy", VectorEnv(), policy_kwargs={**LSTM, "lstm_kwargs": {"dropout": 0.0}}, **ON)
    path = save_sb3(model, folder / "lstm-kwargs.zip")
    with pytest.raises(PolicyLoadError, match=r"policy_kwargs lstm_kwargs=.*dropout.* may change the network"):
        load_sb3_zip(path)


def onnx_sequence(path: Path, obs: tuple[np.ndarray, ...], starts: np.ndarray, names: list[str]) -> list[Any]:
    """The export stepped over the rows of a batch, one at a time, its state fed back: the
    outputs of each step."""
    session = onnxruntime.InferenceSession(str(path))
    layers_hidden = session.get_inputs()[len(names)].shape
    state = [np.zeros((layers_hidden[0], 1, layers_hidden[2]), dtype=np.float32)] * 2
    got = []
    for t in range(len(starts)):
        feed = {name: o[t : t + 1].astype(np.float32) for name, o in zip(names, obs, strict=True)}
        feed |= {"state_h": state[0], "state_c": state[1], "episode_start": starts[t : t + 1].astype(np.float32)}
        out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True))
        state = [out["next_state_h"], out["next_state_c"]]
        got.append(out)
    return got


# Each at another opset: Squeeze and Unsqueeze take their axes as attributes before 13, as inputs from it.
@pytest.mark.parametrize("name, opset", [("mlp-two-layers", 9), ("cnn", 11), ("mlp-shared", 13)])
def test_an_export_steps_with_its_state_as_the_harness_does(name: str, opset: int, folder: Path, tmp_path: Path) -> None:
    """The export's state is explicit (state_h, state_c, episode_start in; next_state_h,
    next_state_c out): stepped over a batch's sequence with its reset in mid-sequence, it gives
    the harness's float32 outputs and state after every step; with the reset left out, it does not."""
    _, policy = agent(name, folder)
    path = tmp_path / f"{name}.onnx"
    export_onnx(policy, path, opset=opset)
    batch = make_batch(policy.info, "normal", 24, 5)
    starts = batch.step_input(EPISODE_START)
    assert starts is not None
    names = [i.name for i in policy.info.inputs]
    obs = batch.obs[: len(names)]
    ours = run_batch(policy, DEVICE, batch.obs, batch.noise)
    head = policy.head_output()
    theirs = onnx_sequence(path, obs, starts, names)
    scale = max(1.0, float(np.abs(ours[head]).max()))
    for t, out in enumerate(theirs):
        np.testing.assert_allclose(out[head][0], ours[head][t], atol=ATOL * scale, rtol=0, err_msg=str(t))
        np.testing.assert_allclose(out["next_state_h"][:, 0], ours["state_h"][t], atol=ATOL, rtol=0, err_msg=str(t))
        np.testing.assert_allclose(out["next_state_c"][:, 0], ours["state_c"][t], atol=ATOL, rtol=0, err_msg=str(t))
        if policy.info.action_kind == "discrete":
            assert out["deterministic_actions"][0] == ours["action"][t], t
    # The reset is read: without it, the state after the restart is another one.
    unreset = onnx_sequence(path, obs, np.eye(1, len(starts), dtype=bool)[0], names)
    restart = int(np.flatnonzero(starts)[1])
    assert not np.allclose(unreset[restart]["next_state_c"][:, 0], ours["state_c"][restart], atol=ATOL, rtol=0)
    # Rows are independent: the whole batch at once, every row starting, is the harness's zero-state forward.
    session = onnxruntime.InferenceSession(str(path))
    layers, _, hidden = session.get_inputs()[len(names)].shape
    zeros = np.zeros((layers, len(starts), hidden), dtype=np.float32)
    feed = {n: o.astype(np.float32) for n, o in zip(names, obs, strict=True)}
    feed |= {"state_h": zeros, "state_c": zeros, "episode_start": np.ones(len(starts), dtype=np.float32)}
    at_once = session.run([head], feed)[0]
    with torch.inference_mode():
        expected = policy.latent_and_head(*(torch.from_numpy(o) for o in obs))[1].numpy()
    np.testing.assert_allclose(at_once, expected, atol=ATOL * scale, rtol=0)


def test_a_state_off_by_more_than_the_dtypes_error_fails_the_port_rule(folder: Path) -> None:
    """The state is judged as any output: a card whose cell state drifts 0.1% fails cpu_reference
    on it (gating), and the step windows report where."""
    from harness.judge.golden import RatioLimits
    from harness.judge.kinds import CheckKind
    from harness.judge.verdicts import Rules, judge_batch, tolerance_of

    _, policy = agent("mlp-two-layers", folder)
    batch = make_batch(policy.info, "uniform", 48, 0)
    golden = run_batch(cast_policy(policy, GOLDEN_DTYPE), DEVICE, batch.obs, batch.noise)
    honest = run_batch(policy, DEVICE, batch.obs, batch.noise)
    drifted = {**honest, "state_c": honest["state_c"] * np.float32(1.001)}
    rules = Rules("float32", RatioLimits(), *tolerance_of("float32", {}), frozenset())
    starts = batch.step_input(EPISODE_START)
    checks = judge_batch(rules, batch.noise, {"card0": honest, "card1": drifted}, golden, honest, honest, None, starts)
    port = {(c.device_a, c.output): c for c in checks if c.kind is CheckKind.CPU_REFERENCE}
    assert port["card0", "state_c"].passed and not port["card1", "state_c"].passed and port["card1", "state_c"].gating
    assert port["card1", "state_h"].passed and not port["card1", "state_c@11-100"].gating


def test_the_layer_search_names_the_lstm_where_it_parts(folder: Path) -> None:
    """A card whose LSTM computes otherwise parts first at `memory`: the capture takes a batch's
    arrays as the cards get them (episode starts after the observations) and the LSTM's output."""
    from harness.inference.capture import capture_activations
    from harness.judge.localize import first_divergent_layer

    _, policy = agent("mlp-two-layers", folder)
    batch = make_batch(policy.info, "normal", 16, 0)
    obs = tuple(torch.from_numpy(o) for o in batch.obs)
    card = cast_policy(policy, "float32")
    assert card.memory is not None
    with torch.no_grad():
        card.memory.weight_ih_l0[0, 0] += 1e-3
    div = first_divergent_layer(capture_activations(card, obs), capture_activations(policy, obs))
    assert div is not None and div.layer == "memory", div
