"""The judge: compare policy outputs bit for bit, within tolerance, and decision by decision.

Pure numpy, no torch and no Ray, so results can be judged anywhere, again, under new thresholds.
Every function returns a `Comparison` that keeps what was measured (n_mismatch, max_ulp,
max_abs, mean_abs, max_rel, cosine) apart from the thresholds it was judged by (atol, rtol,
min_cos), as Polygraphy does: a `checks` row can be re-judged with SQL without rerunning a card.

The three checks:

- `compare_bitwise`: two cards must agree bit for bit. ULP distances are counted on a monotonic
  integer line (see `ulp_distance`), so neighbours across zero are 1 or 2 apart and -0.0/+0.0 are
  0 apart yet still a reported mismatch.
- `compare_tolerance`: a card against the CPU reference. Passes when
  ``max_abs <= atol + rtol * max|reference|`` (the CartPole port's rule) and
  ``cosine >= min_cos`` (the Huggy port's rule); any NaN or inf fails with that reason.
- `compare_decisions`: discrete actions against the reference's. A flip whose reference margin
  (top-1 logit minus the logit of the action taken) exceeds the margin tolerance fails; flips
  inside it are near-ties, reported but passed.

Measured metrics follow one convention so that SQL over `checks` stays conservative: a NaN
among the compared values makes max_abs, mean_abs, max_rel and cosine NaN (and DuckDB orders NaN above every
number, so ``max_abs <= x`` is false for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

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


@dataclass(frozen=True)
class Tolerance:
    """Thresholds for comparing a card with the reference: the pass rule is
    ``max_abs <= atol + rtol * max|reference|`` and ``cosine >= min_cos``."""

    atol: float
    rtol: float
    min_cos: float

    def __post_init__(self) -> None:
        # `not x >= 0` also refuses NaN, which would silently pass or fail everything.
        if not (self.atol >= 0 and self.rtol >= 0):
            raise ValueError(f"atol and rtol must be >= 0, got atol={self.atol}, rtol={self.rtol}")
        if not -1.0 <= self.min_cos <= 1.0:
            raise ValueError(f"min_cos must lie in [-1, 1], got {self.min_cos}")


TOLERANCES: Final[dict[str, Tolerance]] = {
    "float32": Tolerance(atol=1e-5, rtol=1e-5, min_cos=0.999999),
    "float16": Tolerance(atol=1e-2, rtol=1e-3, min_cos=0.9999),
    "bfloat16": Tolerance(atol=5e-2, rtol=2e-2, min_cos=0.999),
}
"""Default tolerance per compute dtype of the card, against the CPU float32 reference.

Observed on Ascend 910B against CPU float32 (Huggy outputs lie in [-1, 1], so the bound is read
at max|reference| = 1; CartPole logits are larger and the rtol term grows with them):

=========  =============================  ====================  ========  ====================
dtype      observed                       bound at max|ref| 1   headroom  min_cos (observed)
=========  =============================  ====================  ========  ====================
float32    max_abs 1.1e-6 (CartPole       1e-5 + 1e-5 = 2e-5    ~18x      0.999999 (1.0)
           logits 4.8e-7)
float16    max_abs 1.1e-3                 1e-2 + 1e-3 = 1.1e-2  ~10x      0.9999 (not recorded)
bfloat16   max_abs 1.07e-2                5e-2 + 2e-2 = 7e-2    ~6.5x     0.999 (0.99999458)
=========  =============================  ====================  ========  ====================

Why these numbers:

- Headroom is about 10x over what was seen, less for bfloat16, whose 8-bit mantissa already
  costs ~4e-3 of relative error per rounding; a 100x larger error fails every row.
- For float16 and bfloat16, rtol is one to three units of the dtype's precision (eps 9.8e-4 and
  7.8e-3): a large logit carries a rounding error that grows with it. For float32, rtol equals
  atol, so logits near 10 get 1.1e-4, still ~200x the observed CartPole error.
- 1 - cosine grows like the square of the relative error, so it is tiny for a healthy port: the
  cosine rule exists to catch what max_abs cannot, outputs that are small against atol but
  wrong in sign or order. bfloat16 keeps the Huggy port's 0.999 (its observed 1 - cos was
  5.4e-6, 185x inside); float16 has three more mantissa bits and float32 sixteen, so each is
  held tighter.
"""


@dataclass(frozen=True)
class Comparison:
    """One verdict with its measurements; the fields map one to one onto a `checks` row."""

    passed: bool
    bitwise_equal: bool
    n_elements: int
    n_mismatch: int
    """Elements that are not bitwise equal (-0.0 against +0.0 counts, and the detail says so)."""
    max_ulp: int
    """0 when equal; for integer arrays the largest absolute difference; `ULP_NAN` for NaN."""
    max_abs: float
    mean_abs: float
    max_rel: float
    """Largest |a - r| / max(|r|, REL_FLOOR * max|r|)."""
    cosine: float
    """Over the flattened arrays; 1.0 when both are zero, 0.0 when only one is."""
    atol: float | None
    """The thresholds the verdict used; None where the check has none (bitwise)."""
    rtol: float | None
    min_cos: float | None
    detail: str
    """The first mismatch or the failing reasons, "; "-separated; "" when clean."""


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-element distance in units in the last place, as int64.

    Float bits are mapped onto a monotonic integer line (the magnitude bits, negated for a set
    sign bit), so adjacent floats are 1 apart everywhere, the smallest subnormals of either sign
    are 2 apart, and -0.0 and +0.0 are 0 apart. The largest finite value and inf are 1 apart.
    NaN against anything with other bits is `ULP_NAN`; NaNs with identical bits are 0 apart.
    Integer arrays (actions) give the absolute difference. Distances saturate at `ULP_NAN`.
    """
    a, b = np.asarray(a), np.asarray(b)
    _check_pair(a, b)
    return _ulp_distance(a, b)


def compare_bitwise(a: np.ndarray, b: np.ndarray) -> Comparison:
    """Two outputs that must be identical (two cards, same input): passes only when bitwise equal."""
    a, b = np.asarray(a), np.asarray(b)
    _check_pair(a, b)
    same = _same_bits(a, b)
    ulp = _ulp_distance(a, b)
    equal = bool(same.all())
    detail = "" if equal else _first_mismatch(a, b, same, ulp)
    return _comparison(a, same, ulp, _measure(_as_float64(a), _as_float64(b)), None, equal, detail)


def compare_tolerance(actual: np.ndarray, reference: np.ndarray, tol: Tolerance) -> Comparison:
    """A card's output against the reference: within `tol`, and free of NaN and inf."""
    actual, reference = np.asarray(actual), np.asarray(reference)
    _check_pair(actual, reference)
    same = _same_bits(actual, reference)
    act64, ref64 = _as_float64(actual), _as_float64(reference)
    m = _measure(act64, ref64)

    reasons = _nonfinite_reasons(act64, "output") + _nonfinite_reasons(ref64, "reference")
    if not reasons:
        bound = tol.atol + tol.rtol * _max_abs_value(ref64)
        if not m.max_abs <= bound:
            reasons.append(_max_abs_reason(actual, reference, m.max_abs, tol, bound))
        if not m.cosine >= tol.min_cos:
            reasons.append(f"cosine {m.cosine:.9g} < min_cos {tol.min_cos:g}")

    return _comparison(actual, same, _ulp_distance(actual, reference), m, tol, not reasons, "; ".join(reasons))


def _comparison(
    a: np.ndarray, same: np.ndarray, ulp: np.ndarray, m: _Measures, tol: Tolerance | None, passed: bool, detail: str
) -> Comparison:
    """The record of a bitwise or tolerance verdict: what was measured next to what judged it."""
    return Comparison(
        passed=passed,
        bitwise_equal=bool(same.all()),
        n_elements=int(a.size),
        n_mismatch=int(np.count_nonzero(~same)),
        max_ulp=_max_int(ulp),
        max_abs=m.max_abs,
        mean_abs=m.mean_abs,
        max_rel=m.max_rel,
        cosine=m.cosine,
        atol=tol.atol if tol else None,
        rtol=tol.rtol if tol else None,
        min_cos=tol.min_cos if tol else None,
        detail=detail,
    )


def compare_decisions(
    actions: np.ndarray, ref_actions: np.ndarray, ref_logits: np.ndarray, margin_tol: float
) -> Comparison:
    """Discrete actions against the reference's, judged by how close the reference was to a tie.

    `ref_logits` has the shape of `actions` plus one trailing axis of logits. A flip's margin is
    the reference's top-1 logit minus its logit for the action the card took. Flips with a margin
    above `margin_tol` fail; the rest are near-ties, reported in the detail but passed.

    The measured columns keep their meaning as "error per element": max_abs and mean_abs are over
    the margin of each decision (0 where the card agrees), max_rel divides that margin by the
    top-1 logit as max_rel does elsewhere, and cosine is the share of agreeing decisions (the
    cosine between the one-hot encodings). atol holds `margin_tol`, so ``max_abs <= atol``
    re-judges the row.
    """
    actions, ref_actions, ref_logits = (np.asarray(x) for x in (actions, ref_actions, ref_logits))
    _check_pair(actions, ref_actions)
    if actions.dtype.kind not in "iu":
        raise ValueError(f"actions must be an integer array, got {actions.dtype}")
    if ref_logits.shape[:-1] != actions.shape or ref_logits.ndim != actions.ndim + 1 or ref_logits.shape[-1] == 0:
        raise ValueError(
            f"ref_logits must have shape actions.shape + (n_actions,) = {actions.shape} + (k,), "
            f"got {ref_logits.shape}"
        )
    if _bits_dtype(ref_logits.dtype) is None:
        raise ValueError(f"ref_logits must be a float array, got {ref_logits.dtype}")
    if not margin_tol >= 0:
        raise ValueError(f"margin_tol must be >= 0, got {margin_tol}")
    logits = _as_float64(ref_logits)
    n_actions = logits.shape[-1]
    ref_in_range = (ref_actions >= 0) & (ref_actions < n_actions)
    if not ref_in_range.all():
        raise ValueError(f"ref_actions must lie in [0, {n_actions}), got {ref_actions[~ref_in_range][0]}")

    same = _same_bits(actions, ref_actions)
    in_range = (actions >= 0) & (actions < n_actions)
    taken = np.take_along_axis(logits, np.where(in_range, actions, 0)[..., None], axis=-1)[..., 0]
    top = logits.max(axis=-1)
    with np.errstate(invalid="ignore"):
        # An action the policy cannot have taken is as far from a tie as it gets.
        margin = np.where(in_range, top - taken, np.inf)
    error = np.where(same, 0.0, margin)
    # `not <=` so that a NaN margin is a hard flip, never a quiet near-tie.
    hard = ~same & in_range & ~(margin <= margin_tol)
    near_tie = ~same & in_range & ~hard

    reasons = _nonfinite_reasons(logits, "reference logits")
    if not in_range.all():
        idx = _first_index(~in_range)
        reasons.append(
            f"actions out of range [0, {n_actions}) ({np.count_nonzero(~in_range)} of {actions.size}, "
            f"first at {_format_index(idx)}: action {actions[idx]})"
        )
    if hard.any():
        reasons.append(
            f"{np.count_nonzero(hard)} of {actions.size} decisions flipped beyond margin {margin_tol:g}, "
            + _describe_flip(actions, ref_actions, margin, hard)
        )
    notes = []
    if near_tie.any():
        notes.append(
            f"{np.count_nonzero(near_tie)} near-tie flips within margin {margin_tol:g}, "
            + _describe_flip(actions, ref_actions, margin, near_tie)
        )

    n_flips = int(np.count_nonzero(~same))
    return Comparison(
        passed=not reasons,
        bitwise_equal=n_flips == 0,
        n_elements=int(actions.size),
        n_mismatch=n_flips,
        max_ulp=_max_int(_ulp_distance(actions, ref_actions)),
        max_abs=_max_float(error),
        mean_abs=float(error.mean()) if error.size else 0.0,
        max_rel=_max_float(_relative(error, top)),
        cosine=1.0 - n_flips / actions.size if actions.size else 1.0,
        atol=float(margin_tol),
        rtol=None,
        min_cos=None,
        detail="; ".join(reasons + notes),
    )


# --- bits and ULPs ------------------------------------------------------------------------------


def _check_pair(a: np.ndarray, b: np.ndarray) -> None:
    # Comparing across shapes or dtypes is a harness bug, never a verdict: broadcasting or casting
    # here would hide it.
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {b.shape}")
    if a.dtype != b.dtype:
        raise ValueError(f"dtype mismatch: {a.dtype} vs {b.dtype}")
    _bits_dtype(a.dtype)


def _bits_dtype(dtype: np.dtype) -> np.dtype | None:
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


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    bits = _bits_dtype(a.dtype)
    if bits is None:
        return a == b
    return a.view(bits) == b.view(bits)


def _ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    bits = _bits_dtype(a.dtype)
    if bits is None:
        wide = np.uint64 if a.dtype.kind == "u" else np.int64
        return _saturating_abs_diff(a.astype(wide), b.astype(wide))
    ua, ub = a.view(bits), b.view(bits)
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


def _max_int(x: np.ndarray) -> int:
    return int(x.max(initial=0))


# --- measured errors ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Measures:
    max_abs: float
    mean_abs: float
    max_rel: float
    cosine: float


def _as_float64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


def _measure(actual: np.ndarray, reference: np.ndarray) -> _Measures:
    with np.errstate(invalid="ignore", over="ignore"):
        # Equal values have no error even when they are infinite (inf - inf would be NaN).
        error = np.where(actual == reference, 0.0, np.abs(actual - reference))
    return _Measures(
        max_abs=_max_float(error),
        mean_abs=float(error.mean()) if error.size else 0.0,
        max_rel=_max_float(_relative(error, reference)),
        cosine=_cosine(actual.ravel(), reference.ravel()),
    )


def _relative(error: np.ndarray, reference: np.ndarray) -> np.ndarray:
    finite = np.abs(reference[np.isfinite(reference)])
    floor = REL_FLOOR * finite.max(initial=0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        # Only an all-zero reference leaves a zero denominator: any error is then infinitely relative.
        return np.where(error == 0, 0.0, error / np.maximum(np.abs(reference), floor))


def _cosine(x: np.ndarray, y: np.ndarray) -> float:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        # Scaling each side by its largest magnitude first keeps huge values from overflowing
        # the dot product; an inf or NaN leaves NaN, which fails every min_cos.
        sx, sy = _max_float(np.abs(x)), _max_float(np.abs(y))
        if sx == 0 and sy == 0:
            return 1.0
        if sx == 0 or sy == 0:
            return 0.0
        x, y = x / sx, y / sy
        # One sqrt of the product, so identical arrays give exactly 1.0 (sqrt(fl(d * d)) == d).
        cos = float(np.dot(x, y) / np.sqrt(np.dot(x, x) * np.dot(y, y)))
    return min(1.0, max(-1.0, cos)) if np.isfinite(cos) else float("nan")


def _max_float(x: np.ndarray) -> float:
    # np.max propagates NaN, as the module docstring promises.
    return float(x.max(initial=0.0))


def _max_abs_value(x: np.ndarray) -> float:
    return _max_float(np.abs(x))


# --- details ------------------------------------------------------------------------------------


def _first_mismatch(a: np.ndarray, b: np.ndarray, same: np.ndarray, ulp: np.ndarray) -> str:
    idx = _first_index(~same)
    signed_zeros = ~same & (ulp == 0)
    if signed_zeros[idx]:
        why = "sign of zero"
    elif np.isnan(float(a[idx])) or np.isnan(float(b[idx])):
        why = "nan"
    else:
        why = f"{int(ulp[idx])} ulp"
    text = f"first mismatch at {_format_index(idx)}: a={_format_value(a, idx)}, b={_format_value(b, idx)} ({why})"
    n_signed_zeros, n_mismatch = int(np.count_nonzero(signed_zeros)), int(np.count_nonzero(~same))
    if n_signed_zeros and n_mismatch > 1:
        text += f"; {n_signed_zeros} of {n_mismatch} mismatches differ only in the sign of zero"
    return text


def _nonfinite_reasons(x: np.ndarray, what: str) -> list[str]:
    reasons = []
    for name, mask in (("nan", np.isnan(x)), ("inf", np.isinf(x))):
        if mask.any():
            reasons.append(
                f"{name} in {what} ({np.count_nonzero(mask)} of {x.size}, first at {_format_index(_first_index(mask))})"
            )
    return reasons


def _max_abs_reason(actual: np.ndarray, reference: np.ndarray, max_abs: float, tol: Tolerance, bound: float) -> str:
    """Why max_abs failed, with the worst element shown in its own dtype's shortest form."""
    act64, ref64 = _as_float64(actual), _as_float64(reference)
    idx = np.unravel_index(int(np.argmax(np.abs(act64 - ref64))), actual.shape)
    return (
        f"max_abs {max_abs:.9g} > atol {tol.atol:g} + rtol {tol.rtol:g} * max|ref| "
        f"{_max_abs_value(ref64):.9g} = {bound:.9g} at {_format_index(idx)}: "
        f"actual={actual[idx]!s}, reference={reference[idx]!s}"
    )


def _describe_flip(actions: np.ndarray, ref_actions: np.ndarray, margin: np.ndarray, mask: np.ndarray) -> str:
    idx = _first_index(mask)
    return (
        f"first at {_format_index(idx)}: action {actions[idx]}, reference {ref_actions[idx]} "
        f"(reference margin {margin[idx]:.6g})"
    )


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(mask)[0]), mask.shape))


def _format_index(idx: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in idx) + "]"


def _format_value(x: np.ndarray, idx: tuple[int, ...]) -> str:
    bits = _bits_dtype(x.dtype)
    if bits is None:
        return str(x[idx])
    return f"{x[idx]!s} (0x{int(x.view(bits)[idx]):0{2 * bits.itemsize}x})"
