"""Layers kept in float32 inside a policy that computes in float16 or bfloat16: a precision
plan (`float16+fp32[body.0]`), as torch autocast runs a model with some operations excluded.

The layers a plan can name are those that hold parameters (Linear, convolutions): the ones whose
dtype mixed precision chooses. Each computes in its own parameters' dtype, its floating inputs
cast to it; a layer without parameters (an activation) computes in whatever dtype it is handed,
as autocast's pass-through operations do. So a kept layer's float32 output flows on in float32
until the next layer of the narrower dtype takes it.
"""

from __future__ import annotations

from functools import partial
from typing import TypeVar

import torch
from torch import nn

Module = TypeVar("Module", bound=nn.Module)


def precision_layers(model: nn.Module) -> list[str]:
    """The layers a plan can keep in float32, in the order they are registered (a `PolicyNet`
    registers its parts in the order they run): every module without children that holds
    parameters."""
    return [
        name
        for name, m in model.named_modules()
        if name and next(m.children(), None) is None and next(m.parameters(recurse=False), None) is not None
    ]


def keep_float32(model: Module, original: nn.Module, layers: tuple[str, ...]) -> Module:
    """`model` (already cast to its dtype) with `layers` in float32, their parameters taken from
    `original` (the float32 policy: a weight past 65504 came back from float16 as inf), every
    layer of a plan taking its inputs in its own dtype; ValueError for a name that is no such layer."""
    known = precision_layers(model)
    unknown = [name for name in layers if name not in known]
    if unknown:
        raise ValueError(f"no layer {', '.join(unknown)} to keep in float32; the layers: {', '.join(known)}")
    modules, originals = dict(model.named_modules()), dict(original.named_modules())
    for name in known:
        module = modules[name]
        if name in layers:
            module.float().load_state_dict(originals[name].state_dict())
        dtype = next(module.parameters(recurse=False)).dtype
        module.register_forward_pre_hook(partial(_inputs_as, dtype=dtype))
    return model


def _inputs_as(_module: nn.Module, inputs: tuple[object, ...], dtype: torch.dtype) -> tuple[object, ...]:
    return tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
