"""Run a policy on a device: numpy in, numpy out. Used by the card actors, the CPU reference
and the benchmarks, so every path does the same conversions, eval mode and no-grad once.

A batch feeds a policy its observations, then its step inputs (`PolicyInfo.step_inputs`): a
masked policy's action masks, and a recurrent policy's episode starts. A recurrent policy reads
its batch as one sequence, a step per row from a zero state, and gives the state after each
step as outputs of their own (`STATE_OUTPUTS`), so the state is checked as the actions are.
"""

from __future__ import annotations

import numpy as np
import torch

from harness.devices import Device
from harness.outputs import STATE_OUTPUTS, Outputs
from harness.policies.base import ACTION_MASK, EPISODE_START, PolicyNet


def head_name(policy: PolicyNet) -> str:
    """The head's output, named for what it is (`PolicyNet.head_output`)."""
    return policy.head_output()


def to_device(arrays: tuple[np.ndarray, ...], device: Device) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device.torch_device) for a in arrays)


def split_feed(policy: PolicyNet, feed: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """A batch's arrays as (the observations, the step inputs by name)."""
    n_obs, names = len(policy.info.inputs), policy.info.step_inputs
    if len(feed) != n_obs + len(names):
        wanted = f"{n_obs} observation inputs" + (f" and {', '.join(names)}" if names else "")
        raise ValueError(f"{policy.info.name} takes {wanted}: {n_obs + len(names)} arrays, got {len(feed)}")
    return feed[:n_obs], dict(zip(names, feed[n_obs:], strict=True))


@torch.inference_mode()
def forward_outputs(policy: PolicyNet, feed: tuple[torch.Tensor, ...], noise: torch.Tensor) -> dict[str, torch.Tensor]:
    obs, steps = split_feed(policy, feed)
    states: dict[str, torch.Tensor] = {}
    if policy.memory is None:
        latent, head = policy.latent_and_head(*obs)
    else:
        latent, head, states = _sequence(policy, obs, steps[EPISODE_START])
    head = policy.masked_scores(head, steps.get(ACTION_MASK))
    return {
        head_name(policy): head,
        "action": policy.deterministic_action(head),
        "stochastic_action": policy.stochastic_action(head, noise, latent),
        **states,
    }


def _sequence(
    policy: PolicyNet, obs: tuple[torch.Tensor, ...], starts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The rows as one sequence, stepped one at a time from a zero state as an agent steps them:
    the latent and head of every step, and the state after each."""
    state = policy.zero_state(1)
    latents, heads, hs, cs = [], [], [], []
    for t in range(obs[0].shape[0]):
        latent, head, state = policy.step(tuple(o[t : t + 1] for o in obs), state, starts[t : t + 1])
        latents.append(latent)
        heads.append(head)
        hs.append(state[0][:, 0])
        cs.append(state[1][:, 0])
    after = {name: torch.stack(s).to(policy.io_dtype) for name, s in zip(STATE_OUTPUTS, (hs, cs), strict=True)}
    return torch.cat(latents), torch.cat(heads), after


def outputs_to_numpy(outputs: dict[str, torch.Tensor]) -> Outputs:
    return {name: t.cpu().numpy() for name, t in outputs.items()}


def run_batch(policy: PolicyNet, device: Device, obs: tuple[np.ndarray, ...], noise: np.ndarray) -> Outputs:
    """Outputs of one batch as numpy (`obs`: the observations, then the step inputs). Timing is
    the bench's business (harness/inference/timing.py)."""
    return outputs_to_numpy(forward_outputs(policy, to_device(obs, device), to_device((noise,), device)[0]))
