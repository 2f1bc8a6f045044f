"""Closed-loop evaluation of `cartpole` on the same seeded episodes: Stable-Baselines3
`evaluate_policy` with 16 real seals environments against the harness on one card (many
environments in lockstep, one batched forward per step).

Episode seeds 0..EPISODES-1 on both sides: SB3 evaluates them 16 at a time (`env.seed(s)` makes
environment i reset with seed s + i), the harness all at once. Returns must be identical; the
actions of every episode are compared too, since a good CartPole policy scores 500 either way.
Target: the harness at least 20x SB3's steps/s. Both sides run torch on one thread.
"""

from __future__ import annotations

import statistics
import time
import warnings
from typing import Any

import numpy as np
import ray
import torch

from benchmarks import Comparison
from harness.devices import SIMULATED
from harness.envs.spec import EnvSpec
from harness.envs.cartpole import ENV_ID, HORIZON
from harness.policies import PolicySpec, load_policy
from harness.benches import bench_cards

EPISODES = 256
SB3_ENVS = 16
HARNESS_REPEATS = 5  # the same episodes each time; the median rate is reported
TARGET = 20.0


def sb3_evaluate() -> tuple[float, np.ndarray, np.ndarray]:
    """(steps/s, returns, actions (EPISODES, HORIZON)) of SB3 on the real environment."""
    import gymnasium as gym
    import seals  # noqa: F401  (registers seals/* environments)
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from harness.policies import CARTPOLE_ZIP

    model = PPO.load(CARTPOLE_ZIP, device="cpu")  # the project's own file, not a user's
    env = DummyVecEnv([lambda: Monitor(gym.make(ENV_ID)) for _ in range(SB3_ENVS)])
    actions = np.empty((EPISODES, HORIZON), dtype=np.int8)
    returns: list[float] = []
    steps = 0

    def record(local: dict[str, Any], _: dict[str, Any]) -> None:
        # Called once per environment per step; every episode is HORIZON steps long.
        actions[group + local["i"], local["current_lengths"][local["i"]] - 1] = local["actions"][local["i"]]

    start = time.perf_counter()
    for group in range(0, EPISODES, SB3_ENVS):
        env.seed(group)
        rewards, lengths = evaluate_policy(
            model, env, n_eval_episodes=SB3_ENVS, deterministic=True, return_episode_rewards=True, callback=record
        )
        assert isinstance(rewards, list) and isinstance(lengths, list)  # return_episode_rewards=True
        returns += rewards
        steps += sum(lengths)
    return steps / (time.perf_counter() - start), np.asarray(returns, dtype=np.float64), actions


def run() -> Comparison:
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium's Box precision notes, once per environment
        sb3_rate, sb3_returns, sb3_actions = sb3_evaluate()
        with bench_cards(
            None, SIMULATED, 1, [PolicySpec("cartpole")], {"cartpole": load_policy("cartpole")}, threads=1
        ) as cards:
            actor, env = cards[0].actor, EnvSpec(ENV_ID)
            # One window of one round each (window_s 0), each repeat with its episodes.
            repeats = [
                actor.closed_loop("cartpole", "float32", env, "numpy", EPISODES, 0, 0.0, 1) for _ in range(HARNESS_REPEATS)
            ]
            runs = [run for [run] in ray.get(repeats)]
            [seals_run] = ray.get(actor.closed_loop("cartpole", "float32", env, "gymnasium", EPISODES, 0, 0.0, 1))
    harness_rate = statistics.median(r.decisions_per_s for r in runs)
    same = all(
        np.array_equal(r.returns, sb3_returns) and np.array_equal(np.stack([e.actions for e in r.first_round]), sb3_actions)
        for r in [*runs, seals_run]
    )
    return Comparison(
        name=f"closed-loop cartpole, {EPISODES} seeded episodes: harness (1 card) vs SB3 evaluate_policy ({SB3_ENVS} envs)",
        measured={
            "SB3 evaluate_policy, 16 seals envs": f"{sb3_rate:,.0f} steps/s",
            f"harness, {EPISODES} vector envs in lockstep": f"{harness_rate:,.0f} steps/s (median of {HARNESS_REPEATS})",
            f"harness, {EPISODES} real seals envs in lockstep": f"{seals_run.decisions_per_s:,.0f} steps/s",
            "returns and actions identical to SB3": f"{same} (mean return {sb3_returns.mean():.1f})",
        },
        ratio=harness_rate / sb3_rate if same else 0.0,
        ratio_label="harness / SB3 steps/s (0 unless the episodes are identical)",
        target=TARGET,
    )
