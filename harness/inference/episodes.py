"""Closed-loop episodes: the environment steps on this process's CPU, the policy on the card."""

from __future__ import annotations

import numpy as np
import torch

from harness.devices import Device
from harness.outputs import EpisodeOutput
from harness.policies.base import PolicyNet
from harness.workloads import episode_noise


@torch.inference_mode()
def run_episode(policy: PolicyNet, device: Device, env_id: str, seed: int, stochastic: bool) -> EpisodeOutput:
    """One seeded episode, one decision at a time (batch 1), as a deployed agent runs."""
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
