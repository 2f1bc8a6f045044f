"""sb3-contrib's MaskablePPO: loaded from its save, played with its environment's `action_masks()`
against its own `predict(obs, action_masks=...)` step by step, and checked on batches with drawn
masks; the `masked_actions` check, and the `ignore-masks` fault that makes it fail.

The environment lives here and is registered in this process only: episodes are played in it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime
import pytest
from sb3_contrib import MaskablePPO

from harness.devices import cpu_reference
from harness.envs.registry import check_env
from harness.errors import UsageError
from harness.inference.episodes import run_episodes
from harness.inference.faults import ignore_masks
from harness.inference.forward import run_batch
from harness.judge.compare import compare_masks
from harness.judge.kinds import CheckKind
from harness.judge.verdicts import judge_episodes
from harness.policies import PolicyNet, cast_policy
from harness.policies.base import ACTION_MASK, ObsInput
from harness.policies.export_onnx import export_onnx
from harness.policies.sb3_zip import load_sb3_zip
from harness.workloads import make_batch
from tests.builders import save_sb3
from tests.test_sb3_families import ON

DEVICE = cpu_reference()
ENV_ID = "HarnessTest/Masked-v0"
SEEDS = [4, 2, 7]
N_ACTIONS = 5


class MaskedEnv(gym.Env[np.ndarray, np.int64]):
    """Four values in, five actions, about half of them legal at each step (one always): the
    masks are the environment's own draws, so a policy that ignores them is caught."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(N_ACTIONS)
        self.mask = np.ones(N_ACTIONS, dtype=bool)

    def action_masks(self) -> np.ndarray:
        return self.mask.copy()

    def _next(self) -> np.ndarray:
        self.mask = self.np_random.uniform(size=N_ACTIONS) < 0.5
        self.mask[self.np_random.integers(N_ACTIONS)] = True
        return self.np_random.uniform(-1.0, 1.0, 4).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self._next(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(self.mask[int(action)])
        return self._next(), reward, False, False, {}


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=MaskedEnv, max_episode_steps=30)


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskablePPO, PolicyNet]:
    model = MaskablePPO("MlpPolicy", MaskedEnv(), policy_kwargs={"net_arch": [16]}, **ON)
    return model, load_sb3_zip(save_sb3(model, tmp_path_factory.mktemp("masked") / "maskable.zip"))


def sb3_episode(model: MaskablePPO, seed: int) -> np.ndarray:
    env = gym.make(ENV_ID)
    obs, _ = env.reset(seed=seed)
    actions = []
    for _ in range(30):
        masks = env.unwrapped.action_masks()  # type: ignore[attr-defined]
        action, _ = model.predict(obs, action_masks=masks, deterministic=True)
        actions.append(int(action))
        obs, *_ = env.step(action)
    return np.asarray(actions)


def test_episodes_match_sb3_predict_with_the_environments_masks(masked: tuple[MaskablePPO, PolicyNet]) -> None:
    model, policy = masked
    assert policy.info.masked and "action masks" in policy.info.detail
    for batching in ("lockstep", "single"):
        for episode in run_episodes(policy, DEVICE, ENV_ID, SEEDS, False, batching):
            np.testing.assert_array_equal(episode.actions, sb3_episode(model, episode.episode_seed))
            assert episode.illegal == 0


def test_a_card_that_ignores_the_masks_fails_the_masked_actions_check(masked: tuple[MaskablePPO, PolicyNet]) -> None:
    _, policy = masked
    honest = run_episodes(policy, DEVICE, ENV_ID, SEEDS, True, "lockstep")
    broken = cast_policy(policy, "float32")
    ignore_masks(broken)
    faulty = run_episodes(broken, DEVICE, ENV_ID, SEEDS, True, "lockstep")
    assert sum(e.illegal for e in faulty) > 0
    checks, _ = judge_episodes({"card0": honest, "card1": faulty}, honest, honest, masked=True)
    verdicts = {c.device_a: c.passed for c in checks if c.kind is CheckKind.MASKED_ACTIONS}
    assert verdicts == {"card0": True, "card1": False}


def test_batches_draw_masks_and_no_masked_action_is_chosen(masked: tuple[MaskablePPO, PolicyNet]) -> None:
    _, policy = masked
    batch = make_batch(policy.info, "normal", 256, 3)
    masks = batch.step_input(ACTION_MASK)
    assert masks is not None and masks.any(axis=1).all() and not masks.all()
    outputs = run_batch(policy, DEVICE, batch.obs, batch.noise)
    for output in ("action", "stochastic_action"):
        assert compare_masks(outputs[output], masks).passed
    assert (outputs["logits"][~masks] == -1e8).all()  # sb3-contrib's MaskableCategorical's HUGE_NEG
    broken = cast_policy(policy, "float32")
    ignore_masks(broken)
    result = compare_masks(run_batch(broken, DEVICE, batch.obs, batch.noise)["action"], masks)
    assert not result.passed and result.n_illegal > 0 and "masked, first at" in result.detail


def test_an_environment_without_action_masks_is_refused(masked: tuple[MaskablePPO, PolicyNet]) -> None:
    info = replace(masked[1].info, inputs=(ObsInput("obs", (4,)),), action_size=2)  # CartPole's spaces
    with pytest.raises(UsageError, match=r"CartPole-v1 does not fit .*: it has no action_masks\(\)"):
        check_env("CartPole-v1", info)


def test_an_export_takes_the_masks_as_an_input(masked: tuple[MaskablePPO, PolicyNet], tmp_path: Path) -> None:
    """The export's `action_mask` input puts the harness's masked logit where a row's mask
    forbids: its logits and actions are the harness's float32 ones; with every action allowed,
    the actions are others (the input is read)."""
    _, policy = masked
    path = tmp_path / "masked.onnx"
    export_onnx(policy, path)
    batch = make_batch(policy.info, "normal", 256, 3)
    masks = batch.step_input(ACTION_MASK)
    assert masks is not None
    ours = run_batch(policy, DEVICE, batch.obs, batch.noise)
    session = onnxruntime.InferenceSession(str(path))
    assert [i.name for i in session.get_inputs()] == ["obs", "action_mask"]
    logits, actions = session.run(None, {"obs": batch.obs[0], "action_mask": masks})
    np.testing.assert_allclose(logits, ours["logits"], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(actions, ours["action"])
    _, unmasked = session.run(None, {"obs": batch.obs[0], "action_mask": np.ones_like(masks)})
    assert not compare_masks(unmasked, masks).passed
