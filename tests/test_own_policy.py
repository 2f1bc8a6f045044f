"""Your own policy, end to end: an SB3 zip that names no environment, the same policy exported to
ONNX by SB3's documented recipe, and an RL Zoo folder trained with VecNormalize, swept on the
session's Ray cluster with their episodes and read back from Parquet."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.policies import CARTPOLE_ZIP
from tests.conftest import Head
from tests.helpers import read_table, sweep_on
from tests.builders import OnnxableSB3Policy, write_zoo_run

pytestmark = pytest.mark.slow

EPISODES = 16


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A user's files: the shipped CartPole as a plain zip, its ONNX export, an RL Zoo folder."""
    from stable_baselines3 import PPO

    folder = tmp_path_factory.mktemp("own")
    model = shutil.copy(CARTPOLE_ZIP, folder / "model.zip")
    onnx = folder / "model.onnx"
    ppo = PPO.load(CARTPOLE_ZIP, device="cpu")  # the project's own file; the harness itself never unpickles
    torch.onnx.export(
        OnnxableSB3Policy(ppo.policy), torch.zeros(1, 4), str(onnx), opset_version=17, input_names=["input"], dynamo=False
    )
    zoo = write_zoo_run(folder / "zoo", "CartPole-v1").zip
    return {"zip": Path(model), "onnx": onnx, "zoo": zoo}


@pytest.fixture(scope="module")
def swept(own: dict[str, Path], ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("own-results")
    proc = sweep_on(
        ray_head.address,
        results,
        "--policy",
        str(own["zip"]),
        "--policy",
        str(own["onnx"]),
        "--policy",
        str(own["zoo"]),
        "--env",
        "seals/CartPole-v0",
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
    return results


def test_an_sb3_zip_with_env_gets_deterministic_and_stochastic_episodes_on_every_device(
    own: dict[str, Path], swept: Path
) -> None:
    episodes = [e for e in read_table(swept, "episodes").to_pylist() if e["policy"] == str(own["zip"])]
    assert {e["env_id"] for e in episodes} == {"seals/CartPole-v0"}
    for mode in ("deterministic", "stochastic"):
        per_device = {
            d: [e for e in episodes if e["mode"] == mode and e["device"] == d] for d in ("sim-cpu0", "sim-cpu1", "cpu")
        }
        assert all(len(rows) == EPISODES for rows in per_device.values()), {d: len(r) for d, r in per_device.items()}
        assert all(e["batching"] == "lockstep" and e["batch_size"] == EPISODES for e in per_device["cpu"])
    checks = read_table(swept, "checks").to_pylist()
    trajectories = [
        c for c in checks if c["policy"] == str(own["zip"]) and c["kind"] == "cross_card" and c["output"] == "actions"
    ]
    assert len(trajectories) == 2 and all(c["passed"] and c["n_elements"] == EPISODES for c in trajectories)


def test_the_onnx_export_is_rebuilt_checked_against_onnxruntime_and_played(own: dict[str, Path], swept: Path) -> None:
    checks = [c for c in read_table(swept, "checks").to_pylist() if c["policy"] == str(own["onnx"])]
    loader = [c for c in checks if c["kind"] == "onnx_reference"]
    assert loader and {c["output"] for c in loader} == {"logits", "action"} and all(c["passed"] for c in loader)
    assert all(c["error_ratio"] <= c["ratio_limit"] for c in loader if c["output"] == "logits")
    [run] = read_table(swept, "runs").to_pylist()
    detail = {p["name"]: p for p in json.loads(run["policies"])}[str(own["onnx"])]
    assert detail["source"] == "onnx-graph" and "feeds ArgMax" in detail["detail"]
    returns = [
        e["episode_return"]
        for e in read_table(swept, "episodes").to_pylist()
        if e["policy"] == str(own["onnx"]) and e["mode"] == "deterministic"
    ]
    # The CPU, two cards and the CPU's honest-port replay each play every seed.
    assert len(returns) == 4 * EPISODES and min(returns) == 500.0, "the shipped policy, as ONNX, still balances the pole"


def test_an_rl_zoo_folder_keeps_its_own_environment_and_its_vecnormalize(own: dict[str, Path], swept: Path) -> None:
    episodes = [e for e in read_table(swept, "episodes").to_pylist() if e["policy"] == str(own["zoo"])]
    assert episodes and {e["env_id"] for e in episodes} == {"CartPole-v1"}, (
        "args.yml names it: --env is for policies that name none"
    )
    [run] = read_table(swept, "runs").to_pylist()
    zoo = {p["name"]: p for p in json.loads(run["policies"])}[str(own["zoo"])]
    assert (
        zoo["obs_normalization"].startswith("VecNormalize from CartPole-v1/vecnormalize.pkl")
        and "VecNormalize" in zoo["detail"]
    )
    assert zoo["env_id"] == "CartPole-v1" and "args.yml" in zoo["env_source"]
    plain = {p["name"]: p for p in json.loads(run["policies"])}[str(own["zip"])]
    assert (plain["env_id"], plain["env_source"]) == ("seals/CartPole-v0", "--env")
    assert json.loads(run["summary"])["without_episodes"] == {}
