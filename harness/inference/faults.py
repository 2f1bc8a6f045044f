"""Faults injected on purpose, so every check the harness makes can be seen failing.

A spec is `card<N>:<kind>`, N the card's position in the sweep (card0, card1, ...):
  perturb-weight  one ULP added to one weight of the first layer, in the card's dtype
  corrupt-weight  the first layer's weights scaled by 1.01: a broken kernel, beyond any tolerance
  mkl-avx2        the card's process runs with MKL_CBWR=AVX2 (another, honest, GEMM code path)
  crash-once      the card's process dies on its first unit; Ray restarts it and the unit is retried
  crash-always    the card's process dies on every unit: the sweep records it and fails
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.errors import UsageError

KINDS = ("perturb-weight", "corrupt-weight", "mkl-avx2", "crash-once", "crash-always")
CORRUPTION = 1.01
_SPEC = re.compile(r"^card(\d+):([a-z0-9-]+)$")
_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


@dataclass(frozen=True)
class Fault:
    card: int
    kind: str

    def __str__(self) -> str:
        return f"card{self.card}:{self.kind}"


def parse_faults(specs: list[str]) -> list[Fault]:
    faults = []
    for spec in specs:
        match = _SPEC.match(spec)
        if not match or match.group(2) not in KINDS:
            raise UsageError(f"--inject-fault {spec!r}: expected card<N>:<kind> with kind one of {', '.join(KINDS)}, e.g. card1:perturb-weight")
        faults.append(Fault(int(match.group(1)), match.group(2)))
    return faults


def env_vars(faults: list[Fault]) -> dict[str, str]:
    """Variables the card's process must start with (MKL reads MKL_CBWR once, at load)."""
    return {"MKL_CBWR": "AVX2"} if any(f.kind == "mkl-avx2" for f in faults) else {}


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


def maybe_crash(faults: list[Fault], marker: Path) -> None:
    """Kill this process the way a dying card would: no exception, no cleanup."""
    kinds = {f.kind for f in faults}
    if "crash-always" in kinds:
        os._exit(17)
    if "crash-once" in kinds and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        os._exit(17)
