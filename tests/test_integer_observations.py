"""Observations of integers, which SB3 takes and encodes in its `preprocess_obs`: Discrete (one-hot),
MultiDiscrete (one-hot per axis), MultiBinary (as floats), alone and inside a Dict. Loaded from
the save, fed batches of values of the space, and checked against SB3's own networks (its
distribution's logits, DQN's Q-values, `predict`); exported to ONNX, encoding in the graph; played
in closed loop (FrozenLake against SB3's `evaluate_policy`, sb3-contrib's InvalidActionEnvDiscrete with
its masks against MaskablePPO's `predict`); the spaces SB3 encodes otherwise, refused by name.

Models are built untrained by the installed SB3 and sb3-contrib, their weights redrawn from N(0, 1)
(tests/builders.py) so that every one-hot column matters.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime
import pytest
import torch
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from scipy.special import log_softmax
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from harness.devices import cpu_reference
from harness.envs.registry import check_env
from harness.envs.spec import INVALID_ACTIONS_ID
from harness.errors import PolicyLoadError, UsageError
from harness.inference.episodes import run_episodes
from harness.inference.forward import run_batch
from harness.policies import PolicyNet, cast_policy
from harness.policies.export_onnx import export_onnx
from harness.policies.sb3_zip import load_sb3_zip
from harness.workloads import DISTRIBUTIONS, make_batch
from tests.builders import edit_data, save_sb3, to_sb3_1x
from tests.test_sb3_families import OFF, ON

DEVICE = cpu_reference()
ROWS = 32
ATOL = 1e-5  # float32 on the same CPU: SB3's operations, so equal but for rounding
SEEDS = [3, 1, 2]
FROZEN_LAKE = "FrozenLake-v1"

SPACES: dict[str, spaces.Space[Any]] = {
    "discrete": spaces.Discrete(5),
    "multi-discrete": spaces.MultiDiscrete([3, 4]),
    "multi-binary": spaces.MultiBinary([2, 3]),
    "dict": spaces.Dict(
        {
            "cell": spaces.Discrete(4),
            "speed": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "doors": spaces.MultiDiscrete([2, 3]),
            "lights": spaces.MultiBinary(3),
        }
    ),
}


class SpaceEnv(gym.Env[Any, Any]):
    """Observations of `space`, three discrete actions: what the networks are built for."""

    def __init__(self, space: spaces.Space[Any]) -> None:
        self.observation_space, self.action_space = space, spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("integer-observations")


@functools.cache
def agent(algo: str, name: str, folder: Path) -> tuple[BaseAlgorithm, PolicyNet]:
    space = SPACES[name]
    policy = "MultiInputPolicy" if isinstance(space, spaces.Dict) else "MlpPolicy"
    small = {"net_arch": [16]}
    model: BaseAlgorithm
    if algo == "ppo":
        model = PPO(policy, SpaceEnv(space), policy_kwargs=small, **ON)
    else:
        model = DQN(policy, SpaceEnv(space), policy_kwargs=small, **OFF)
    path = save_sb3(model, folder / f"{algo}-{name}.zip")
    return model, load_sb3_zip(path)


def as_sb3(space: spaces.Space[Any], obs: tuple[np.ndarray, ...]) -> Any:
    """A batch's arrays as SB3 takes the space's observations: a Discrete's values (rows,), a
    MultiBinary's in its shape, a Dict's by key."""
    if isinstance(space, spaces.Dict):
        return {key: as_sb3(part, (o,)) for (key, part), o in zip(space.spaces.items(), obs, strict=True)}
    return obs[0].reshape(len(obs[0]), *space.shape)


def in_space(space: spaces.Space[Any], obs: tuple[np.ndarray, ...]) -> bool:
    """Every row a value of the space (a Dict's Box keys aside: batches go beyond a Box's bounds on purpose)."""
    if isinstance(space, spaces.Dict):
        parts = [(p, (o,)) for p, o in zip(space.spaces.values(), obs, strict=True) if not isinstance(p, spaces.Box)]
        return all(in_space(p, o) for p, o in parts)
    return all(space.contains(row.astype(space.dtype)) for row in as_sb3(space, obs))


@pytest.mark.parametrize("name", list(SPACES))
def test_batches_hold_values_of_the_space_as_int64_bytes(name: str, folder: Path) -> None:
    _, policy = agent("ppo", name, folder)
    integers = [i for i in policy.info.inputs if i.dtype == "int64"]
    assert integers and all(len(i.shape) == 1 for i in integers)
    for distribution in DISTRIBUTIONS:
        batch = make_batch(policy.info, distribution, ROWS, 7)
        assert in_space(SPACES[name], batch.obs[: len(policy.info.inputs)]), distribution
        assert batch.sha256 == make_batch(policy.info, distribution, ROWS, 7).sha256
        assert batch.sha256 != make_batch(policy.info, distribution, ROWS, 8).sha256
    edge = make_batch(policy.info, "edge", ROWS, 7)
    for inp, values in zip(policy.info.inputs, edge.obs, strict=False):
        if inp.dtype == "int64":  # both bounds of every value
            assert values.dtype == np.int64
            np.testing.assert_array_equal(values.min(axis=0), 0)
            np.testing.assert_array_equal(values.max(axis=0), np.asarray(inp.classes or [2] * inp.size) - 1)
    assert not in_space(spaces.Discrete(5), (np.array([[5]]),))  # the check can fail: a value past the classes


def test_a_space_larger_than_its_weights_is_refused_before_anything_is_made(folder: Path, tmp_path: Path) -> None:
    """A MultiBinary's size comes from the file: one of 10^10 values is refused by the weights
    it does not fit, before any array of its size exists."""
    agent("ppo", "multi-binary", folder)

    def huge(data: dict[str, Any]) -> None:
        data["observation_space"]["_shape"] = [100_000, 100_000]

    with pytest.raises(PolicyLoadError, match=r"policy.pth .* expects \(16, 10000000000\)"):
        load_sb3_zip(edit_data(folder / "ppo-multi-binary.zip", tmp_path / "huge.zip", huge))


def sb3_logits(model: BaseAlgorithm, obs: Any) -> np.ndarray:
    """SB3's scores for the observations, through its own preprocess_obs and networks: PPO's
    log-probabilities, DQN's Q-values."""
    tensor, _ = model.policy.obs_to_tensor(obs)
    with torch.no_grad():
        if isinstance(model, DQN):
            return model.q_net(tensor).numpy()
        return model.policy.get_distribution(tensor).distribution.logits.numpy()


@pytest.mark.parametrize("algo, name", [*(("ppo", name) for name in SPACES), ("dqn", "discrete"), ("dqn", "dict")])
def test_scores_and_actions_match_sb3(algo: str, name: str, folder: Path) -> None:
    model, policy = agent(algo, name, folder)
    for distribution in DISTRIBUTIONS:
        batch = make_batch(policy.info, distribution, ROWS, 0)
        outputs = run_batch(policy, DEVICE, batch.obs, batch.noise)
        obs = as_sb3(SPACES[name], batch.obs)
        theirs = sb3_logits(model, obs)
        ours = outputs["q_values"] if algo == "dqn" else log_softmax(outputs["logits"], axis=1)
        np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)
        np.testing.assert_array_equal(outputs["action"], model.predict(obs, deterministic=True)[0])


def test_an_sb3_1x_save_of_a_gym_discrete_observation_reads_the_same(folder: Path, tmp_path: Path) -> None:
    """SB3 1.x wrote gym's Discrete with `n` a number and `shape`, not `_shape`."""
    _, policy = agent("ppo", "discrete", folder)
    old = load_sb3_zip(to_sb3_1x(folder / "ppo-discrete.zip", tmp_path / "1x.zip"))
    assert old.info.inputs == policy.info.inputs
    batch = make_batch(policy.info, "uniform", ROWS, 3)
    np.testing.assert_array_equal(
        run_batch(old, DEVICE, batch.obs, batch.noise)["logits"], run_batch(policy, DEVICE, batch.obs, batch.noise)["logits"]
    )


def test_a_one_hot_of_other_classes_gives_other_scores(folder: Path) -> None:
    """The comparison above can fail: the same weights fed a MultiDiscrete's one-hot as if its
    axes had each other's classes (3 and 4 swapped) part from SB3's scores."""
    model, policy = agent("ppo", "multi-discrete", folder)
    (inp,) = policy.info.inputs
    swapped = copy.deepcopy(policy)
    swapped.info = replace(policy.info, inputs=(replace(inp, classes=(4, 3)),))
    batch = make_batch(policy.info, "uniform", ROWS, 0)
    mine = log_softmax(run_batch(swapped, DEVICE, batch.obs, batch.noise)["logits"], axis=1)
    assert not np.allclose(mine, sb3_logits(model, as_sb3(SPACES["multi-discrete"], batch.obs)), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", list(SPACES))
def test_the_export_takes_the_values_and_encodes_them_in_the_graph(name: str, folder: Path, tmp_path: Path) -> None:
    _, policy = agent("ppo", name, folder)
    out = tmp_path / f"{name}.onnx"
    export_onnx(policy, out)
    session = onnxruntime.InferenceSession(str(out))
    declared = {i.name: i.type for i in session.get_inputs()}
    assert all(declared[i.name] == ("tensor(int64)" if i.dtype == "int64" else "tensor(float)") for i in policy.info.inputs)
    batch = make_batch(policy.info, "uniform", ROWS, 1)
    logits, actions = session.run(["logits", "deterministic_actions"], dict(zip(declared, batch.obs, strict=True)))
    outputs = run_batch(policy, DEVICE, batch.obs, batch.noise)
    np.testing.assert_allclose(logits, outputs["logits"], atol=ATOL, rtol=0)
    np.testing.assert_array_equal(actions, outputs["action"])


def test_the_golden_and_card_dtypes_encode_the_same_values(folder: Path) -> None:
    _, policy = agent("ppo", "dict", folder)
    batch = make_batch(policy.info, "uniform", ROWS, 2)
    float32 = run_batch(policy, DEVICE, batch.obs, batch.noise)["logits"]
    for dtype, atol in (("float64", 1e-5), ("bfloat16", 1.0)):
        got = run_batch(cast_policy(policy, dtype), DEVICE, batch.obs, batch.noise)["logits"]
        assert np.abs(got - float32).max() < atol, dtype


def test_spaces_sb3_encodes_from_another_start_are_refused_by_name(folder: Path, tmp_path: Path) -> None:
    """SB3's preprocess_obs one-hot encodes value v as class v: a space that starts elsewhere is
    one it cannot encode either (its one_hot raises past n)."""
    src = folder / "ppo-discrete.zip"
    agent("ppo", "discrete", folder)

    def start(data: dict[str, Any]) -> None:
        data["observation_space"]["start"] = "2"

    with pytest.raises(PolicyLoadError, match=r"Discrete\(5, start=2\) is not read \(SB3's preprocess_obs one-hot"):
        load_sb3_zip(edit_data(src, tmp_path / "start.zip", start))
    agent("ppo", "dict", folder)

    def key_start(data: dict[str, Any]) -> None:
        data["observation_space"]["spaces"] = data["observation_space"]["spaces"].replace(
            "Discrete(4)", "Discrete(4, start=1)"
        )

    with pytest.raises(PolicyLoadError, match=r"key 'cell' Discrete\(4, start=1\) is not read"):
        load_sb3_zip(edit_data(folder / "ppo-dict.zip", tmp_path / "key-start.zip", key_start))


def test_an_environment_of_other_classes_does_not_fit(folder: Path) -> None:
    """FrozenLake's 16 cells are one int64 value, as Taxi's 500 states are: the classes tell them apart."""
    _, policy = agent("ppo", "discrete", folder)
    with pytest.raises(
        UsageError, match=r"obs \(1,\) int64 of classes \[16\], the policy takes obs \(1,\) int64 of classes \[5\]"
    ):
        check_env("FrozenLake-v1", policy.info)


def sb3_evaluate(model: BaseAlgorithm, env_id: str, seed: int) -> tuple[float, int]:
    """One deterministic episode by SB3's evaluate_policy, its VecEnv reset with `seed`."""
    returns, lengths = evaluate_policy(
        model, make_vec_env(env_id, n_envs=1, seed=seed), n_eval_episodes=1, deterministic=True, return_episode_rewards=True
    )
    return float(returns[0]), int(lengths[0])


def test_frozen_lake_episodes_match_sb3_evaluate(folder: Path) -> None:
    """FrozenLake's 16 cells one-hot, its ice slippery (each move drawn from the episode's seed):
    each episode's return and length as SB3's evaluate_policy gives them, in both batchings."""
    model = PPO("MlpPolicy", FROZEN_LAKE, policy_kwargs={"net_arch": [16]}, **ON)
    policy = load_sb3_zip(save_sb3(model, folder / "frozen-lake.zip"))
    assert policy.info.inputs[0].classes == (16,)
    theirs = [sb3_evaluate(model, FROZEN_LAKE, seed) for seed in SEEDS]
    assert len(set(theirs)) > 1  # the seeds play apart: the comparison says something
    for batching in ("lockstep", "single"):
        episodes = run_episodes(policy, DEVICE, FROZEN_LAKE, SEEDS, False, batching)
        assert [(e.episode_return, e.length) for e in episodes] == theirs, batching


def maskable_episode(model: MaskablePPO, env: gym.Env[Any, Any], seed: int) -> np.ndarray:
    """One deterministic episode as MaskablePPO plays it: predict with the environment's masks."""
    obs, _ = env.reset(seed=seed)
    actions = []
    while True:
        action, _ = model.predict(obs, action_masks=env.unwrapped.action_masks(), deterministic=True)  # type: ignore[attr-defined]
        actions.append(int(action))
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return np.asarray(actions)


def test_maskable_ppo_plays_invalid_action_env_discrete_as_its_predict(folder: Path) -> None:
    """sb3-contrib's environment of MaskablePPO's examples (Discrete(80) observations, 60 of 80
    actions masked at each step), registered by the harness: every episode as MaskablePPO's
    predict plays it with the masks, no masked action taken."""
    model = MaskablePPO(
        "MlpPolicy", InvalidActionEnvDiscrete(dim=80, n_invalid_actions=60), policy_kwargs={"net_arch": [16]}, **ON
    )
    policy = load_sb3_zip(save_sb3(model, folder / "maskable.zip"))
    assert policy.info.masked and policy.info.inputs[0].classes == (80,)
    for batching in ("lockstep", "single"):
        episodes = run_episodes(policy, DEVICE, INVALID_ACTIONS_ID, SEEDS, False, batching)
        for episode in episodes:
            theirs = maskable_episode(model, gym.make(INVALID_ACTIONS_ID), episode.episode_seed)
            np.testing.assert_array_equal(episode.actions, theirs)
            assert episode.illegal == 0 and episode.length == 100


def test_the_registered_environment_plays_a_seed_the_same_every_time() -> None:
    """Why it is registered as the harness's: sb3-contrib's own class draws from generators its
    seed never reaches, so two plays of one seed part (a card's episode could not be set beside
    the CPU's); the harness's draws the same states and masks for the seed."""

    def states(env: gym.Env[Any, Any]) -> list[tuple[int, tuple[bool, ...]]]:
        obs, _ = env.reset(seed=5)
        got = []
        for _ in range(20):
            got.append((int(obs), tuple(env.unwrapped.action_masks())))  # type: ignore[attr-defined]
            obs, *_ = env.step(0)
        return got

    assert states(gym.make(INVALID_ACTIONS_ID)) == states(gym.make(INVALID_ACTIONS_ID))
    theirs = InvalidActionEnvDiscrete(dim=80, n_invalid_actions=60)
    assert states(theirs) != states(theirs)
