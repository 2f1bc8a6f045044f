"""The numerics every comparison shares: bits and ULP distances, measured errors, and how an
element is shown in a message. Pure numpy.

Measured metrics follow one convention so that SQL over `checks` stays conservative: a NaN
among the compared values makes max_abs, mean_abs, max_rel and cosine NaN (and DuckDB orders
NaN above every number, so ``max_abs <= x`` is false for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np

ULP_NAN: Final[int] = int(np.iinfo(np.int64).max)
"""ULP distance reported when exactly one side is NaN, or both are NaNs with different bits.

It doubles as the ceiling of saturated distances: only float64 values of opposite sign near the
ends of the range, or int64 extremes, are that far apart.
"""

REL_FLOOR: Final[float] = 1e-3
"""max_rel divides by max(|reference|, REL_FLOOR * max|reference|): an element far below the
array's own scale (a logit that happens to be 1e-9) is judged against 0.1% of that scale
instead of reporting a relative error of millions."""


# --- bits and ULPs ------------------------------------------------------------------------------


def check_pair(a: np.ndarray, b: np.ndarray) -> None:
    # Comparing across shapes or dtypes is a harness bug, never a verdict: broadcasting or casting
    # here would hide it.
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {b.shape}")
    if a.dtype != b.dtype:
        raise ValueError(f"dtype mismatch: {a.dtype} vs {b.dtype}")
    bits_dtype(a.dtype)


def bits_dtype(dtype: np.dtype) -> np.dtype | None:
    """The unsigned type holding a supported float's bits; None for integer and bool arrays."""
    if dtype.kind in "biu":
        return None
    if dtype.isnative and dtype.type in (np.float16, np.float32, np.float64):
        return np.dtype(f"u{dtype.itemsize}")
    if dtype.name == "bfloat16":
        # Only bfloat16 needs ml_dtypes, and it is already loaded by whoever made the array.
        import ml_dtypes

        if dtype == ml_dtypes.bfloat16:
            return np.dtype(np.uint16)
    raise ValueError(f"unsupported dtype {dtype}: expected float16, bfloat16, float32, float64 or integers")


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    bits = bits_dtype(a.dtype)
    if bits is None:
        return a == b
    return a.view(bits) == b.view(bits)


def ulp_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    bits = bits_dtype(a.dtype)
    if bits is None:
        wide = np.uint64 if a.dtype.kind == "u" else np.int64
        return _saturating_abs_diff(a.astype(wide), b.astype(wide))
    ua, ub = a.view(bits), b.view(bits)
    if np.array_equal(ua, ub):
        # Identical bits are 0 apart, NaNs among them: cards that agree, the common case, skip the line.
        return np.zeros(a.shape, np.int64)
    sign = bits.type(1) << bits.type(8 * bits.itemsize - 1)
    inf_bits = np.array(np.inf, dtype=a.dtype).view(bits)
    mag_a, mag_b = ua & ~sign, ub & ~sign
    dist = _saturating_abs_diff(_line(mag_a, ua & sign), _line(mag_b, ub & sign))
    either_nan = (mag_a > inf_bits) | (mag_b > inf_bits)
    return np.where(either_nan & (ua != ub), ULP_NAN, dist)


def _line(magnitude: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """Position on the monotonic integer line: both zeros at 0, negatives mirrored below it."""
    mag = magnitude.astype(np.int64)  # fits: the sign bit is already cleared
    return np.where(sign != 0, -mag, mag)


def _saturating_abs_diff(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|x - y| as int64 without overflow, for int64 or uint64 inputs."""
    hi, lo = np.maximum(x, y), np.minimum(x, y)
    # Modulo 2**64 the unsigned difference is exact, and the true difference is below 2**64.
    diff = hi.astype(np.uint64) - lo.astype(np.uint64)
    return np.minimum(diff, np.uint64(ULP_NAN)).astype(np.int64)


def max_int(x: np.ndarray) -> int:
    return int(x.max(initial=0))


# --- measured errors ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Measures:
    max_abs: float
    mean_abs: float
    max_rel: float
    cosine: float


def as_float64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


EQUAL: Final[Measures] = Measures(max_abs=0.0, mean_abs=0.0, max_rel=0.0, cosine=1.0)
"""What `measure` gives two arrays of equal finite values: no error, and a cosine of exactly 1
(each side scaled by the same largest magnitude, and sqrt(fl(d * d)) == d)."""


def measure(actual: np.ndarray, reference: np.ndarray) -> Measures:
    if np.array_equal(actual, reference) and np.isfinite(actual).all():
        # Cards that agree, the common case, skip the cosine's dot products: on a loaded host each
        # waits for BLAS threads to wake, and they made most of a sweep's judging time.
        return EQUAL
    return _measure(actual, reference)


def _measure(actual: np.ndarray, reference: np.ndarray) -> Measures:
    with np.errstate(invalid="ignore", over="ignore"):
        # Equal values have no error even when they are infinite (inf - inf would be NaN).
        error = np.where(actual == reference, 0.0, np.abs(actual - reference))
    return Measures(
        max_abs=max_float(error),
        mean_abs=float(error.mean()) if error.size else 0.0,
        max_rel=max_float(relative(error, reference)),
        cosine=cosine(actual.ravel(), reference.ravel()),
    )


def relative(error: np.ndarray, reference: np.ndarray) -> np.ndarray:
    finite = np.abs(reference[np.isfinite(reference)])
    floor = REL_FLOOR * finite.max(initial=0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        # Only an all-zero reference leaves a zero denominator: any error is then infinitely relative.
        return np.where(error == 0, 0.0, error / np.maximum(np.abs(reference), floor))


def cosine(x: np.ndarray, y: np.ndarray) -> float:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        # Scaling each side by its largest magnitude first keeps huge values from overflowing
        # the dot product; an inf or NaN leaves NaN, which fails every min_cos.
        sx, sy = max_float(np.abs(x)), max_float(np.abs(y))
        if sx == 0 and sy == 0:
            return 1.0
        if sx == 0 or sy == 0:
            return 0.0
        x, y = x / sx, y / sy
        # One sqrt of the product, so identical arrays give exactly 1.0 (sqrt(fl(d * d)) == d).
        cos = float(np.dot(x, y) / np.sqrt(np.dot(x, x) * np.dot(y, y)))
    return min(1.0, max(-1.0, cos)) if np.isfinite(cos) else float("nan")


def max_float(x: np.ndarray) -> float:
    # np.max propagates NaN, as the module docstring promises.
    return float(x.max(initial=0.0))


def max_abs_value(x: np.ndarray) -> float:
    return max_float(np.abs(x))


# --- details ------------------------------------------------------------------------------------


def nonfinite_reasons(x: np.ndarray, what: str) -> list[str]:
    reasons = []
    for name, mask in (("nan", np.isnan(x)), ("inf", np.isinf(x))):
        if mask.any():
            reasons.append(
                f"{name} in {what} ({np.count_nonzero(mask)} of {x.size}, first at {format_index(first_index(mask))})"
            )
    return reasons


def first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(mask)[0]), mask.shape))


def format_index(idx: tuple[int | np.integer[Any], ...]) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def format_value(x: np.ndarray, idx: tuple[int, ...]) -> str:
    bits = bits_dtype(x.dtype)
    if bits is None:
        return str(x[idx])
    return f"{x[idx]!s} (0x{int(x.view(bits)[idx]):0{2 * bits.itemsize}x})"
