"""What both actors share: the policies they were given, one cast copy per dtype, thread count."""

from __future__ import annotations

import harness.devices  # noqa: F401  (sets TORCH_DEVICE_BACKEND_AUTOLOAD before torch loads)

import numpy as np
import ray
import torch

from harness.devices import Device
from harness.inference import EpisodeOutput, run_batch, run_episode, to_device
from harness.localize import capture_activations
from harness.policies import load_policy
from harness.policies.base import PolicyNet, cast_policy


class Runner:
    """Loads float32 policies by name; casts and moves each (policy, dtype) to the device once.

    Policies are loaded here from their names, not shipped from the driver, so a restarted
    actor rebuilds itself from its constructor arguments alone. `describe` reports the sha256
    of what was loaded: the driver refuses a node whose file differs from its own.
    """

    def __init__(self, device: Device, policies: list[str], threads: int) -> None:
        # Bitwise results depend on the thread count, so it is set, never inherited.
        torch.set_num_threads(threads)
        self.device = device
        self.threads = threads
        self._float32: dict[str, PolicyNet] = {name: load_policy(name) for name in policies}
        self._ready: dict[tuple[str, str], PolicyNet] = {}

    def describe(self) -> dict[str, object]:
        loaded = {name: p.info.sha256 for name, p in self._float32.items()}
        node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        return self.device.as_dict() | {"threads": self.threads, "policies": loaded, "node_id": node_id}

    def policy(self, key: str, dtype: str) -> PolicyNet:
        if (key, dtype) not in self._ready:
            self._ready[key, dtype] = self._prepare(cast_policy(self._float32[key], dtype)).to(self.device.torch_device)
        return self._ready[key, dtype]

    def _prepare(self, policy: PolicyNet) -> PolicyNet:
        return policy

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> dict[str, np.ndarray]:
        return run_batch(self.policy(key, dtype), self.device, obs, noise)

    def run_episodes(self, key: str, dtype: str, env_id: str, seeds: list[int], stochastic: bool) -> list[EpisodeOutput]:
        policy = self.policy(key, dtype)
        return [run_episode(policy, self.device, env_id, seed, stochastic) for seed in seeds]

    def capture(self, key: str, dtype: str, obs: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        """Every layer's output on this batch, for finding where two runs part."""
        return capture_activations(self.policy(key, dtype), to_device(obs, self.device))
