"""Faults injected on purpose, so every check the harness makes can be seen failing.

A spec is `card<N>:<kind>` (N the card's position in the sweep: card0, card1, ...) or
`all:<kind>` (every card: a defect common to every card, which `cross_card` cannot see):
  perturb-weight   one ULP added to one weight of the first layer, in the card's dtype
  corrupt-weight   the first layer's weights scaled by 1.01: a broken kernel, beyond any tolerance
  reduced-fp32     float32 matmul inputs rounded to 10 mantissa bits, as TF32 / HF32 do
  fp16-accumulate  float16 matmuls summed in float16 (a kernel with a float16 accumulator)
  mkl-avx2         the card's process runs with MKL_CBWR=AVX2 (another, honest, GEMM code path)
  crash-once       the card's process dies on its first unit; Ray restarts it and the unit is retried
  crash-always     the card's process dies on every unit: the sweep records it and fails
  hang-once        the card stops answering on its first unit, alive: the driver finds it hung, kills
                   its actor, Ray restarts it and the unit is retried
  hang             the card stops answering on every unit: hung again after its restart, the run
                   ends incomplete (exit 3) naming it
A `-once` fault strikes once per run, across restarts: it leaves a marker file that outlives the
process.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.errors import UsageError
from harness.policies.base import PolicyNet
from harness.policies.matmul_precision import accumulate_float16_in_float16, reduce_float32_matmuls

# What `inject` puts into a policy's copy: the faults a bench can give its timed path alone.
MODEL_KINDS = ("perturb-weight", "corrupt-weight", "reduced-fp32", "fp16-accumulate")
KINDS = (*MODEL_KINDS, "mkl-avx2", "crash-once", "crash-always", "hang-once", "hang")
CORRUPTION = 1.01
_SPEC = re.compile(r"^(?:card(\d+)|all):([a-z0-9-]+)$")
_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


@dataclass(frozen=True)
class Fault:
    card: int | None  # None: every card
    kind: str

    def __str__(self) -> str:
        return f"{'all' if self.card is None else f'card{self.card}'}:{self.kind}"

    def applies_to(self, position: int) -> bool:
        return self.card is None or self.card == position


def parse_faults(specs: list[str]) -> list[Fault]:
    faults = []
    for spec in specs:
        match = _SPEC.match(spec)
        if not match or match.group(2) not in KINDS:
            raise UsageError(
                f"--inject-fault {spec!r}: expected card<N>:<kind> or all:<kind> with kind one of {', '.join(KINDS)}, "
                "e.g. card1:perturb-weight"
            )
        faults.append(Fault(int(match.group(1)) if match.group(1) is not None else None, match.group(2)))
    return faults


def env_vars(faults: list[Fault]) -> dict[str, str]:
    """Variables the card's process must start with (MKL reads MKL_CBWR once, at load)."""
    return {"MKL_CBWR": "AVX2"} if any(f.kind == "mkl-avx2" for f in faults) else {}


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
