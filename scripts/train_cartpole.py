"""Train the project's own `cartpole` policy: SB3 PPO on seals/CartPole-v0 with a fixed seed.

The recipe is the reference port's (the RL Zoo's tuned seals/CartPole-v0 hyperparameters, the
ones the HumanCompatibleAI/ernestumorga Hub models were trained with). The zip is shipped in the
package; the JSON beside it records how it was made and what it scores, so anyone can retrain
and compare.

    .venv/bin/python scripts/train_cartpole.py            # about a minute on 2 idle cores

On one host a rerun reproduces policy.pth byte for byte (the zip's sha256 differs: `data`
records the start time).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path

import gymnasium as gym
import seals  # noqa: F401  (registers seals/CartPole-v0 with gymnasium)
import stable_baselines3
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

ENV_ID = "seals/CartPole-v0"
DATA = Path(__file__).resolve().parents[1] / "harness" / "policies" / "data"


@dataclass(frozen=True)
class Recipe:
    """PPO hyperparameters; every field is passed to SB3 as is."""

    seed: int = 0
    n_envs: int = 8  # the reference ran 8 envs: 8 x 512 steps per rollout
    total_timesteps: int = 100_000
    n_steps: int = 512
    batch_size: int = 256
    n_epochs: int = 10
    learning_rate: float = 0.0012403278189645594
    gamma: float = 0.9999
    gae_lambda: float = 0.9
    clip_range: float = 0.4
    ent_coef: float = 0.008508727919228772
    vf_coef: float = 0.489343896591493
    max_grad_norm: float = 0.8
    activation: str = "ReLU"
    net_arch: dict[str, list[int]] = field(default_factory=lambda: {"pi": [64, 64], "vf": [64, 64]})


def train(recipe: Recipe) -> PPO:
    env = make_vec_env(ENV_ID, n_envs=recipe.n_envs, seed=recipe.seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=recipe.n_steps,
        batch_size=recipe.batch_size,
        n_epochs=recipe.n_epochs,
        learning_rate=recipe.learning_rate,
        gamma=recipe.gamma,
        gae_lambda=recipe.gae_lambda,
        clip_range=recipe.clip_range,
        ent_coef=recipe.ent_coef,
        vf_coef=recipe.vf_coef,
        max_grad_norm=recipe.max_grad_norm,
        policy_kwargs={"activation_fn": getattr(torch.nn, recipe.activation), "net_arch": recipe.net_arch},
        seed=recipe.seed,
        device="cpu",
    )
    model.learn(total_timesteps=recipe.total_timesteps)
    return model


def deterministic_returns(model: PPO, episode_seeds: list[int]) -> list[float]:
    """Closed-loop returns in the real env, one episode per seed, greedy actions."""
    env = gym.make(ENV_ID)
    returns = []
    for seed in episode_seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=Recipe.seed)
    parser.add_argument("--total-timesteps", type=int, default=Recipe.total_timesteps)
    parser.add_argument("--out", type=Path, default=DATA / "cartpole.zip")
    args = parser.parse_args()

    recipe = Recipe(seed=args.seed, total_timesteps=args.total_timesteps)
    model = train(recipe)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.out)

    episode_seeds = list(range(10))
    returns = deterministic_returns(model, episode_seeds)
    provenance = {
        "env_id": ENV_ID,
        "algorithm": "PPO",
        "policy": "MlpPolicy",
        "recipe": asdict(recipe),
        "zip_sha256": hashlib.sha256(args.out.read_bytes()).hexdigest(),
        "evaluation": {
            "episode_seeds": episode_seeds,
            "deterministic": True,
            "returns": returns,
            "mean_return": sum(returns) / len(returns),
        },
        "versions": {
            "stable_baselines3": stable_baselines3.__version__,
            "torch": torch.__version__,
            "gymnasium": gym.__version__,
            "seals": version("seals"),
            "python": platform.python_version(),
        },
        "command": "python scripts/train_cartpole.py"
        + (f" --seed {recipe.seed}" if recipe.seed != Recipe.seed else "")
        + (f" --total-timesteps {recipe.total_timesteps}" if recipe.total_timesteps != Recipe.total_timesteps else ""),
    }
    args.out.with_suffix(".json").write_text(json.dumps(provenance, indent=2) + "\n")
    print(f"{args.out}: deterministic returns {returns}")


if __name__ == "__main__":
    main()
