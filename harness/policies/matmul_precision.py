"""Matmuls computed at another precision than their dtype says.

- Reduced float32 (TF32 on CUDA, HF32 on Ascend): float32 matmul inputs rounded to 10 mantissa
  bits, products accumulated in float32. The CPU emulates it for a card that runs in that mode
  (`float32-tf32`, `float32-hf32`), so such a card still gets a port verdict; the
  `reduced-fp32` fault injects it on a card that should not.
- float16 matmuls that accumulate in float16 (the `fp16-accumulate` fault): CPU kernels
  accumulate float16 products in float32, so this is a loop that adds partial sums in float16,
  in a fixed order.
"""

from __future__ import annotations

from functools import partial
from typing import TypeVar

import torch
from torch import nn
from torch.nn import functional as F

REDUCED_MANTISSA_BITS = 10
FLOAT32_MANTISSA_BITS = 23
# Products summed exactly in pairs before each float16 addition: a short run, as tensor cores
# take their products, and half the loop of one product per addition. On huggy-arch (512-wide
# layers, 4096 rows) it makes the float16 error 5.9x the CPU's; runs of 4 give 4.3x, of 8 3.2x.
FLOAT16_ACCUMULATE_RUN = 2

Module = TypeVar("Module", bound=nn.Module)


def round_mantissa(x: torch.Tensor, bits: int = REDUCED_MANTISSA_BITS) -> torch.Tensor:
    """float32 rounded to `bits` explicit mantissa bits, to nearest with ties to even, as the
    TF32 conversion does; inf and NaN pass through."""
    if x.dtype != torch.float32:
        raise ValueError(f"round_mantissa takes float32, got {x.dtype}")
    drop = FLOAT32_MANTISSA_BITS - bits
    raw = x.contiguous().view(torch.int32)
    # Adding just under half a unit, plus the kept part's last bit, rounds to nearest, ties to
    # even, on the magnitude bits whatever the sign; a carry into the exponent is the right result.
    kept_lsb = (raw >> drop) & 1
    rounded = (raw + ((1 << (drop - 1)) - 1) + kept_lsb) & ~((1 << drop) - 1)
    return torch.where(torch.isfinite(x), rounded.view(torch.float32), x)


def reduce_float32_matmuls(model: Module, bits: int = REDUCED_MANTISSA_BITS) -> Module:
    """Round every Linear layer's weights, and its input on every call, to `bits` mantissa bits."""
    for linear in _linears(model):
        with torch.no_grad():
            linear.weight.copy_(round_mantissa(linear.weight, bits))
        linear.register_forward_pre_hook(partial(_round_inputs, bits=bits))
    return model


def _round_inputs(_module: nn.Module, inputs: tuple[torch.Tensor, ...], bits: int) -> tuple[torch.Tensor, ...]:
    return tuple(round_mantissa(x, bits) if x.dtype == torch.float32 else x for x in inputs)


def accumulate_float16_in_float16(model: Module) -> Module:
    """Make every float16 Linear layer sum its products in float16, FLOAT16_ACCUMULATE_RUN at a time."""
    for linear in _linears(model):
        # The fault is this layer computing otherwise: its own forward, replaced.
        linear.forward = partial(_float16_accumulating_linear, linear)  # type: ignore[method-assign]
    return model


def _float16_accumulating_linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float16:
        return F.linear(x, linear.weight, linear.bias)
    # float32 holds float16 products and their pair sums exactly; rounding to float16 after each
    # addition is the float16 accumulator. (float16 matmuls on the CPU are slow: this is faster.)
    xs, ws = x.float(), linear.weight.float()
    acc = torch.zeros((*x.shape[:-1], linear.out_features), dtype=torch.float32, device=x.device)
    for start in range(0, linear.in_features, FLOAT16_ACCUMULATE_RUN):
        stop = start + FLOAT16_ACCUMULATE_RUN
        acc = (acc + F.linear(xs[..., start:stop], ws[:, start:stop])).half().float()
    out = acc if linear.bias is None else acc + linear.bias.float()
    return out.half()


def _linears(model: nn.Module) -> list[nn.Linear]:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no Linear layer to change")
    return linears
