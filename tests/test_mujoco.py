"""MuJoCo agents (the `mujoco` extra): the -v2 and -v3 ids that published agents name, which
gymnasium 1.x registers only to refuse them, played as -v4 with the old ids' spaces; agents that
SB3 builds on -v4 and -v5 loaded and played as SB3 plays them; and an agent saved naming
HalfCheetah-v3 swept end to end by the real command, its episodes on HalfCheetah-v4, the mapping
recorded, and the score SB3 published for it compared."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from harness.envs.registry import check_env
from harness.envs.renames import MUJOCO, RENAMES
from harness.envs.spec import EnvSpec, is_registered, make_env, require_registered
from harness.errors import UsageError
from harness.judge.verdicts import HONEST
from harness.policies import load_policy
from harness.policies.policy_files import EnvSetup
from harness.run.plan import with_gymnasium_id
from tests.builders import redraw_weights, write_zoo_files, zoo_yaml
from tests.conftest import Head
from tests.helpers import harness, read_table

pytest.importorskip("mujoco", reason="the mujoco extra is not installed (pip install -e '.[mujoco]')")


def made(env_id: str, **kwargs: Any) -> gym.Env[Any, Any]:
    """The environment as the harness makes it (MuJoCo's warnings to Python's, not to MUJOCO_LOG.TXT)."""
    return make_env(EnvSpec(env_id, EnvSetup(kwargs=tuple(kwargs.items()))))[0]


def small() -> dict[str, Any]:
    """policy_kwargs of their own for each model: SB3 writes into the dict it is given (SAC's use_sde)."""
    return {"net_arch": [32, 32]}


OFF = {"buffer_size": 10, "device": "cpu", "seed": 0}


def test_every_mujoco_rename_gives_the_old_ids_spaces() -> None:
    """gymnasium registers each old id only to refuse it; the id it is mapped to, made with the
    rename's keyword arguments, gives the old one's observation shape and Box of actions."""
    for old, rename in MUJOCO.items():
        assert old in gym.registry and not is_registered(old), old
        with pytest.raises(ImportError, match="moved to the gymnasium-robotics project"):
            gym.make(old)
        assert rename.spaces is not None and RENAMES[old] is rename
        env, _ = make_env(EnvSpec(rename.env_id, EnvSetup(kwargs=rename.kwargs)))
        try:
            assert env.observation_space.shape == rename.spaces.observation, old
            assert isinstance(env.action_space, gym.spaces.Box) and env.action_space.shape == (rename.spaces.actions,), old
            assert np.all(env.action_space.high == rename.spaces.action_bound), old
            assert np.all(env.action_space.low == -rename.spaces.action_bound), old
        finally:
            env.close()


def test_an_old_id_with_no_mapping_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError) as refused:
        require_registered("Pusher-v2")
    message = str(refused.value)
    assert "registered in gymnasium" in message and "only to be refused" in message and "\n" not in message


def test_ant_v3_plays_v4_with_contact_forces_which_its_policy_needs(tmp_path: Path) -> None:
    """Ant-v3 observed 111 values; Ant-v4 observes 27 unless made with use_contact_forces=True,
    which the rename adds to the setup: without it the policy's spaces do not fit."""
    model = PPO("MlpPolicy", made("Ant-v4", use_contact_forces=True), policy_kwargs=small(), device="cpu", seed=0)
    model.save(tmp_path / "Ant-v3.zip")
    run = write_zoo_files(tmp_path, "Ant-v3", [("policy", "MlpPolicy")])
    (run / "args.yml").write_text(zoo_yaml([("algo", "ppo"), ("env", "Ant-v3"), ("env_kwargs", {"ctrl_cost_weight": 0.4})]))
    policy = with_gymnasium_id(load_policy(str(tmp_path / "Ant-v3.zip")))
    info = policy.info
    assert (info.env_id, info.env_renamed_from) == ("Ant-v4", "Ant-v3")
    assert info.env_setup.kwargs == (("use_contact_forces", True), ("ctrl_cost_weight", 0.4))
    assert "Ant-v3 is Ant-v4 with use_contact_forces=True since gymnasium 1.0.0" in info.env_source
    check_env(EnvSpec.played_by(info), info)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="its observations flatten to 27 values, the policy takes 111"):
        check_env(EnvSpec("Ant-v4"), info)


AGENTS: dict[str, tuple[Callable[[gym.Env[Any, Any]], BaseAlgorithm], str]] = {
    "sac-halfcheetah-v5": (lambda env: SAC("MlpPolicy", env, policy_kwargs=small(), **OFF), "HalfCheetah-v5"),
    "td3-walker2d-v4": (lambda env: TD3("MlpPolicy", env, policy_kwargs=small(), **OFF), "Walker2d-v4"),
    "ppo-hopper-v5-trained": (
        lambda env: PPO("MlpPolicy", env, policy_kwargs=small(), n_steps=128, batch_size=64, n_epochs=1, device="cpu", seed=0),
        "Hopper-v5",
    ),
}


@pytest.mark.parametrize("name", list(AGENTS))
def test_agents_sb3_builds_on_v4_and_v5_load_and_play_as_sb3_plays_them(name: str, tmp_path: Path) -> None:
    """Along an episode SB3 plays (200 steps), the harness's action for each observation is the
    one SB3's predict chose."""
    make, env_id = AGENTS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium's note that v4 is not the newest
        model = make(made(env_id))
        if name.endswith("trained"):
            model.learn(256)  # a few hundred steps: the weights of a run, not of an initializer
        else:
            redraw_weights(model)
    model.save(tmp_path / "agent.zip")
    policy = load_policy(str(tmp_path / "agent.zip"))
    check_env(env_id, policy.info)
    env = made(env_id)
    obs, _ = env.reset(seed=0)
    for _ in range(200):
        action = model.predict(obs, deterministic=True)[0]
        with torch.inference_mode():
            ours = policy.deterministic_action(policy(torch.from_numpy(obs[None].astype(np.float32))))
        np.testing.assert_allclose(np.clip(ours.numpy()[0], env.action_space.low, env.action_space.high), action, atol=1e-6)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()


# --- end to end: an agent naming HalfCheetah-v3, swept by the real command ----------------------

ENV_ID = "HalfCheetah-v3"
EPISODES = 2  # the sweep's --seed 0: seeds 0 and 1


@pytest.fixture(scope="module")
def cheetah(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """An untrained SAC built on HalfCheetah-v4 (the spaces of v3), saved in the RL Zoo's layout
    naming HalfCheetah-v3, with the score SB3's evaluate_policy gives it on v4 over the sweep's
    seeds in results.json beside the zip, as huggingface_sb3 publishes one."""
    folder = tmp_path_factory.mktemp("cheetah")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SAC("MlpPolicy", made("HalfCheetah-v4"), policy_kwargs=small(), **OFF)
        redraw_weights(model)
        model.save(folder / f"{ENV_ID}.zip")
        returns = []
        for seed in range(EPISODES):
            venv = DummyVecEnv([lambda: Monitor(made("HalfCheetah-v4"))])
            venv.seed(seed)
            episode, _ = evaluate_policy(model, venv, n_eval_episodes=1, deterministic=True, return_episode_rewards=True)
            returns += episode
    write_zoo_files(folder, ENV_ID, [("policy", "MlpPolicy")])
    results = {"mean_reward": float(np.mean(returns)), "std_reward": float(np.std(returns)), "is_deterministic": True}
    (folder / "results.json").write_text(json.dumps({**results, "n_eval_episodes": EPISODES}))
    return folder / f"{ENV_ID}.zip", float(np.mean(returns))


@pytest.mark.slow
def test_an_agent_saved_on_halfcheetah_v3_sweeps_with_episodes_on_v4(
    cheetah: tuple[Path, float], ray_head: Head, tmp_path: Path
) -> None:
    zip_path, published = cheetah
    # Episodes at batch 1, as SB3's evaluate_policy plays them: in lockstep the CPU computes a row
    # inside a batch of 2 to other last bits than alone, and HalfCheetah grows a 1e-6 difference in
    # an action into a return 45% apart within 1000 steps (measured here).
    args = ("--policy", str(zip_path), "--dtypes", "float32", "--batch-sizes", "1", "--episodes", str(EPISODES))
    args = (*args, "--episode-batching", "single")
    proc = harness(
        "sweep",
        *args,
        "--cards",
        "2",
        "--accelerator",
        "cpu",
        "--no-progress",
        "--address",
        ray_head.address,
        "--results",
        str(tmp_path),
        env=ray_head.env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run] = read_table(tmp_path, "runs").to_pylist()
    [recorded] = json.loads(run["policies"])
    assert (recorded["env_id"], recorded["env_renamed_from"]) == ("HalfCheetah-v4", ENV_ID)
    assert recorded["env_source"].startswith(f"RL Zoo {ENV_ID}/args.yml: {ENV_ID} is HalfCheetah-v4 since gymnasium 1.0.0")
    assert json.loads(run["summary"])["env_renames"] == {str(zip_path): recorded["env_source"]}
    assert f"renamed environment for {zip_path}: RL Zoo {ENV_ID}/args.yml" in proc.stdout
    episodes = read_table(tmp_path, "episodes").to_pylist()
    assert {e["env_id"] for e in episodes} == {"HalfCheetah-v4"} and {e["length"] for e in episodes} == {1000}
    assert {(e["mode"], e["device"]) for e in episodes} == {
        (mode, device) for mode in ("deterministic", "stochastic") for device in ("cpu", "sim-cpu0", "sim-cpu1", HONEST)
    }
    checks = read_table(tmp_path, "checks").to_pylist()
    trajectories = [c for c in checks if c["kind"] == "cross_card" and c["output"] == "actions"]
    assert trajectories and all(c["passed"] for c in trajectories), "MuJoCo episodes agree bit for bit across cards"
    [row] = [c for c in checks if c["kind"] == "published_return"]
    assert (row["device_b"], row["n_elements"], row["return_b"]) == ("published", EPISODES, published)
    assert recorded["published_return"]["source"].startswith("results.json: mean_reward")
    # The harness replays HalfCheetah-v4 as SB3's evaluate_policy did: the same seeds, the same score.
    assert row["return_a"] == pytest.approx(published, abs=1e-5), (row["return_a"], published)
    # The published mean itself, but two varying episodes: an interval far wider than the margin, never a pass.
    assert (row["outcome"], row["passed"], row["gating"]) == ("inconclusive", False, False)
