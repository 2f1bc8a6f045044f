"""Is the port right? A card's error against a float64 golden, over the CPU's own error in the
card's dtype.

A card computing in float16 is off from the exact answer by float16's rounding, whatever the
card. So the card is not judged by a fixed tolerance against the CPU float32 output, which mixes
"is this kernel right" with "is float16 enough here" (an SB3 CartPole expert in float16 failed
such a table on the H200 and on the CPU alike: the error was float16's own). It is judged against
the same computation done on the CPU in the card's dtype, both measured against the float64
golden, over the whole output array of the batch (n elements):

    error_ratio = RMSE(card - golden)   / max(RMSE(cpu_same - golden),   0.5 * eps * rms(golden))
    max_ratio   = max|card - golden|    / max(max|cpu_same - golden|,    0.5 * eps * max|golden|)

Both must stay within the limit for n (`RatioLimits`): RMSE alone dilutes one bad element by
sqrt(n), so a defect in a few edge rows, common to every card, would pass it; the max ratio sees
it. The floor, half a unit in the last place of the dtype at the golden's scale, keeps a CPU
that happens to be exact on a tiny batch from turning any honest rounding into an infinite ratio.

NaN or inf in the card's output where the golden is finite fails the port, with the reason,
unless the CPU computing in the card's dtype is not finite there either: then the overflow is
the dtype's (float16's range cannot hold this policy's values), not the port's. The port passes,
judged on the values both sides computed finitely, and says so (`n_overflow`); the dtype's own
checks fail on those values (harness/judge/verdicts.py). A card that overflows where the CPU in
its dtype does not still fails the port.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.dtypes import MANTISSA_BITS, precision_of
from harness.judge.numerics import as_float64, first_index, format_index, max_float, measure


_CPU_SAME = "the CPU in the card's dtype"


def eps(label: str) -> float:
    dtype = precision_of(label)
    if dtype not in MANTISSA_BITS:
        raise ValueError(f"no mantissa width known for dtype {dtype!r}; known: {', '.join(MANTISSA_BITS)}")
    return 2.0 ** -MANTISSA_BITS[dtype]


@dataclass(frozen=True)
class RatioLimits:
    """The largest error ratio a right port may show, by how many elements the ratio is over:
    a ratio of a few elements is noisier than one of thousands (as in PyTorch's
    `torch._dynamo.utils.same`, which allows larger multiples of the eager error for few elements).

    The evidence (`python -m benchmarks ratio_limits`): honest other code paths on this CPU
    (MKL_CBWR=AVX2, 3 and 6 threads; 720 batches of four policies, sizes 1 to 4096) reached at
    worst 3.27 below 100 elements, 1.18 from 100 and 1.17 from 1000 in float32, exactly 1 in
    float16 and bfloat16. A right H200 reached 1.11 in float16, 2.25 in bfloat16 at batch 1 (1.23
    from 4 elements), 1.56 in float32 from 128 elements (against a golden rounded to float32, so
    indicative). Defects land far outside: TF32 884-2302 on the H200, `reduced-fp32` above 1000,
    a float16 accumulator 5.9 on huggy-arch's 512-wide layers.
    """

    large: float = 3.0
    """n >= LARGE_N"""
    medium: float = 5.0
    """MEDIUM_N <= n < LARGE_N"""
    small: float = 10.0
    """n < MEDIUM_N"""

    LARGE_N = 1000
    MEDIUM_N = 100

    def __post_init__(self) -> None:
        if not 1.0 <= self.large <= self.medium <= self.small:
            raise ValueError(
                f"ratio limits must satisfy 1 <= large <= medium <= small, got {self.large}, {self.medium}, {self.small}"
            )

    def for_size(self, n: int) -> float:
        if n >= self.LARGE_N:
            return self.large
        return self.medium if n >= self.MEDIUM_N else self.small


@dataclass(frozen=True)
class GoldenComparison:
    """A card's output against the golden, beside the CPU's own error in the card's dtype. The
    elementwise measures (max_abs, mean_abs, max_rel, cosine) are the card's against the golden."""

    passed: bool
    n_elements: int
    max_abs: float
    mean_abs: float
    max_rel: float
    cosine: float
    golden_rmse: float
    """RMSE(card - golden)"""
    cpu_golden_rmse: float
    """RMSE(cpu_same - golden): the dtype's own error on this batch"""
    rmse_floor: float
    error_ratio: float
    cpu_golden_max_abs: float
    max_floor: float
    max_ratio: float
    ratio_limit: float
    n_overflow: int
    """Elements not finite on the card where the golden is, all of them where the CPU in the
    card's dtype is not finite either: the dtype's overflow, which the port rule forgives."""
    detail: str

    def over_limit(self) -> float | None:
        """The larger ratio over its limit: 1 is the limit."""
        if not self.ratio_limit:
            return None
        return float(max(self.error_ratio, self.max_ratio) / self.ratio_limit)


def compare_to_golden(
    actual: np.ndarray, cpu_same: np.ndarray, golden: np.ndarray, dtype: str, limits: RatioLimits, *, what: str = "card"
) -> GoldenComparison:
    """`actual` (a card's output) against `golden`, relative to `cpu_same` (the CPU in the card's
    dtype, or another implementation's output when `what` says so). Arrays of one shape; any dtype."""
    act, cpu, gold = (as_float64(np.asarray(x)) for x in (actual, cpu_same, golden))
    if not act.shape == cpu.shape == gold.shape:
        raise ValueError(f"shape mismatch: {act.shape}, {cpu.shape}, golden {gold.shape}")
    n = int(act.size)
    limit = limits.for_size(n)
    scale_rms, scale_max = _rms(gold), max_float(np.abs(gold))
    rmse_floor, max_floor = 0.5 * eps(dtype) * scale_rms, 0.5 * eps(dtype) * scale_max
    m = measure(act, gold)
    card_bad, cpu_bad = _nonfinite(act, gold), _nonfinite(cpu, gold)
    shared = bool(cpu_bad.any()) and not (card_bad & ~cpu_bad).any()
    if shared:
        # The dtype's overflow: both sides are judged where both computed finite values.
        both = ~card_bad & ~cpu_bad
        act_f, cpu_f, gold_f = act[both], cpu[both], gold[both]
    else:
        act_f, cpu_f, gold_f = act, cpu, gold
    golden_rmse, cpu_rmse = _rms(act_f - gold_f), _rms(cpu_f - gold_f)
    cpu_max = max_float(np.abs(cpu_f - gold_f))
    card_max = max_float(np.abs(act_f - gold_f)) if shared else m.max_abs
    error_ratio = _ratio(golden_rmse, cpu_rmse, rmse_floor)
    max_ratio = _ratio(card_max, cpu_max, max_floor)

    reasons = [] if shared else _nonfinite_reasons(act, card_bad, what) + _nonfinite_reasons(cpu, cpu_bad, _CPU_SAME)
    if not reasons:
        if not error_ratio <= limit:
            reasons.append(
                f"error_ratio {error_ratio:.3g} > {limit:g}: RMSE against the float64 golden {golden_rmse:.3g}, "
                f"the CPU's in {dtype} {cpu_rmse:.3g} (floor {rmse_floor:.3g}) over {act_f.size} elements"
            )
        if not max_ratio <= limit:
            idx = np.unravel_index(int(np.nanargmax(np.where(card_bad | cpu_bad, -1.0, np.abs(act - gold)))), act.shape)
            reasons.append(
                f"max_ratio {max_ratio:.3g} > {limit:g}: largest error {card_max:.3g} at "
                f"{format_index(idx)} "
                f"({what} {act[idx]:.9g}, golden {gold[idx]:.9g}), the CPU's largest in {dtype} {cpu_max:.3g} (floor "
                f"{max_floor:.3g})"
            )
    passed = not reasons
    if shared:
        card_n = np.count_nonzero(card_bad)
        mine = f"the {what} in {card_n}, all of them among those" if card_n else f"the {what} in none"
        overflow = (
            f"{dtype} overflows, not the port: the CPU in {dtype} is not finite in {np.count_nonzero(cpu_bad)} of {n} "
            f"elements where the golden is, {mine}"
        )
        reasons.insert(0, overflow)
    return GoldenComparison(
        passed=passed,
        n_elements=n,
        max_abs=m.max_abs,
        mean_abs=m.mean_abs,
        max_rel=m.max_rel,
        cosine=m.cosine,
        golden_rmse=golden_rmse,
        cpu_golden_rmse=cpu_rmse,
        rmse_floor=rmse_floor,
        error_ratio=error_ratio,
        cpu_golden_max_abs=cpu_max,
        max_floor=max_floor,
        max_ratio=max_ratio,
        ratio_limit=limit,
        n_overflow=int(np.count_nonzero(card_bad)) if shared else 0,
        detail="; ".join(reasons),
    )


def row_errors(cpu_same: np.ndarray, golden: np.ndarray, dtype: str) -> np.ndarray:
    """Per row (last axis reduced), the CPU's largest error in the card's dtype, floored at half
    an ULP of the dtype at the row's largest golden value: what a right card may be off by, per row."""
    cpu, gold = as_float64(np.asarray(cpu_same)), as_float64(np.asarray(golden))
    with np.errstate(invalid="ignore"):
        error = np.abs(cpu - gold).max(axis=-1)
        floor = 0.5 * eps(dtype) * np.abs(gold).max(axis=-1)
    return np.fmax(error, floor)


def _rms(x: np.ndarray) -> float:
    if x.size == 0:
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        # Scaled by the largest magnitude first, so huge outputs do not overflow the squares.
        scale = max_float(np.abs(x))
        if not math.isfinite(scale) or scale == 0:
            return scale
        return float(scale * np.sqrt(np.mean(np.square(x / scale))))


def _ratio(error: float, cpu_error: float, floor: float) -> float:
    denominator = max(cpu_error, floor)
    if error == 0:
        return 0.0
    return error / denominator if denominator > 0 else math.inf


def _nonfinite(x: np.ndarray, golden: np.ndarray) -> np.ndarray:
    """Where `x` is NaN or inf and the golden is finite: a result the golden does not have."""
    return np.asarray(~np.isfinite(x) & np.isfinite(golden))


def _nonfinite_reasons(x: np.ndarray, bad: np.ndarray, what: str) -> list[str]:
    if not bad.any():
        return []
    idx = first_index(bad)
    return [
        f"{x[idx]} in the {what}'s output where the golden is finite ({np.count_nonzero(bad)} of {x.size}, first at "
        f"{format_index(idx)})"
    ]
