"""A card's copy of a policy as TorchScript: what a vendor's repro script (harness/repro/script.py)
loads with torch alone, without the harness.

The copy is traced on the card that holds it, in the dtype it computes in, with whatever the card
does to it (an injected fault included): the script then reruns the card's own computation, not a
description of it. The trace takes the observations and the sampling noise, and returns the
outputs a sweep judges, in `OUTPUT_ORDER`'s order after the head's output.
"""

from __future__ import annotations

import io
import warnings

import torch
from torch import nn

from harness.inference.forward import head_name
from harness.policies.base import PolicyNet

OUTPUT_ORDER = ("action", "stochastic_action")


class _Outputs(nn.Module):
    """The policy's judged outputs, as one forward of (*obs, noise)."""

    def __init__(self, policy: PolicyNet) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        *obs, noise = inputs
        latent, head = self.policy.latent_and_head(*obs)
        return head, self.policy.deterministic_action(head), self.policy.stochastic_action(head, noise, latent)


def output_names(policy: PolicyNet) -> list[str]:
    """The trace's outputs, by the names a sweep's rows give them."""
    return [head_name(policy), *OUTPUT_ORDER]


def traced_bytes(policy: PolicyNet, obs: tuple[torch.Tensor, ...], noise: torch.Tensor) -> bytes:
    """`policy` traced on this batch, saved as `torch.jit.save` writes it. The trace is of these
    shapes and this policy's branches (the ones a batch of this shape takes)."""
    with torch.no_grad(), warnings.catch_warnings():
        # The policy's Python checks (input counts, sampling kind) are fixed for one policy: the trace keeps the branch taken.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # type: ignore[attr-defined]
        module = torch.jit.trace(_Outputs(policy), (*obs, noise), check_trace=False)  # type: ignore[no-untyped-call]
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    return buffer.getvalue()
