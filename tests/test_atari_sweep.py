"""An Atari agent end to end: a DQN CnnPolicy for Breakout in the RL Zoo layout (its config.yml
names AtariWrapper and 4 stacked frames) swept with nothing but `--policy`: its uint8 image
batches on every card, and its episodes played through the RL Zoo's wrappers, deterministic and
epsilon-greedy, bit for bit across cards."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from harness.judge.verdicts import HONEST
from tests.builders import write_zoo_files
from tests.conftest import Head
from tests.helpers import read_table, sweep_on

pytestmark = pytest.mark.slow

ENV_ID = "BreakoutNoFrameskip-v4"


@pytest.fixture(scope="module")
def swept(ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("ale_py", reason="the atari extra (ale-py) is not installed")
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    folder = tmp_path_factory.mktemp("atari")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = VecFrameStack(make_atari_env(ENV_ID, n_envs=1, seed=0), 4)
        model = DQN("CnnPolicy", env, buffer_size=100, learning_starts=0, exploration_final_eps=0.05, device="cpu")
    zip_path = folder / f"{ENV_ID}.zip"
    model.save(zip_path)
    wrapper = "stable_baselines3.common.atari_wrappers.AtariWrapper"
    write_zoo_files(folder, ENV_ID, [("env_wrapper", [wrapper]), ("frame_stack", 4), ("policy", "CnnPolicy")])
    results = folder / "results"
    proc = sweep_on(
        ray_head.address,
        results,
        "--policy",
        str(zip_path),
        "--dtypes",
        "float32",
        "--batch-sizes",
        "1,8",
        "--episodes",
        "1",
        "--cards",
        "2",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results


def test_image_batches_are_uint8_and_judged_on_every_card(swept: Path) -> None:
    results = swept
    [policy] = json.loads(read_table(results, "runs").to_pylist()[0]["policies"])
    assert policy["inputs"] == [{"name": "obs", "shape": [4, 84, 84], "dtype": "uint8"}]
    assert policy["env_id"] == ENV_ID and "AtariWrapper" in json.dumps(policy["env_setup"])
    checks = read_table(results, "checks").to_pylist()
    batches = {r["workload"] for r in checks if r["kind"] == "cpu_reference"}
    assert {"normal-b1-s0", "normal-b8-s0", "uniform-b64-s0", "edge-b64-s0"} <= batches
    for kind in ("cross_card", "cpu_reference", "decisions"):
        rows = [r for r in checks if r["kind"] == kind and r["workload"].startswith(("normal", "uniform", "edge"))]
        assert rows and all(r["passed"] for r in rows), kind
    assert {r["output"] for r in checks if r["kind"] == "cpu_reference"} == {"q_values"}


def test_episodes_run_in_the_rl_zoo_wrappers_the_same_on_every_card(swept: Path) -> None:
    results = swept
    episodes = read_table(results, "episodes").to_pylist()
    assert {(r["mode"], r["device"]) for r in episodes} == {
        (mode, device) for mode in ("deterministic", "stochastic") for device in ("cpu", "sim-cpu0", "sim-cpu1", HONEST)
    }
    for mode in ("deterministic", "stochastic"):
        played = {r["device"]: r for r in episodes if r["mode"] == mode}
        # A game of Breakout goes on through its five lives: longer than one life's steps.
        assert played["cpu"]["length"] > 50
        assert played["sim-cpu0"]["actions_sha256"] == played["sim-cpu1"]["actions_sha256"]
    checks = read_table(results, "checks").to_pylist()
    trajectories = [r for r in checks if r["kind"] == "cross_card" and r["output"] == "actions"]
    assert trajectories and all(r["passed"] for r in trajectories)
