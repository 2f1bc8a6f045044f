"""Faults injected on purpose, so every check the harness makes can be seen failing.

A spec is `card<N>:<kind>` (N the card's position in the sweep: card0, card1, ...) or
`all:<kind>` (every card: a defect common to every card, which `cross_card` cannot see), and
`=SIZE` after the kinds that take a size (`all:action-bias=0.2`):
  ulp-noise        an honest card, not a defect: every floating output of every layer moved by up to
                   one ULP in the dtype it computes in, as another card's kernels round (see
                   `add_ulp_noise`); `all:` gives every card the same nudges, `card<N>:` that card its own
  perturb-weight   one ULP added to one weight of the first layer, in the card's dtype
  corrupt-weight   the first layer's weights scaled by 1.01: a broken kernel, beyond any tolerance
  reduced-fp32     float32 matmul inputs rounded to 10 mantissa bits, as TF32 / HF32 do
  fp16-accumulate  float16 matmuls summed in float16 (a kernel with a float16 accumulator)
  action-bias      SIZE (default 0.1) added to the head's output: a continuous action's mean moved,
                   or a discrete policy's first logit raised; a port that loses return
  noisy-sampler    the sampling noise scaled by 1 + SIZE (default 0.5): a stochastic policy that
                   explores more than it should; deterministic actions are untouched
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
from functools import partial
from pathlib import Path

import torch

from harness.errors import UsageError
from harness.policies.base import PolicyNet
from harness.policies.matmul_precision import accumulate_float16_in_float16, reduce_float32_matmuls

# What `inject` puts into a policy's copy: the faults a bench can give its timed path alone.
MODEL_KINDS = (
    "perturb-weight",
    "corrupt-weight",
    "reduced-fp32",
    "fp16-accumulate",
    "ulp-noise",
    "action-bias",
    "noisy-sampler",
)
KINDS = (*MODEL_KINDS, "mkl-avx2", "crash-once", "crash-always", "hang-once", "hang")
# The kinds that take a size (`all:action-bias=0.2`), and the size they take without one.
SIZES = {"action-bias": 0.1, "noisy-sampler": 0.5}
CORRUPTION = 1.01
_SPEC = re.compile(r"^(?:card(\d+)|all):([a-z0-9-]+)(?:=([-+0-9.e]+))?$")
_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
_MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
# The honest-card model on the CPU reference (`honest_replay`): nudges of its own, never a card's.
HONEST_SEED = 2**20
# Of the nudges of `add_ulp_noise`: the share of values moved, half up and half down. The rest
# keep their bits, as most of a real card's do.
ULP_NOISE_RATE = 0.25


@dataclass(frozen=True)
class Fault:
    card: int | None  # None: every card
    kind: str
    size: float | None = None  # the kinds of SIZES: the spec's, or the default

    def __str__(self) -> str:
        size = "" if self.size is None or self.size == SIZES.get(self.kind) else f"={self.size:g}"
        return f"{'all' if self.card is None else f'card{self.card}'}:{self.kind}{size}"

    def applies_to(self, position: int) -> bool:
        return self.card is None or self.card == position

    @property
    def seed(self) -> int:
        """Of a card's ulp-noise: one for `all:` (every card nudged alike), one per card for `card<N>:`."""
        return 0 if self.card is None else self.card + 1


def parse_faults(specs: list[str]) -> list[Fault]:
    faults = []
    for spec in specs:
        match = _SPEC.match(spec)
        if not match or match.group(2) not in KINDS:
            raise UsageError(
                f"--inject-fault {spec!r}: expected card<N>:<kind> or all:<kind> with kind one of {', '.join(KINDS)}, "
                "e.g. card1:perturb-weight, or all:action-bias=0.2"
            )
        kind, size = match.group(2), match.group(3)
        if size is not None and kind not in SIZES:
            raise UsageError(f"--inject-fault {spec!r}: {kind} takes no size; {', '.join(SIZES)} do, e.g. all:action-bias=0.2")
        try:
            value = float(size) if size is not None else SIZES.get(kind)
        except ValueError:
            raise UsageError(f"--inject-fault {spec!r}: {size!r} is not a number, e.g. all:action-bias=0.2") from None
        faults.append(Fault(int(match.group(1)) if match.group(1) is not None else None, kind, value))
    return faults


def env_vars(faults: list[Fault]) -> dict[str, str]:
    """Variables the card's process must start with (MKL reads MKL_CBWR once, at load)."""
    return {"MKL_CBWR": "AVX2"} if any(f.kind == "mkl-avx2" for f in faults) else {}


def inject(policy: PolicyNet, faults: list[Fault]) -> PolicyNet:
    """The card's copy of a policy (already cast to its dtype) with this card's model faults."""
    kinds = {f.kind: f for f in faults}
    if "ulp-noise" in kinds:
        add_ulp_noise(policy, kinds["ulp-noise"].seed)
    if "action-bias" in kinds:
        bias_head(policy, kinds["action-bias"].size or 0.0)
    if "noisy-sampler" in kinds:
        scale_sampling_noise(policy, 1.0 + (kinds["noisy-sampler"].size or 0.0))
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


def add_ulp_noise(policy: PolicyNet, seed: int) -> PolicyNet:
    """An honest card: every floating output of every layer (each module without children) moved
    by one ULP up or down, in the dtype it computes in, for some of the values.

    A card's kernels accumulate in float32 in an order of their own, so in float32 ULP_NOISE_RATE
    of the values move. A float16 or bfloat16 output is that float32 sum rounded to the dtype:
    it moves only where the float32 ULP crosses the dtype's rounding boundary, 2 ** -13 (float16)
    or 2 ** -16 (bfloat16) as often. (A whole ULP of bfloat16 on every output would be more than
    any honest card differs by: up to 2.4 times the CPU's own error against the golden, where an
    H200 measured 1.23.)

    Which values move, and which way, is a hash of the value's bits and `seed`, never of where
    the value sits or how often the layer ran: the card stays run-to-run deterministic and batch
    invariant (a row alone gets the nudges it gets inside a batch), two cards with one seed agree
    bit for bit, and a card restarted mid-sweep computes what it computed before. Zeros, NaN and
    inf, and values a nudge would make infinite, keep their bits."""
    for module in policy.modules():
        if next(module.children(), None) is None:
            module.register_forward_hook(partial(_nudge_output, seed=seed))
    return policy


def _nudge_output(_module: torch.nn.Module, _inputs: object, output: object, seed: int) -> object:
    if isinstance(output, torch.Tensor) and output.dtype in _INT_VIEW:
        return ulp_nudge(output, seed, ULP_NOISE_RATE * 2.0 ** (_MANTISSA_BITS[output.dtype] - _MANTISSA_BITS[torch.float32]))
    return output


def ulp_nudge(x: torch.Tensor, seed: int, rate: float) -> torch.Tensor:
    """`x` with a share `rate` of its values moved by one ULP, half of them up, half down."""
    bits = x.contiguous().view(_INT_VIEW[x.dtype]).to(torch.int64)
    # A 32-bit integer hash (xorshift-multiply), in int64 so that no product overflows.
    h = (bits ^ (seed * 0x9E3779B9)) & 0xFFFFFFFF
    for _ in range(2):
        h = (((h >> 16) ^ h) * 0x45D9F3B) & 0xFFFFFFFF
    h = (h >> 16) ^ h
    threshold = int(rate / 2 * 2**32)
    step = (h < threshold).to(torch.int64) - ((h >= threshold) & (h < 2 * threshold)).to(torch.int64)
    nudged = (bits + step).to(_INT_VIEW[x.dtype]).view(x.dtype).reshape(x.shape)
    keep = ~torch.isfinite(x) | (x == 0) | ~torch.isfinite(nudged)
    return torch.where(keep, x, nudged)


def bias_head(policy: PolicyNet, size: float) -> None:
    """`size` added to the head's output: every continuous action's mean, or the first logit (Q-value)."""
    policy.head.register_forward_hook(partial(_add_bias, size=size, continuous=policy.info.action_kind == "continuous"))


def _add_bias(_module: torch.nn.Module, _inputs: object, output: torch.Tensor, size: float, continuous: bool) -> torch.Tensor:
    if continuous:
        return output + size
    shifted = output.clone()
    shifted[..., 0] += size
    return shifted


def scale_sampling_noise(policy: PolicyNet, factor: float) -> None:
    """Every sampled action drawn with its noise times `factor` (Gumbel, Gaussian, gSDE's matrices)."""
    sample = policy.stochastic_action

    def noisier(head_out: torch.Tensor, noise: torch.Tensor, latent: torch.Tensor | None = None) -> torch.Tensor:
        return sample(head_out, noise * factor, latent)

    # The fault is this policy sampling otherwise: its own method, replaced on the instance.
    policy.stochastic_action = noisier  # type: ignore[method-assign]


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
