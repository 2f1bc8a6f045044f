"""Every SB3 and sb3-contrib family end to end: one saved model of each swept on the session's Ray
cluster (two simulated cards and the CPU), with deterministic and stochastic episodes in a
classic-control environment where the family has one, and image and dict policies on batches
(their environments come with the Atari and Box2D work), read back from Parquet."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sb3_contrib import ARS, QRDQN, TQC, TRPO
from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm

from tests.conftest import Head
from tests.helpers import read_table, sweep_on
from tests.test_sb3_families import OFF, ON, DictEnv, ImageEnv, cnn, multi, redraw, small

pytestmark = pytest.mark.slow

EPISODES = 2

# name -> (how to build it, its environment; None: batches only)
SWEPT: dict[str, tuple[Callable[[], BaseAlgorithm], str | None]] = {
    "ppo-gsde": (lambda: PPO("MlpPolicy", "Pendulum-v1", use_sde=True, policy_kwargs=small(), **ON), "Pendulum-v1"),
    "a2c": (lambda: A2C("MlpPolicy", "CartPole-v1", policy_kwargs=small(), n_steps=8, device="cpu"), "CartPole-v1"),
    "trpo": (lambda: TRPO("MlpPolicy", "Acrobot-v1", policy_kwargs=small(), **ON), "Acrobot-v1"),
    "dqn": (lambda: DQN("MlpPolicy", "CartPole-v1", policy_kwargs=small(), exploration_final_eps=0.3, **OFF), "CartPole-v1"),
    "qrdqn": (lambda: QRDQN("MlpPolicy", "Acrobot-v1", policy_kwargs=small(n_quantiles=4), **OFF), "Acrobot-v1"),
    "td3": (lambda: TD3("MlpPolicy", "Pendulum-v1", policy_kwargs=small(), **OFF), "Pendulum-v1"),
    "ddpg": (lambda: DDPG("MlpPolicy", "MountainCarContinuous-v0", policy_kwargs=small(), **OFF), "MountainCarContinuous-v0"),
    "sac-gsde": (lambda: SAC("MlpPolicy", "Pendulum-v1", use_sde=True, policy_kwargs=small(), **OFF), "Pendulum-v1"),
    "tqc": (lambda: TQC("MlpPolicy", "Pendulum-v1", policy_kwargs=small(), **OFF), "Pendulum-v1"),
    "ars": (lambda: ARS("LinearPolicy", "CartPole-v1", device="cpu"), "CartPole-v1"),
    "ppo-cnn": (lambda: PPO("CnnPolicy", ImageEnv(), policy_kwargs=cnn(), **ON), None),
    "dqn-dict": (lambda: DQN("MultiInputPolicy", DictEnv(True), policy_kwargs=multi(), **OFF), None),
}


@pytest.fixture(scope="module")
def swept(ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    folder = tmp_path_factory.mktemp("sb3-families")
    paths: dict[str, str] = {}
    envs: dict[str, str] = {}
    for name, (make, env_id) in SWEPT.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = make()
        redraw(model)
        model.save(folder / f"{name}.zip")
        paths[name] = str(folder / f"{name}.zip")
        if env_id is not None:
            envs[paths[name]] = env_id
    config = folder / "sweep.toml"
    table = "\n".join(f'"{path}" = "{env_id}"' for path, env_id in envs.items())
    config.write_text(f"policies = {json.dumps(list(paths.values()))}\n[envs]\n{table}\n")
    results = folder / "results"
    proc = sweep_on(
        ray_head.address,
        results,
        "--config",
        str(config),
        "--episodes",
        str(EPISODES),
        "--dtypes",
        "float32",
        "--batch-sizes",
        "1,8",
        "--cards",
        "2",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return paths, results


def _rows(results: Path, table: str, policy: str) -> list[dict[str, Any]]:
    return [r for r in read_table(results, table).to_pylist() if r["policy"] == policy]


@pytest.mark.parametrize("name", [n for n, (_, env) in SWEPT.items() if env is not None])
def test_every_family_plays_its_episodes_on_every_device_both_ways(name: str, swept: tuple[dict[str, str], Path]) -> None:
    paths, results = swept
    episodes = _rows(results, "episodes", paths[name])
    for mode in ("deterministic", "stochastic"):
        counts = {d: sum(e["mode"] == mode and e["device"] == d for e in episodes) for d in ("sim-cpu0", "sim-cpu1", "cpu")}
        assert set(counts.values()) == {EPISODES}, (name, mode, counts)
    trajectories = [c for c in _rows(results, "checks", paths[name]) if c["kind"] == "cross_card" and c["output"] == "actions"]
    assert trajectories and all(c["passed"] for c in trajectories)


@pytest.mark.parametrize("name", list(SWEPT))
def test_every_family_is_judged_on_every_card(name: str, swept: tuple[dict[str, str], Path]) -> None:
    paths, results = swept
    checks = _rows(results, "checks", paths[name])
    assert checks and all(c["passed"] for c in checks if c["gating"])
    batch = {(c["kind"], c["device_a"], c["output"]) for c in checks}
    head = {"dqn": "q_values", "qrdqn": "q_values", "dqn-dict": "q_values", "a2c": "logits", "trpo": "logits", "ars": "logits"}
    for device in ("sim-cpu0", "sim-cpu1"):
        assert ("cpu_reference", device, head.get(name, "mu" if name != "ppo-cnn" else "logits")) in batch, sorted(batch)
    assert ("cross_card", "sim-cpu1", "stochastic_action") in batch


def test_runs_record_each_policys_inputs_and_sampling(swept: tuple[dict[str, str], Path]) -> None:
    paths, results = swept
    [run] = read_table(results, "runs").to_pylist()
    recorded = {p["name"]: p for p in json.loads(run["policies"])}
    assert [i["name"] for i in recorded[paths["dqn-dict"]]["inputs"]] == ["a", "img", "vec"]
    assert recorded[paths["ppo-cnn"]]["inputs"] == [{"name": "obs", "shape": [3, 36, 36], "dtype": "uint8"}]
    assert recorded[paths["dqn"]]["sampling"] == "epsilon-greedy, epsilon 0.3 (exploration_final_eps)"
    assert recorded[paths["sac-gsde"]]["sampling"].startswith("gSDE")
    without = json.loads(run["summary"])["without_episodes"]
    assert set(without) == {paths["ppo-cnn"], paths["dqn-dict"]}, without
