"""Run a policy on a device: numpy in, numpy out. Used by the card actors, the CPU reference
and the benchmarks, so every path does the same conversions, eval mode and no-grad once."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from harness.devices import Device
from harness.policies.base import PolicyNet
from harness.workloads import episode_noise


def head_name(policy: PolicyNet) -> str:
    return "logits" if policy.info.action_kind == "discrete" else "mu"


def to_device(arrays: tuple[np.ndarray, ...], device: Device) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device.torch_device) for a in arrays)


@torch.inference_mode()
def forward_outputs(policy: PolicyNet, obs: tuple[torch.Tensor, ...], noise: torch.Tensor) -> dict[str, torch.Tensor]:
    head = policy(*obs)
    return {
        head_name(policy): head,
        "action": policy.deterministic_action(head),
        "stochastic_action": policy.stochastic_action(head, noise),
    }


def run_batch(policy: PolicyNet, device: Device, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> dict[str, np.ndarray]:
    """Outputs of one batch as numpy. Timing is the bench's business (actors/bench_actor.py)."""
    outputs = forward_outputs(policy, to_device(obs, device), to_device((noise,), device)[0])
    return {name: t.cpu().numpy() for name, t in outputs.items()}


@dataclass(frozen=True)
class EpisodeOutput:
    episode_seed: int
    stochastic: bool
    actions: np.ndarray  # int64 (length,)
    episode_return: float
    length: int

    @property
    def actions_sha256(self) -> str:
        return hashlib.sha256(self.actions.astype(np.int64).tobytes()).hexdigest()


@torch.inference_mode()
def run_episode(policy: PolicyNet, device: Device, env_id: str, seed: int, stochastic: bool) -> EpisodeOutput:
    """One closed-loop episode: the environment steps on this process's CPU, the policy on the card."""
    import gymnasium as gym
    import seals  # noqa: F401  (registers seals/* environments)

    env = gym.make(env_id)
    try:
        obs, _ = env.reset(seed=seed)
        horizon = env.spec.max_episode_steps or 10_000
        noise = torch.from_numpy(episode_noise(policy.info, seed, horizon)).to(device.torch_device)
        actions, total, done, step = [], 0.0, False, 0
        while not done:
            x = torch.from_numpy(np.asarray(obs, dtype=np.float32)[None]).to(device.torch_device)
            head = policy(x)
            act = policy.stochastic_action(head, noise[step : step + 1]) if stochastic else policy.deterministic_action(head)
            action = int(act.item())
            obs, reward, terminated, truncated, _ = env.step(action)
            actions.append(action)
            total += float(reward)
            done = terminated or truncated
            step += 1
    finally:
        env.close()
    return EpisodeOutput(seed, stochastic, np.asarray(actions, dtype=np.int64), total, len(actions))
