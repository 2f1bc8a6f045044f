"""The published score, side by side: the CPU float32's mean episode return against the score a
policy's files state it was published with, on agents SB3 writes here in the RL Zoo's and the
Hugging Face layouts, published from SB3's own evaluate_policy over the sweep's seeds.

LunarLander-v2 names an id gymnasium renamed, BipedalWalker-v3 needs Box2D: both sweep with no
option but --policy (and where to run). The LunarLander score is SB3's, so the harness's return
must be SB3's (which checks that it replays the environment as SB3 does); the BipedalWalker card
states a score the policy cannot reach, so the check fails the run by default (with enough
episodes for an interval), naming the card, or reports it with --published-return finding. The RL
Zoo's own agents, with nothing beside them, are scored from its benchmark table.
"""

from __future__ import annotations

import json
import zipfile
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

from harness.errors import UsageError
from harness.judge.kinds import CheckKind
from harness.judge.returns import Outcome
from harness.judge.verdicts import NOT_THE_AGENTS, ClosedLoopRules, Published, judge_published
from harness.policies import load_policy
from harness.policies.policy_files import PublishedScore, find_env, rl_zoo_benchmark
from harness.policies.sb3.archive import trained_steps
from harness.sweeps.closed_loop import ClosedLoop
from harness.config.command_plan import sweep_plan
from harness.config.fields import Given, config_from, read_toml
from harness.config.options import SweepConfig, validate
from harness.sweeps.plan import EpisodeWork, Unit, plan_inputs, plan_units
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


def test_a_cpu_below_its_published_score_fails_as_the_environments_or_the_weights_unless_a_finding() -> None:
    """The CPU float32 reference is no card: a score it misses says the environment or the weights
    are not the agent's. It gates by default; --published-return finding reports it instead."""
    cpu = np.random.default_rng(3).normal(70.0, 20.0, 24)
    source = "RL Zoo benchmark.md (DLR-RM/rl-baselines3-zoo@0088472): trpo Ant-v3 4982.301 +/- 663.761 over 153 episodes"
    score = Published(4982.301, 663.761, 153, source)
    gated = judge_published(cpu, score, ClosedLoopRules())
    assert gated.result.outcome == Outcome.FAIL and gated.gating and not gated.passed
    detail = gated.result.detail
    assert f"({source})" in detail and detail.endswith(NOT_THE_AGENTS) and "not the port's" in NOT_THE_AGENTS
    found = judge_published(cpu, score, ClosedLoopRules(published_gates=False))
    assert found.result.outcome == Outcome.FAIL and not found.gating and found.result.detail == detail
    near = judge_published(cpu, Published(float(cpu.mean()), 20.0, 153, source), ClosedLoopRules())
    assert near.result.outcome == Outcome.PASS and near.gating and NOT_THE_AGENTS not in near.result.detail


def test_the_published_return_option_gates_by_default_and_the_old_flag_still_runs(tmp_path: Path) -> None:
    def plan(**options: object) -> bool:
        return sweep_plan(validate(config_from(SweepConfig, Given(options)))).published_gates

    assert plan() and plan(require_published_return=True) and plan(published_return="gate")
    assert not plan(published_return="finding")
    config = tmp_path / "sweep.toml"
    config.write_text('published_return = "finding"\n')
    assert read_toml(config, SweepConfig) == {"published_return": "finding"}
    with pytest.raises(UsageError, match="contradict"):
        plan(published_return="finding", require_published_return=True)
    with pytest.raises(UsageError, match="--published-return 'never' is not one of gate, finding"):
        plan(published_return="never")


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


# --- the RL Zoo's benchmark table ----------------------------------------------------------------


def test_the_rl_zoo_benchmark_ships_every_row_of_its_table_with_where_it_is_from() -> None:
    table = rl_zoo_benchmark()
    assert table.origin == "DLR-RM/rl-baselines3-zoo@0088472"
    assert len(table.rows) == 180, "benchmark.md's table at that commit has 180 rows"
    assert table.score("td3", "Ant-v3", 10**6) == PublishedScore(
        5813.274,
        589.773,
        True,
        151,
        "RL Zoo benchmark.md (DLR-RM/rl-baselines3-zoo@0088472): td3 Ant-v3 5813.274 +/- 589.773 over 151 episodes",
    )
    assert table.score("td3", "Ant-v3", 10**6 + 1) is None, "another agent than the one the table scored"
    pong = table.score("ppo", "PongNoFrameskip-v4", 10**7)
    assert pong is not None and not pong.deterministic, "benchmark.md: deterministic except for Atari games"


def test_every_rl_zoo_agent_gets_the_score_its_benchmark_row_states(cases: Path) -> None:
    """The 45 agents as published, nothing beside them: scored from the table by args.yml's algo
    and env, each save trained for the steps its row states."""
    stated = {}
    for line in (cases / "rlzoo" / "benchmark.tsv").read_text().splitlines():
        if not line.startswith("#"):
            algo, env_id, mean, std = line.split("\t")
            stated[(algo, env_id)] = (float(mean), float(std))
    agents = sorted((cases / "rlzoo").glob("*/*_1/*.zip"))
    assert len(agents) == 45
    for agent in agents:
        found = find_env(agent, saved_steps(agent))
        assert found is not None
        algo = agent.parent.parent.name
        published = found.published
        if (algo, found.env_id) not in stated:
            assert published is None, f"{agent}: no row of the table, no score"
            continue
        assert published is not None, agent
        assert (published.mean, published.std) == stated[(algo, found.env_id)], agent
        assert published.deterministic and published.n_episodes is not None and published.n_episodes >= 100
        assert published.source.startswith(f"RL Zoo benchmark.md (DLR-RM/rl-baselines3-zoo@0088472): {algo} {found.env_id} ")
    assert sum(published_of(a, saved_steps(a)) is None for a in agents) == 1, "tqc Pendulum-v1 alone has no row"


def saved_steps(agent: Path) -> int | None:
    with zipfile.ZipFile(agent) as archive:
        return trained_steps(json.loads(archive.read("data")))


def published_of(agent: Path, trained: int | None = 10**5) -> PublishedScore | None:
    """The score found for an agent trained `trained` steps (the table's PPO, DQN and TRPO CartPoles' and more)."""
    found = find_env(agent, trained)
    assert found is not None, f"{agent} names no environment"
    return found.published


def zoo_agent(root: Path, algo: str, env_id: str, args: dict[str, object]) -> Path:
    """An agent in the RL Zoo's layout `<algo>/<Env>_1/<Env>.zip`; the zip itself is never read here."""
    run = root / algo / f"{env_id}_1"
    (run / env_id).mkdir(parents=True)
    (run / env_id / "args.yml").write_text(ordered(args))
    (run / f"{env_id}.zip").write_bytes(b"")
    return run / f"{env_id}.zip"


def test_the_layout_names_the_algorithm_where_args_yml_does_not_and_args_yml_wins(tmp_path: Path) -> None:
    by_layout = zoo_agent(tmp_path / "a", "trpo", "CartPole-v1", {"env": "CartPole-v1"})
    published = published_of(by_layout)
    assert published is not None and published.source.endswith("trpo CartPole-v1 500.000 +/- 0.000 over 300 episodes")
    by_args = zoo_agent(tmp_path / "b", "trpo", "Acrobot-v1", {"algo": "qrdqn", "env": "Acrobot-v1"})
    published = published_of(by_args)
    assert published is not None and published.mean == -69.135, "args.yml's algo: qrdqn"
    elsewhere = tmp_path / "c" / "agent.zip"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"")
    (elsewhere.parent / "args.yml").write_text(ordered({"env": "CartPole-v1"}))
    assert published_of(elsewhere) is None, "no algorithm named, no score"


def test_a_score_beside_the_agent_wins_over_the_benchmark(tmp_path: Path) -> None:
    agent = zoo_agent(tmp_path, "ppo", "CartPole-v1", {"algo": "ppo", "env": "CartPole-v1"})
    alone = published_of(agent)
    assert alone is not None and alone.source.startswith("RL Zoo benchmark.md")
    (agent.parent / "results.json").write_text(json.dumps({"mean_reward": 498.5, "std_reward": 2.0}))
    beside = PublishedScore(498.5, 2.0, True, None, "results.json: mean_reward 498.5, std_reward 2")
    assert published_of(agent) == beside


def test_an_agent_the_benchmark_did_not_score_gets_none(tmp_path: Path) -> None:
    """An algorithm and environment the table has no row for, or a save trained for other steps than
    the row's agent was (an agent of one's own, laid out by `rl_zoo3 train` as the RL Zoo's are)."""
    for algo, env_id, trained in (
        ("tqc", "Pendulum-v1", 20_000),
        ("ppo", "seals/CartPole-v0", 100_000),
        ("myalgo", "CartPole-v1", 100_000),
        ("ppo", "CartPole-v1", 50_000),
        ("ppo", "CartPole-v1", None),
    ):
        agent = zoo_agent(tmp_path / f"{algo}-{trained}", algo, env_id.split("/")[-1], {"algo": algo, "env": env_id})
        found = find_env(agent, trained)
        assert found is not None and found.env_id == env_id and found.published is None, (algo, env_id, trained)


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
    code, out = sweep(ray_head, results, "sweep", *policies, "--published-return", "finding")
    assert code == 0, f"a published score reported as a finding does not fail the run:\n{out[-3000:]}"
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
def test_a_bipedal_walker_claiming_a_score_it_cannot_reach_fails_the_run_naming_the_source_unless_a_finding(
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
    # It gates by default: the same 4 episodes fail the run, naming the score's source.
    decided = ("--policy", walker, "--dtypes", "float32", "--batch-sizes", "1")
    code, out = sweep(ray_head, tmp_path / "gate", "sweep", *decided)
    assert code == 1 and f"FAIL {walker} float32 published_return" in out, out[-3000:]
    [line] = [line for line in out.splitlines() if "published_return:" in line]
    assert "(model card README.md: mean_reward 300.00 +/- 1.00)" in line and "not the port's" in line
    code, out = sweep(ray_head, tmp_path / "finding", "sweep", *decided, "--published-return", "finding")
    assert code == 0 and f"finding (not gating) {walker} float32 published_return" in out, out[-3000:]
