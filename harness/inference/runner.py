"""The runner every actor holds: the policies it was given, one cast copy per dtype, on its device."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from harness.devices import Device
from harness.envs.spec import EnvSpec
from harness.inference.capture import capture_activations
from harness.inference.episodes import run_episodes
from harness.inference.faults import HONEST_SEED, add_ulp_noise
from harness.inference.forward import run_batch, to_device
from harness.inference.torchscript import traced_bytes
from harness.outputs import EpisodeOutput, Outputs
from harness.policies import PolicySpec, load_policy
from harness.policies.base import PolicyNet, cast_policy


@dataclass(frozen=True)
class Described:
    """What an actor says of itself, across Ray to the driver: the card it drives, its threads,
    the bytes it loaded (policy -> sha256), its Ray node; and where its kind of actor has them,
    its place among the cards (a sweep's), whether it keeps freed host memory (a bench's) and
    the faults injected into it; whether it was warm (started by `harness up` before the run) and
    the run it served before this one, if any. Recorded in `runs.devices` (`record`)."""

    device: Device
    threads: int
    policies: dict[str, str]
    node_id: str
    position: int | None = None
    holds_host_memory: bool | None = None
    faults: tuple[str, ...] | None = None
    warm: bool = False
    served_before: str | None = None

    @property
    def label(self) -> str:
        return self.device.label

    def relabelled(self, label: str) -> Described:
        return replace(self, device=replace(self.device, label=label))

    def record(self) -> dict[str, object]:
        """As `runs.devices` holds it: the device's fields, then the actor's, those its kind lacks left out."""
        own = {
            "threads": self.threads,
            "policies": self.policies,
            "node_id": self.node_id,
            "warm": self.warm,
            "served_before": self.served_before,
        }
        extra = {"position": self.position, "holds_host_memory": self.holds_host_memory, "faults": self.faults}
        kept = {k: list(v) if isinstance(v, tuple) else v for k, v in extra.items() if v is not None}
        return self.device.as_dict() | own | kept


class Runner:
    """Loads float32 policies by name; casts and moves each (policy, dtype) to the device once.

    Policies are loaded here from their specs (names and load options), not shipped from the
    driver, so a restarted actor rebuilds itself from its constructor arguments alone. `loaded`
    reports the sha256 of what was loaded: the driver refuses a node whose file differs from its
    own. `prepare` is applied to every cast copy before it moves to the device (a card's
    injected faults).
    """

    def __init__(
        self,
        device: Device,
        policies: list[PolicySpec],
        threads: int,
        prepare: Callable[[PolicyNet], PolicyNet] | None = None,
    ) -> None:
        # Bitwise results depend on the thread count, so it is set, never inherited.
        torch.set_num_threads(threads)
        self.device = device
        self.threads = threads
        self.float32: dict[str, PolicyNet] = {spec.source: load_policy(spec) for spec in policies}
        self._prepare = prepare or (lambda policy: policy)
        self._ready: dict[tuple[str, str], PolicyNet] = {}
        # Episode steps played by this process, read from another thread while a unit runs: a
        # hung actor's count stands still, a slow one's moves (harness/sweeps/gather.py).
        self.steps = 0

    def stepped(self) -> None:
        self.steps += 1

    def loaded(self) -> dict[str, str]:
        return {name: p.info.sha256 for name, p in self.float32.items()}

    def described(self, node_id: str) -> Described:
        """What the actor holding this runner on Ray node `node_id` says of itself, before what its kind adds."""
        return Described(self.device, self.threads, self.loaded(), node_id)

    def policy(self, key: str, dtype: str) -> PolicyNet:
        if (key, dtype) not in self._ready:
            self._ready[key, dtype] = self._prepare(cast_policy(self.float32[key], dtype)).to(self.device.torch_device)
        return self._ready[key, dtype]

    def run_batch(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Outputs:
        return run_batch(self.policy(key, dtype), self.device, obs, noise)

    def honest(self, key: str, dtype: str) -> PolicyNet:
        """The policy under the honest-card model (the ulp-noise fault, nudges of its own): what
        a right port that is not bit-equal to this device computes."""
        if (key, f"{dtype}+honest") not in self._ready:
            honest = add_ulp_noise(cast_policy(self.float32[key], dtype), HONEST_SEED)
            self._ready[key, f"{dtype}+honest"] = honest.to(self.device.torch_device)
        return self._ready[key, f"{dtype}+honest"]

    def run_episodes(
        self, key: str, dtype: str, env: EnvSpec, seeds: list[int], stochastic: bool, batching: str, honest: bool = False
    ) -> list[EpisodeOutput]:
        """`batching`: "lockstep" (one forward per step over all `seeds`) or "single" (batch 1);
        `honest`: played by the policy under the honest-card model."""
        policy = self.honest(key, dtype) if honest else self.policy(key, dtype)
        return run_episodes(policy, self.device, env, seeds, stochastic, batching, self.stepped)

    def capture(self, key: str, dtype: str, obs: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        """Every layer's output on this batch, for finding where two runs part."""
        return capture_activations(self.policy(key, dtype), to_device(obs, self.device))

    def export(self, key: str, dtype: str, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> bytes:
        """This device's copy of the policy in `dtype` (with what `prepare` did to it) as
        TorchScript traced on this batch (harness/inference/torchscript.py)."""
        return traced_bytes(self.policy(key, dtype), to_device(obs, self.device), to_device((noise,), self.device)[0])
