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
# frexp's exponent of float32's smallest normal (0.5 * 2 ** -125): subnormals round on its grid.
FLOAT32_MIN_EXPONENT = -125
# Products summed exactly in pairs before each float16 addition: a short run, as tensor cores
# take their products, and half the loop of one product per addition. On huggy-arch (512-wide
# layers, 4096 rows) it makes the float16 error 5.9x the CPU's; runs of 4 give 4.3x, of 8 3.2x.
FLOAT16_ACCUMULATE_RUN = 2

Module = TypeVar("Module", bound=nn.Module)


def round_mantissa(x: torch.Tensor, bits: int = REDUCED_MANTISSA_BITS) -> torch.Tensor:
    """float32 rounded to `bits` explicit mantissa bits, to nearest with ties to even, as the
    TF32 conversion does; inf and NaN pass through.

    In arithmetic, not on the bits: scaled by a power of two so that the kept bits are the integer
    part (subnormals on the grid of the smallest normal's), rounded, scaled back, every step
    exact. A `Tensor.view(dtype)` would do the same on the bits, but torch.jit.trace cannot record
    it, and a card's copy with this fault is traced into a vendor's repro
    (harness/inference/torchscript.py)."""
    if x.dtype != torch.float32:
        raise ValueError(f"round_mantissa takes float32, got {x.dtype}")
    shift = torch.frexp(x)[1].clamp(min=FLOAT32_MIN_EXPONENT) - (bits + 1)
    rounded = _times_power_of_two(torch.round(_times_power_of_two(x, -shift)), shift)
    return torch.where(torch.isfinite(x), rounded, x)


def _times_power_of_two(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """x * 2 ** exponent, exactly: in two halves, since 2 ** exponent alone may not be a float32."""
    half = torch.div(exponent, 2, rounding_mode="floor")
    return torch.ldexp(torch.ldexp(x, half), exponent - half)


def reduce_float32_matmuls(model: Module, bits: int = REDUCED_MANTISSA_BITS, layer: str | None = None) -> Module:
    """Round every float32 Linear layer's weights (or layer `layer`'s alone), and its input on
    every call, to `bits` mantissa bits. A float16 or bfloat16 layer is left as it is: a model
    in those dtypes is changed only where a precision plan keeps a layer in float32."""
    for linear in _linears(model, torch.float32, layer):
        with torch.no_grad():
            linear.weight.copy_(round_mantissa(linear.weight, bits))
        linear.register_forward_pre_hook(partial(_round_inputs, bits=bits))
    return model


def _round_inputs(_module: nn.Module, inputs: tuple[torch.Tensor, ...], bits: int) -> tuple[torch.Tensor, ...]:
    return tuple(round_mantissa(x, bits) if x.dtype == torch.float32 else x for x in inputs)


def accumulate_float16_in_float16(model: Module, layer: str | None = None) -> Module:
    """Make every float16 Linear layer (or layer `layer` alone, if float16) sum its products in
    float16, FLOAT16_ACCUMULATE_RUN at a time."""
    for linear in _linears(model, torch.float16, layer):
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


def _linears(model: nn.Module, dtype: torch.dtype, layer: str | None) -> list[nn.Linear]:
    """The Linear layers of `model` whose weights are in `dtype` (of those, `layer` alone); a
    ValueError where `model` has no Linear layer, or none named `layer`."""
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    if not linears:
        raise ValueError(f"{type(model).__name__} has no Linear layer to change")
    if layer is not None and layer not in linears:
        raise ValueError(f"{type(model).__name__} has no Linear layer {layer!r}; its Linear layers: {', '.join(linears)}")
    return [m for name, m in linears.items() if m.weight.dtype == dtype and layer in (None, name)]
