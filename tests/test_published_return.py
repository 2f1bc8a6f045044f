"""The published score, side by side: the CPU float32's mean episode return against the score a
policy's files state it was published with, on agents SB3 writes here in the RL Zoo's and the
Hugging Face layouts, published from SB3's own evaluate_policy over the sweep's seeds.

LunarLander-v2 names an id gymnasium renamed, BipedalWalker-v3 needs Box2D: both sweep with no
option but --policy (and where to run). The LunarLander score is SB3's, so the harness's return
must be SB3's (which checks that it replays the environment as SB3 does); the BipedalWalker card
states a score the policy cannot reach, so the check finds it (with enough episodes for an
interval), and fails the run when required.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from harness.judge.kinds import CheckKind
from harness.policies import load_policy
from harness.policies.policy_files import PublishedScore
from harness.run.closed_loop import ClosedLoop
from harness.run.command_plan import sweep_plan
from harness.run.options import SweepConfig
from harness.run.plan import EpisodeWork, Unit, plan_inputs, plan_units
from harness.store.schema import EpisodeRow
from tests.conftest import Head
from tests.helpers import cli, read_table
from tests.test_policy_files import CARD

SEEDS = range(4)  # the sweep's default --seed 0 and --episodes 4


def test_the_published_score_is_judged_on_the_cpu_episodes_of_the_mode_it_was_published_in() -> None:
    """Whichever dtype's units played them: a seed's CPU episode is the same in every one."""
    cartpole = load_policy("cartpole")
    config = sweep_plan(SweepConfig(policies=["cartpole"], dtypes=["float32", "float16"], batch_sizes=[1], episodes=2))
    for deterministic in (True, False):
        cartpole.info = replace(cartpole.info, published=PublishedScore(500.0, 0.0, deterministic, 10, "a card"))
        policies = {"cartpole": cartpole}
        units = plan_units(
            config, policies, {"cartpole": plan_inputs(config, cartpole)}, {"float32": "float32", "float16": "float16"}
        )
        closed = ClosedLoop(config, policies)
        for unit in units:
            if isinstance(unit.work, EpisodeWork):
                # The CPU scores 500 in the published mode, 400 in the other.
                score = 500.0 if unit.work.stochastic != deterministic else 400.0
                closed.add(unit, [_row(unit, "cpu", seed, score) for seed in unit.work.seeds])
        [published] = [v for v in closed.verdicts() if v.check.kind == CheckKind.PUBLISHED_RETURN]
        mode = "deterministic" if deterministic else "stochastic"
        assert published.dtype == "float32" and published.workload == f"published-{mode}-2x-s0-lockstep"
        assert published.check.passed and published.check.result.detail.endswith("every return is the published one")


def _row(unit: Unit, device: str, seed: int, episode_return: float) -> EpisodeRow:
    assert isinstance(unit.work, EpisodeWork)
    return EpisodeRow(
        unit.unit_id,
        unit.policy,
        unit.dtype,
        device,
        "seals/CartPole-v0",
        unit.work.mode,
        "lockstep",
        2,
        seed,
        episode_return,
        500,
        "",
        None,
    )


# --- end to end ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    zip: Path
    returns: list[float]  # SB3's evaluate_policy, one episode per seed


def small_ppo(env_id: str) -> PPO:
    """An untrained PPO with weights drawn from a seed: the score SB3 measures is what it is."""
    model = PPO("MlpPolicy", gym.make(env_id), seed=0, device="cpu", policy_kwargs={"net_arch": [32, 32]})
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.policy.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    return model


def sb3_returns(model: PPO, env_id: str) -> list[float]:
    """evaluate_policy on each seed's episode, deterministic, as rl_zoo3 publishes (Monitor-wrapped)."""
    returns = []
    for seed in SEEDS:
        venv = DummyVecEnv([lambda: Monitor(gym.make(env_id))])
        venv.seed(seed)
        episode, _ = evaluate_policy(model, venv, n_eval_episodes=1, deterministic=True, return_episode_rewards=True)
        returns += episode
    return returns


def ordered(pairs: dict[str, object]) -> str:
    return yaml.dump(OrderedDict(pairs.items()))  # as the RL Zoo writes its run files


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Agent]:
    """LunarLander-v2 as rl_zoo3's push_to_hub leaves a Hugging Face repository (the zip, the
    card, the run files and results.json at its root); BipedalWalker-v3 in the RL Zoo's layout
    with a card beside it that claims far more than the policy does."""
    hub = tmp_path_factory.mktemp("hub")
    lander = small_ppo("LunarLander-v3")  # the spaces of v2; gymnasium 1.x makes only v3
    lander.save(hub / "ppo-LunarLander-v2.zip")
    returns = sb3_returns(lander, "LunarLander-v3")
    score = f"{np.mean(returns):.2f} +/- {np.std(returns):.2f}"
    (hub / "README.md").write_text(
        CARD.format(tag="LunarLander-v2", dataset="LunarLander-v2").replace("500.00 +/- 0.00", score)
    )
    (hub / "args.yml").write_text(ordered({"algo": "ppo", "env": "LunarLander-v2", "env_kwargs": None, "seed": 0}))
    (hub / "config.yml").write_text(ordered({"n_envs": 16, "policy": "MlpPolicy"}))
    (hub / "env_kwargs.yml").write_text(yaml.dump({}))
    results = {"mean_reward": float(np.mean(returns)), "std_reward": float(np.std(returns)), "is_deterministic": True}
    (hub / "results.json").write_text(json.dumps({**results, "n_eval_episodes": len(SEEDS)}))

    zoo = tmp_path_factory.mktemp("zoo")
    walker = small_ppo("BipedalWalker-v3")
    walker.save(zoo / "BipedalWalker-v3.zip")
    (zoo / "BipedalWalker-v3").mkdir()
    (zoo / "BipedalWalker-v3" / "args.yml").write_text(ordered({"algo": "ppo", "env": "BipedalWalker-v3", "seed": 0}))
    (zoo / "BipedalWalker-v3" / "config.yml").write_text(ordered({"normalize": False, "policy": "MlpPolicy"}))
    claim = CARD.format(tag="BipedalWalker-v3", dataset="BipedalWalker-v3").replace("500.00 +/- 0.00", "300.00 +/- 1.00")
    (zoo / "README.md").write_text(claim)
    return {"lander": Agent(hub / "ppo-LunarLander-v2.zip", returns), "walker": Agent(zoo / "BipedalWalker-v3.zip", [])}


def sweep(ray_head: Head, results: Path, *args: str) -> tuple[int, str]:
    proc = cli(*args, "--address", ray_head.address, "--accelerator", "cpu", "--no-progress", "--results", str(results))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, proc.stdout


@pytest.fixture(scope="module")
def swept(agents: dict[str, Agent], ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    results = tmp_path_factory.mktemp("published")
    policies = [arg for agent in agents.values() for arg in ("--policy", str(agent.zip))]
    code, out = sweep(ray_head, results, "sweep", *policies)
    assert code == 0, f"the published score does not gate by default:\n{out[-3000:]}"
    return results, out


@pytest.mark.slow
def test_a_renamed_lunar_lander_plays_v3_and_scores_what_sb3_published(
    agents: dict[str, Agent], swept: tuple[Path, str]
) -> None:
    results, out = swept
    lander = str(agents["lander"].zip)
    checks = read_table(results, "checks").to_pylist()
    [row] = [c for c in checks if c["policy"] == lander and c["kind"] == "published_return"]
    assert (row["device_a"], row["device_b"], row["n_elements"]) == ("cpu", "published", 4)
    # The same mean as published, yet 4 episodes against a mean of 4 cannot tell: never a pass.
    assert row["outcome"] == "inconclusive" and not row["passed"] and not row["gating"]
    assert row["return_diff_low"] <= 0 <= row["return_diff_high"] and "straddles the margin" in row["detail"]
    # SB3's own evaluation over the same seeds: the harness replays the environment as SB3 does.
    # SB3's Monitor rounds each return to 6 decimals.
    assert row["return_a"] == pytest.approx(np.mean(agents["lander"].returns), abs=1e-6)
    assert row["return_b"] == np.mean(agents["lander"].returns), "results.json, at full precision"
    episodes = [e for e in read_table(results, "episodes").to_pylist() if e["policy"] == lander]
    assert {e["env_id"] for e in episodes} == {"LunarLander-v3"}
    [run] = read_table(results, "runs").to_pylist()
    recorded = {p["name"]: p for p in json.loads(run["policies"])}[lander]
    assert (recorded["env_id"], recorded["env_renamed_from"]) == ("LunarLander-v3", "LunarLander-v2")
    assert recorded["env_source"].startswith("RL Zoo args.yml: LunarLander-v2 is LunarLander-v3 since gymnasium 1.0.0")
    assert recorded["published_return"]["source"].startswith("results.json: mean_reward")
    assert json.loads(run["summary"])["env_renames"] == {lander: recorded["env_source"]}
    assert out.count("renamed environment for") == 1 and f"renamed environment for {lander}: RL Zoo args.yml" in out


@pytest.mark.slow
def test_a_bipedal_walker_claiming_a_score_it_cannot_reach_is_found_and_fails_when_required(
    agents: dict[str, Agent], swept: tuple[Path, str], ray_head: Head, tmp_path: Path
) -> None:
    results, out = swept
    walker = str(agents["walker"].zip)
    checks = [c for c in read_table(results, "checks").to_pylist() if c["policy"] == walker]
    [row] = [c for c in checks if c["kind"] == "published_return"]
    assert not row["passed"] and not row["gating"] and row["return_b"] == 300.0 and row["published_std"] == 1.0
    assert row["return_a"] < 0, "an untrained walker falls"
    assert row["outcome"] == "fail" and "it loses more than the margin" in row["detail"], "4 episodes decide a loss this gross"
    assert all(c["passed"] for c in checks if c["kind"] == "cross_card"), "Box2D episodes agree across cards"
    required = ("--require-published-return", "--dtypes", "float32", "--batch-sizes", "1")
    code, out = sweep(ray_head, tmp_path, "sweep", "--policy", walker, *required)
    assert code == 1 and f"FAIL {walker} float32 published_return" in out, out[-3000:]
