"""What an injected fault does to a card (the kinds, what each strikes and means:
harness/inference/fault_specs.py `FAULTS`): the faults put into a card's copy of a policy, and
the crashes and hangs that strike as a unit starts. Each kind's record names its function here."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import assert_never

import torch

from harness.inference.fault_specs import FAULTS, Fault, FaultKind, Strikes
from harness.policies.base import PolicyNet, branch_starts
from harness.policies.matmul_precision import accumulate_float16_in_float16, reduce_float32_matmuls
from harness.registry import imported

CORRUPTION = 1.01
_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
_MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
# The honest-card model on the CPU reference (`honest_replay`): nudges of its own, never a card's.
HONEST_SEED = 2**20
# Of the nudges of `add_ulp_noise`: the share of values moved, half up and half down. The rest
# keep their bits, as most of a real card's do.
ULP_NOISE_RATE = 0.25


def inject(policy: PolicyNet, faults: list[Fault]) -> PolicyNet:
    """The card's copy of a policy (already cast to its dtype) with this card's POLICY faults, in
    `FAULTS`' order (one fault of each kind: the last given)."""
    given = {f.kind: f for f in faults}
    for kind in FAULTS.values():
        if kind.name in given and kind.strikes is Strikes.POLICY:
            how(kind)(policy, given[kind.name])
    return policy


def how(kind: FaultKind) -> Callable[..., None]:
    """The function that applies `kind` (imported, where its record names it by path)."""
    target = imported(kind.how) if isinstance(kind.how, str) else kind.how
    if not callable(target):
        raise TypeError(f"fault kind {kind.name!r} applies with {target!r}, which is no function")
    return target


# How each kind that strikes the policy applies (its record names the function): the fault's
# own size, layer or seed handed to the change it makes.
def inject_perturb_weight(policy: PolicyNet, _fault: Fault) -> None:
    perturb_one_weight(policy)


def inject_corrupt_weight(policy: PolicyNet, _fault: Fault) -> None:
    corrupt_first_layer(policy)


def inject_reduced_fp32(policy: PolicyNet, fault: Fault) -> None:
    reduce_float32_matmuls(policy, layer=fault.layer)


def inject_fp16_accumulate(policy: PolicyNet, fault: Fault) -> None:
    accumulate_float16_in_float16(policy, layer=fault.layer)


def inject_ulp_noise(policy: PolicyNet, fault: Fault) -> None:
    add_ulp_noise(policy, fault.seed)


def inject_action_bias(policy: PolicyNet, fault: Fault) -> None:
    bias_head(policy, fault.size or 0.0)


def inject_noisy_sampler(policy: PolicyNet, fault: Fault) -> None:
    scale_sampling_noise(policy, 1.0 + (fault.size or 0.0))


def inject_ignore_masks(policy: PolicyNet, _fault: Fault) -> None:
    ignore_masks(policy)


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
    if isinstance(output, tuple):  # an LSTM's (output, (h, c)): each nudged alike, by its bits
        return tuple(_nudge_output(_module, _inputs, part, seed) for part in output)
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
    """`size` added to the head's output: every continuous action's mean, or the first logit
    (Q-value) of each branch (one for a discrete policy)."""
    kind = policy.info.action_kind
    match kind:
        case "continuous":
            firsts = None
        case "discrete" | "multi_discrete":
            firsts = list(branch_starts(policy.info.branch_sizes))
        case _:
            assert_never(kind)
    policy.head.register_forward_hook(partial(_add_bias, size=size, firsts=firsts))


def _add_bias(
    _module: torch.nn.Module, _inputs: object, output: torch.Tensor, size: float, firsts: list[int] | None
) -> torch.Tensor:
    if firsts is None:
        return output + size
    shifted = output.clone()
    shifted[..., firsts] += size
    return shifted


def scale_sampling_noise(policy: PolicyNet, factor: float) -> None:
    """Every sampled action drawn with its noise times `factor` (Gumbel, Gaussian, gSDE's matrices)."""
    sample = policy.stochastic_action

    def noisier(head_out: torch.Tensor, noise: torch.Tensor, latent: torch.Tensor | None = None) -> torch.Tensor:
        return sample(head_out, noise * factor, latent)

    # The fault is this policy sampling otherwise: its own method, replaced on the instance.
    policy.stochastic_action = noisier  # type: ignore[method-assign]


def ignore_masks(policy: PolicyNet) -> None:
    """A masked policy that chooses as if every action were legal: a port that dropped the mask input."""

    def unmasked(head_out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return head_out

    policy.masked_scores = unmasked  # type: ignore[method-assign]


def corrupt_first_layer(policy: torch.nn.Module) -> None:
    first = next(m for m in policy.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        first.weight.mul_(CORRUPTION)


def strike(faults: list[Fault], marker: Path) -> None:
    """Fail the way a failing card does, as a unit starts, for each UNIT fault: die (no exception,
    no cleanup), or stop answering while alive. `marker` names this card's marker files (one per
    fault that strikes once). In the order of the kinds' names, whatever order the specs came in:
    a card given crash-always and hang-once dies before it could hang."""
    for kind in map(FAULTS.get, sorted({f.kind for f in faults if f.record.strikes is Strikes.UNIT})):
        if kind.once:
            once = marker.with_name(f"{marker.name}.{kind.name}")
            if once.exists():
                continue
            once.parent.mkdir(parents=True, exist_ok=True)
            once.touch()
        how(kind)()


def crash() -> None:
    """The card's process dies, as a failing card's does: no exception, no cleanup."""
    os._exit(17)


def hang() -> None:
    """The card stops answering, alive."""
    threading.Event().wait()
