"""The dtypes a card computes in, as labels: float32, float16 and bfloat16; float32 whose matmuls
the card reduces (TF32 on CUDA, HF32 on Ascend, or bf16 / fp16 inputs); and the float64 golden.
Plain data, shared by the policies (to cast and to emulate) and the judge (to weigh an error)."""

from __future__ import annotations

import re
from typing import Final

CARD_DTYPES: Final = ("float32", "float16", "bfloat16")
"""The dtypes a card is asked to compute in, in the order a sweep lists them."""

GOLDEN_DTYPE: Final = "float64"
"""The CPU reference's golden: the whole policy, normalizer and head included, in float64."""

REDUCED_FLOAT32: Final[dict[str, int]] = {"float32-tf32": 10, "float32-hf32": 10, "float32-bf16": 7, "float32-fp16": 10}
"""float32 whose matmul inputs a card rounds to this many mantissa bits, products summed in
float32: the CPU emulates it for the same-dtype reference of such a card."""

MANTISSA_BITS: Final[dict[str, int]] = {"float32": 23, "float16": 10, "bfloat16": 7, GOLDEN_DTYPE: 52, **REDUCED_FLOAT32}
"""Explicit mantissa bits of each label: its eps is 2 ** -bits."""

LABEL_ORDER: Final = ("float32", *REDUCED_FLOAT32, "float16", "bfloat16")
"""The order results list dtype labels in: float32 and its reduced modes, then the narrower dtypes."""


KEEP_FLOAT32_MARK: Final = "+fp32"
"""`float16+fp32[body.0,head]`: float16 with the layers named in brackets computed in float32 (a
precision plan, `harness diagnose`; `harness sweep --keep-float32 PLAN`)."""
_KEPT = re.compile(rf"^(?P<dtype>[a-z0-9-]+){re.escape(KEEP_FLOAT32_MARK)}\[(?P<layers>[^\]]+)\]$")


def kept_label(dtype: str, layers: tuple[str, ...]) -> str:
    """The label of `dtype` with `layers` computed in float32; `dtype` itself when none are."""
    return f"{dtype}{KEEP_FLOAT32_MARK}[{','.join(layers)}]" if layers else dtype


def split_kept(label: str) -> tuple[str, tuple[str, ...]]:
    """A label's dtype and the layers it keeps in float32: ("float16", ("body.0",)) of
    `float16+fp32[body.0]`; (label, ()) of a label without a plan."""
    found = _KEPT.match(label)
    return (found["dtype"], tuple(found["layers"].split(","))) if found else (label, ())


def precision_of(label: str) -> str:
    """The dtype a label's errors are weighed in: its own, before any layers kept in float32 (a
    plan's error is judged against the CPU computing the same plan, in that dtype's terms)."""
    return split_kept(label)[0]


def base_dtype(label: str) -> str:
    """What a card casts its policy to for a label: a card labelled float32-tf32 is sent
    float32 and its own matmuls do the rest; a plan's layers kept in float32 go with it."""
    dtype, kept = split_kept(label)
    return kept_label("float32" if dtype in REDUCED_FLOAT32 else dtype, kept)


def reduced_label(dtype: str, matmul_mode: str | None) -> str:
    """The label of `dtype` on a card whose float32 matmuls run in `matmul_mode` ("tf32", ...)."""
    return f"{dtype}-{matmul_mode}" if dtype == "float32" and matmul_mode else dtype
