"""What an injected fault does to a card (the specs and what each kind means:
harness/inference/fault_specs.py): the model faults put into a card's copy of a policy, and the
crashes and hangs that strike as a unit starts."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

from harness.inference.fault_specs import Fault
from harness.policies.base import PolicyNet
from harness.policies.matmul_precision import accumulate_float16_in_float16, reduce_float32_matmuls

CORRUPTION = 1.01
_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def inject(policy: PolicyNet, faults: list[Fault]) -> PolicyNet:
    """The card's copy of a policy (already cast to its dtype) with this card's model faults."""
    kinds = {f.kind for f in faults}
    if "perturb-weight" in kinds:
        perturb_one_weight(policy)
    if "corrupt-weight" in kinds:
        corrupt_first_layer(policy)
    if "reduced-fp32" in kinds and policy.compute_dtype == torch.float32:
        reduce_float32_matmuls(policy)
    if "fp16-accumulate" in kinds and policy.compute_dtype == torch.float16:
        accumulate_float16_in_float16(policy)
    return policy


def perturb_one_weight(policy: torch.nn.Module) -> None:
    """Move the first weight of the first Linear layer to its next representable value."""
    first = next(m for m in policy.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        bits = first.weight.data.view(-1).view(_INT_VIEW[first.weight.dtype])
        bits[0] += 1


def corrupt_first_layer(policy: torch.nn.Module) -> None:
    first = next(m for m in policy.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        first.weight.mul_(CORRUPTION)


def strike(faults: list[Fault], marker: Path) -> None:
    """Fail the way a failing card does, as a unit starts: die (no exception, no cleanup), or stop
    answering while alive. `marker` names this card's marker files (one per `-once` fault)."""
    for kind in sorted({f.kind for f in faults}):
        once = marker.with_name(f"{marker.name}.{kind}")
        if kind.endswith("-once"):
            if once.exists():
                continue
            once.parent.mkdir(parents=True, exist_ok=True)
            once.touch()
        if kind.startswith("crash-"):
            os._exit(17)
        if kind.startswith("hang"):
            threading.Event().wait()
