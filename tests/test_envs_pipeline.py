"""The lockstep environments give the policy exactly what SB3's own VecEnv pipeline gives it, bit
for bit: an Atari game made as the RL Zoo makes it (AtariWrapper, 4 frames stacked, channels
first), through its lost lives to the end of the game, and a Dict observation of an image and a
vector. SB3 resets an ended episode into the next; here it keeps its slot, untouched."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.atari_wrappers import AtariWrapper
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecEnv, VecFrameStack, VecTransposeImage

from harness.envs.lockstep import GymEnvs
from harness.envs.registry import env_spaces
from harness.envs.spec import EnvSpec, require_registered
from harness.policies.policy_files import EnvSetup, Wrapper

ATARI_ID = "BreakoutNoFrameskip-v4"
ATARI = EnvSpec(ATARI_ID, EnvSetup(wrappers=(Wrapper("stable_baselines3.common.atari_wrappers.AtariWrapper"),), frame_stack=4))
DICT_ID = "harness-test/DictImage-v0"


class DictImage(gym.Env[dict[str, np.ndarray], int]):
    """A small image and a vector, both moved by the action; ends when the vector leaves [-1, 1]."""

    observation_space = spaces.Dict(
        {"vector": spaces.Box(-1.0, 1.0, (3,), np.float32), "image": spaces.Box(0, 255, (8, 8, 3), np.uint8)}
    )
    action_space = spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict]:
        super().reset(seed=seed)
        self.state = self.np_random.uniform(-0.5, 0.5, size=3).astype(np.float32)
        self.image = self.np_random.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        self.state = (self.state + np.float32(0.1) * (action - 1) + self.np_random.normal(0, 0.05, 3)).astype(np.float32)
        self.image = np.roll(self.image, action + 1, axis=1)
        return self._obs(), float(self.state.sum()), bool(np.abs(self.state).max() > 1), False, {}

    def _obs(self) -> dict[str, np.ndarray]:
        return {"vector": self.state.copy(), "image": self.image.copy()}


gym.register(DICT_ID, entry_point=DictImage, max_episode_steps=40)


def sb3_pipeline(env_id: str, seed: int, frame_stack: int, wrapper: Any = None) -> VecEnv:
    """What the RL Zoo's create_test_env and SB3's model make of an environment: make_vec_env
    (Monitor, then the wrapper), VecFrameStack, and VecTransposeImage as SB3 adds it."""
    venv = VecFrameStack(make_vec_env(env_id, n_envs=1, seed=seed, wrapper_class=wrapper), frame_stack)
    return VecTransposeImage(venv)


def play_both(spec: EnvSpec, seeds: list[int], wrapper: Any, n_actions: int, max_steps: int) -> dict[str, Any]:
    """Random actions, the same in both, until every game here has ended: every observation the
    policy would get compared bit for bit while its episode runs, and every ended row checked
    untouched. Returns what was seen along the way."""
    ours = GymEnvs(spec, len(seeds))
    obs = ours.reset(seeds)
    theirs = [sb3_pipeline(spec.env_id, seed, spec.setup.frame_stack, wrapper) for seed in seeds]
    their_obs = [venv.reset() for venv in theirs]
    keys = [v.name for v in env_spaces(spec)[0]]
    rng = np.random.default_rng(0)
    seen: dict[str, Any] = {"resets_inside": 0, "steps": 0, "returns": np.zeros(len(seeds)), "monitor": {}}
    last: dict[int, tuple[np.ndarray, ...]] = {}
    for step in range(max_steps):
        running = ~(ours.terminated | ours.truncated)
        for i in np.flatnonzero(running):
            for key, ours_key in zip(keys, obs, strict=True):
                expected = their_obs[i][key] if isinstance(their_obs[i], dict) else their_obs[i]
                assert ours_key.dtype == expected.dtype, (key, ours_key.dtype, expected.dtype)
                np.testing.assert_array_equal(ours_key[i], expected[0].reshape(ours_key[i].shape), err_msg=f"step {step}")
        for i in np.flatnonzero(~running):
            assert all(np.array_equal(o[i], kept) for o, kept in zip(obs, last[i], strict=True)), "an ended row changed"
        actions = rng.integers(0, n_actions, size=len(seeds))
        obs, rewards, terminated, truncated = ours.step(actions)
        seen["returns"] += rewards
        for i in np.flatnonzero(running):
            their_obs[i], _, done, infos = theirs[i].step(actions[i : i + 1])
            ended = bool(terminated[i] or truncated[i])
            if done[0] and "episode" in infos[0]:  # Monitor: the environment's own episode is over
                assert ended, f"seed {seeds[i]} goes on here after its game ended, at step {step}"
                seen["monitor"][i] = infos[0]["episode"]["r"]
                last[i] = tuple(o[i].copy() for o in obs)
            else:
                assert not ended, f"seed {seeds[i]} ended here at step {step}, SB3's game goes on"
                seen["resets_inside"] += int(done[0])
        seen["steps"] = step + 1
        if not (~(ours.terminated | ours.truncated)).any():
            break
    return seen


def test_an_atari_game_is_what_sb3s_pipeline_gives_through_every_lost_life() -> None:
    seen = play_both(ATARI, [3, 5], AtariWrapper, n_actions=4, max_steps=2000)
    views = env_spaces(ATARI)[0]
    assert [(v.shape, v.dtype) for v in views] == [((4, 84, 84), "uint8")], "4 frames, channels first, uint8"
    assert seen["resets_inside"] >= 4, "EpisodicLifeEnv ended an episode at each lost life; the games went on"
    assert len(seen["monitor"]) == 2, "both games played to their end"
    # The return is the game's score, as SB3's Monitor counts it (AtariWrapper clips the rewards it passes on).
    assert [seen["returns"][i] for i in range(2)] == [seen["monitor"][i] for i in range(2)]


def test_a_dict_observation_gives_one_array_per_key_as_sb3_stacks_and_transposes_them() -> None:
    spec = EnvSpec(DICT_ID, EnvSetup(frame_stack=2))
    views = env_spaces(spec)[0]
    assert [(v.name, v.shape, v.dtype) for v in views] == [("image", (6, 8, 8), "uint8"), ("vector", (6,), "float32")]
    seen = play_both(spec, [0, 1, 2], None, n_actions=3, max_steps=40)
    assert seen["steps"] > 3 and len(seen["monitor"]) == 3


@pytest.mark.parametrize("env_id", ["BipedalWalker-v3", "BipedalWalkerHardcore-v3", "LunarLanderContinuous-v3"])
def test_box2d_environments_step_in_lockstep(env_id: str) -> None:
    require_registered(env_id)
    envs = GymEnvs(env_id, 2)
    (obs,) = envs.reset([0, 1])
    action_size = env_spaces(EnvSpec(env_id))[1].shape[0]
    (stepped,), rewards, _, _ = envs.step(np.zeros((2, action_size), dtype=np.float32))
    assert obs.dtype == stepped.dtype == np.float32 and obs.shape == stepped.shape and rewards.dtype == np.float64
    envs.close()
