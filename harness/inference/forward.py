"""Run a policy on a device: numpy in, numpy out. Used by the card actors, the CPU reference
and the benchmarks, so every path does the same conversions, eval mode and no-grad once."""

from __future__ import annotations

import numpy as np
import torch

from harness.devices import Device
from harness.outputs import Outputs
from harness.policies.base import PolicyNet


def head_name(policy: PolicyNet) -> str:
    """The head's output, named for what it is (`PolicyNet.head_output`)."""
    return policy.head_output()


def to_device(arrays: tuple[np.ndarray, ...], device: Device) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device.torch_device) for a in arrays)


@torch.inference_mode()
def forward_outputs(policy: PolicyNet, obs: tuple[torch.Tensor, ...], noise: torch.Tensor) -> dict[str, torch.Tensor]:
    latent, head = policy.latent_and_head(*obs)
    return {
        head_name(policy): head,
        "action": policy.deterministic_action(head),
        "stochastic_action": policy.stochastic_action(head, noise, latent),
    }


def outputs_to_numpy(outputs: dict[str, torch.Tensor]) -> Outputs:
    return {name: t.cpu().numpy() for name, t in outputs.items()}


def run_batch(policy: PolicyNet, device: Device, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Outputs:
    """Outputs of one batch as numpy. Timing is the bench's business (harness/inference/timing.py)."""
    return outputs_to_numpy(forward_outputs(policy, to_device(obs, device), to_device((noise,), device)[0]))
