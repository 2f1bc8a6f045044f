"""Comparison functions: bit for bit, within a tolerance, and decision by decision.

Pure numpy, no torch and no Ray, so results can be judged anywhere, again, under new thresholds.
Each function returns a record that keeps what was measured apart from the thresholds it was
judged by, as Polygraphy does: a `checks` row can be re-judged with SQL without rerunning a card.
Each record's fields are the `checks` columns it fills, and it says how near its limit it came
(`over_limit`); harness/judge/results.py gathers them.

- `compare_bitwise`: two cards must agree bit for bit. ULP distances are counted on a monotonic
  integer line (see `ulp_distance`), so neighbours across zero are 1 or 2 apart and -0.0/+0.0 are
  0 apart yet still a reported mismatch.
- `compare_tolerance`: an output against a reference within a fixed tolerance:
  ``max_abs <= atol + rtol * max|reference|`` (the CartPole port's rule) and
  ``cosine >= min_cos`` (the Huggy port's rule); any NaN or inf fails with that reason.
- `compare_decisions`: discrete actions against the reference's. A flip whose reference margin
  (top-1 score minus the score of the action taken) exceeds its limit fails; flips inside it are
  near-ties, reported but passed.

Whether a port is right is judged against a float64 golden instead: harness/judge/golden.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from harness.judge.numerics import (
    Measures,
    as_float64,
    bits_dtype,
    check_pair,
    first_index,
    format_index,
    format_value,
    max_abs_value,
    max_int,
    measure,
    nonfinite_reasons,
    same_bits,
    ulp_distances,
)


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

    def bound(self, scale: float) -> float:
        """The largest max_abs allowed against a reference whose largest magnitude is `scale`."""
        return self.atol + self.rtol * scale


TOLERANCES: Final[dict[str, Tolerance]] = {
    "float32": Tolerance(atol=1e-5, rtol=1e-5, min_cos=0.999999),
    "float16": Tolerance(atol=1e-2, rtol=1e-3, min_cos=0.9999),
    "bfloat16": Tolerance(atol=5e-2, rtol=2e-2, min_cos=0.999),
}
"""Default tolerance per compute dtype of the card, against the CPU float32 reference. The
`tolerance` check reports it on every floating output; it gates where an output is declared
bounded or the user sets `--tolerance` (see harness/judge/verdicts.py).

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
    """Two outputs compared bit for bit (two cards, a row alone and inside a batch, the timed path
    and the sweep's): passed only when equal, so it has no limit to be near."""

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
    detail: str
    """The first mismatch or the failing reasons, "; "-separated; "" when clean."""

    def over_limit(self) -> float | None:
        return None


@dataclass(frozen=True)
class ToleranceComparison(Comparison):
    """An output against a reference within a fixed tolerance: the elementwise measures beside the
    thresholds the verdict used and the scale the bound is read at."""

    ref_max_abs: float
    """max|reference|, the scale the tolerance bound is read at."""
    atol: float
    rtol: float
    min_cos: float

    @property
    def tolerance(self) -> Tolerance:
        return Tolerance(self.atol, self.rtol, self.min_cos)

    def over_limit(self) -> float:
        """The larger of max_abs over its bound and 1 - cosine over 1 - min_cos: 1 is the limit."""
        bound = self.tolerance.bound(self.ref_max_abs)
        by_abs = self.max_abs / bound if bound > 0 else (0.0 if self.max_abs == 0 else float("inf"))
        slack = 1.0 - self.min_cos
        by_cos = (1.0 - self.cosine) / slack if slack > 0 else 0.0
        return float(max(by_abs, by_cos))


@dataclass(frozen=True)
class DecisionComparison:
    """Discrete actions against the reference's decisions."""

    passed: bool
    bitwise_equal: bool
    n_elements: int
    n_flips: int
    """Decisions that differ from the reference's."""
    n_near_ties: int
    """Flips whose reference margin lies within its limit: reported, passed."""
    max_flip_margin: float | None
    """The reference margin of the flip nearest to failing (largest margin over its limit); None without flips."""
    flip_margin_limit: float | None
    """That flip's limit: the row passes when max_flip_margin <= flip_margin_limit."""
    detail: str

    def over_limit(self) -> float:
        """The flip nearest to failing, its margin over its limit: 0 without flips."""
        if not self.n_flips or self.max_flip_margin is None:
            return 0.0
        limit = self.flip_margin_limit
        return float(self.max_flip_margin / limit) if limit else float("inf")


@dataclass(frozen=True)
class EpisodeComparison:
    """Episodes of one unit on a card against the same episodes on card 0, bit for bit: no limit."""

    passed: bool
    n_elements: int
    episode_seed: int | None
    """The first episode whose trajectory parts from the other's; None when none does."""
    first_divergent_step: int | None
    detail: str

    def over_limit(self) -> float | None:
        return None


@dataclass(frozen=True)
class MaskComparison:
    """A masked policy's actions against the masks they were chosen under: none masked, no limit."""

    passed: bool
    n_elements: int
    n_illegal: int
    """Actions chosen that their mask forbids."""
    detail: str

    def over_limit(self) -> float | None:
        return None


def compare_masks(actions: np.ndarray, masks: np.ndarray) -> MaskComparison:
    """Discrete actions (rows,) against bool masks (rows, actions): each action one its row allows."""
    actions, masks = np.asarray(actions), np.asarray(masks, dtype=bool)
    if actions.shape != masks.shape[:-1] or masks.ndim != actions.ndim + 1:
        raise ValueError(f"masks must have shape actions.shape + (n_actions,), got {masks.shape} for {actions.shape}")
    in_range = (actions >= 0) & (actions < masks.shape[-1])
    allowed = np.take_along_axis(masks, np.where(in_range, actions, 0)[..., None], axis=-1)[..., 0] & in_range
    illegal = int(np.count_nonzero(~allowed))
    detail = ""
    if illegal:
        idx = first_index(~allowed)
        legal = np.flatnonzero(masks[idx]).tolist()
        detail = (
            f"{illegal} of {actions.size} actions masked, first at {format_index(idx)}: action {actions[idx]}, legal {legal}"
        )
    return MaskComparison(passed=not illegal, n_elements=int(actions.size), n_illegal=illegal, detail=detail)


def by_branch(values: np.ndarray, branches: tuple[int, ...], fill: float | bool) -> np.ndarray:
    """A multi-discrete policy's per-action values (scores, masks), (..., sum(branches)), as
    (..., branches, max(branches)): each branch's own row, `fill` past its last action. Its
    per-branch actions (..., branches) then compare with `compare_decisions` and `compare_masks`
    as one discrete action does: pad scores with a finite value below any (an action past its
    branch is no near-tie) and masks with False (nor legal)."""
    values = np.asarray(values)
    if values.shape[-1] != sum(branches):
        raise ValueError(f"values of {values.shape[-1]} actions do not split into branches {list(branches)}")
    out = np.full((*values.shape[:-1], len(branches), max(branches)), fill, dtype=values.dtype)
    for i, part in enumerate(np.split(values, np.cumsum(branches)[:-1], axis=-1)):
        out[..., i, : part.shape[-1]] = part
    return out


def masked_in_episodes(illegal: list[int], seeds: list[int]) -> MaskComparison:
    """Episodes' counts of actions their environment's action_masks() did not allow (the episodes
    record them as they play, `EpisodeOutput.illegal`): none in any."""
    total = int(sum(illegal))
    first = next((seed for seed, n in zip(seeds, illegal, strict=True) if n), None)
    parted = sum(1 for n in illegal if n)
    detail = f"{total} masked actions chosen in {parted} of {len(seeds)} episodes; seed {first} first" if total else ""
    return MaskComparison(passed=not total, n_elements=len(seeds), n_illegal=total, detail=detail)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-element distance in units in the last place, as int64.

    Float bits are mapped onto a monotonic integer line (the magnitude bits, negated for a set
    sign bit), so adjacent floats are 1 apart everywhere, the smallest subnormals of either sign
    are 2 apart, and -0.0 and +0.0 are 0 apart. The largest finite value and inf are 1 apart.
    NaN against anything with other bits is `ULP_NAN`; NaNs with identical bits are 0 apart.
    Integer arrays (actions) give the absolute difference. Distances saturate at `ULP_NAN`.
    """
    a, b = np.asarray(a), np.asarray(b)
    check_pair(a, b)
    return ulp_distances(a, b)


def compare_bitwise(a: np.ndarray, b: np.ndarray) -> Comparison:
    """Two outputs that must be identical (two cards, same input): passes only when bitwise equal."""
    a, b = np.asarray(a), np.asarray(b)
    check_pair(a, b)
    same = same_bits(a, b)
    ulp = ulp_distances(a, b)
    equal = bool(same.all())
    detail = "" if equal else _first_mismatch(a, b, same, ulp)
    return _comparison(a, same, ulp, measure(as_float64(a), as_float64(b)), equal, detail)


def compare_tolerance(actual: np.ndarray, reference: np.ndarray, tol: Tolerance) -> ToleranceComparison:
    """An output against a reference: within `tol`, and free of NaN and inf."""
    actual, reference = np.asarray(actual), np.asarray(reference)
    check_pair(actual, reference)
    same = same_bits(actual, reference)
    act64, ref64 = as_float64(actual), as_float64(reference)
    m = measure(act64, ref64)
    scale = max_abs_value(ref64)

    reasons = nonfinite_reasons(act64, "output") + nonfinite_reasons(ref64, "reference")
    if not reasons:
        bound = tol.bound(scale)
        if not m.max_abs <= bound:
            reasons.append(_max_abs_reason(actual, reference, m.max_abs, tol, bound))
        if not m.cosine >= tol.min_cos:
            reasons.append(f"cosine {m.cosine:.9g} < min_cos {tol.min_cos:g}")

    c = _comparison(actual, same, ulp_distances(actual, reference), m, not reasons, "; ".join(reasons))
    return ToleranceComparison(
        passed=c.passed,
        bitwise_equal=c.bitwise_equal,
        n_elements=c.n_elements,
        n_mismatch=c.n_mismatch,
        max_ulp=c.max_ulp,
        max_abs=c.max_abs,
        mean_abs=c.mean_abs,
        max_rel=c.max_rel,
        cosine=c.cosine,
        detail=c.detail,
        ref_max_abs=scale,
        atol=tol.atol,
        rtol=tol.rtol,
        min_cos=tol.min_cos,
    )


def _comparison(a: np.ndarray, same: np.ndarray, ulp: np.ndarray, m: Measures, passed: bool, detail: str) -> Comparison:
    """What was measured element by element, with the verdict."""
    return Comparison(
        passed=passed,
        bitwise_equal=bool(same.all()),
        n_elements=int(a.size),
        n_mismatch=int(np.count_nonzero(~same)),
        max_ulp=max_int(ulp),
        max_abs=m.max_abs,
        mean_abs=m.mean_abs,
        max_rel=m.max_rel,
        cosine=m.cosine,
        detail=detail,
    )


def compare_decisions(
    actions: np.ndarray, ref_actions: np.ndarray, ref_scores: np.ndarray, margin_limit: float | np.ndarray
) -> DecisionComparison:
    """Discrete actions against the reference's, judged by how close the reference was to a tie.

    `ref_scores` has the shape of `actions` plus one trailing axis: the reference's logits (plus
    the Gumbel noise, for sampled actions). A flip's margin is the reference's top score minus
    its score for the action the card took. Flips with a margin above `margin_limit` (one number,
    or one per decision) fail; the rest are near-ties, reported in the detail but passed.
    """
    actions, ref_actions, ref_scores = (np.asarray(x) for x in (actions, ref_actions, ref_scores))
    check_pair(actions, ref_actions)
    if actions.dtype.kind not in "iu":
        raise ValueError(f"actions must be an integer array, got {actions.dtype}")
    if ref_scores.shape[:-1] != actions.shape or ref_scores.ndim != actions.ndim + 1 or ref_scores.shape[-1] == 0:
        raise ValueError(
            f"ref_scores must have shape actions.shape + (n_actions,) = {actions.shape} + (k,), got {ref_scores.shape}"
        )
    if bits_dtype(ref_scores.dtype) is None:
        raise ValueError(f"ref_scores must be a float array, got {ref_scores.dtype}")
    limit = np.broadcast_to(np.asarray(margin_limit, dtype=np.float64), actions.shape)
    if not (limit >= 0).all():
        raise ValueError(f"margin_limit must be >= 0, got {np.min(limit)}")
    scores = as_float64(ref_scores)
    n_actions = scores.shape[-1]
    ref_in_range = (ref_actions >= 0) & (ref_actions < n_actions)
    if not ref_in_range.all():
        raise ValueError(f"ref_actions must lie in [0, {n_actions}), got {ref_actions[~ref_in_range][0]}")

    same = same_bits(actions, ref_actions)
    in_range = (actions >= 0) & (actions < n_actions)
    taken = np.take_along_axis(scores, np.where(in_range, actions, 0)[..., None], axis=-1)[..., 0]
    with np.errstate(invalid="ignore"):
        # An action the policy cannot have taken is as far from a tie as it gets.
        margin = np.where(in_range, scores.max(axis=-1) - taken, np.inf)
    # `not <=` so that a NaN margin is a hard flip, never a quiet near-tie.
    hard = ~same & ~(margin <= limit)
    near_tie = ~same & ~hard

    reasons = nonfinite_reasons(scores, "reference scores")
    if not in_range.all():
        idx = first_index(~in_range)
        reasons.append(
            f"actions out of range [0, {n_actions}) ({np.count_nonzero(~in_range)} of {actions.size}, "
            f"first at {format_index(idx)}: action {actions[idx]})"
        )
    if (hard & in_range).any():
        reasons.append(
            f"{np.count_nonzero(hard & in_range)} of {actions.size} decisions flipped beyond their margin limit, "
            + _describe_flip(actions, ref_actions, margin, limit, hard & in_range)
        )
    notes = []
    if near_tie.any():
        notes.append(
            f"{np.count_nonzero(near_tie)} near-tie flips within their margin limit, "
            + _describe_flip(actions, ref_actions, margin, limit, near_tie)
        )
    worst_margin, worst_limit = _nearest_to_failing(margin, limit, ~same)
    return DecisionComparison(
        passed=not reasons,
        bitwise_equal=not (~same).any(),
        n_elements=int(actions.size),
        n_flips=int(np.count_nonzero(~same)),
        n_near_ties=int(np.count_nonzero(near_tie)),
        max_flip_margin=worst_margin,
        flip_margin_limit=worst_limit,
        detail="; ".join(reasons + notes),
    )


def _nearest_to_failing(margin: np.ndarray, limit: np.ndarray, flipped: np.ndarray) -> tuple[float | None, float | None]:
    """The flip with the largest margin over its limit, so that one pair re-judges the row."""
    if not flipped.any():
        return None, None
    m, lim = margin[flipped], limit[flipped]
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.where(m <= lim, np.where(lim > 0, m / lim, 0.0), np.inf)
    worst = int(np.argmax(np.where(np.isnan(m), np.inf, over)))
    return float(m[worst]), float(lim[worst])


# --- details ------------------------------------------------------------------------------------


def _first_mismatch(a: np.ndarray, b: np.ndarray, same: np.ndarray, ulp: np.ndarray) -> str:
    idx = first_index(~same)
    signed_zeros = ~same & (ulp == 0)
    if signed_zeros[idx]:
        why = "sign of zero"
    elif np.isnan(float(a[idx])) or np.isnan(float(b[idx])):
        why = "nan"
    else:
        why = f"{int(ulp[idx])} ulp"
    text = f"first mismatch at {format_index(idx)}: a={format_value(a, idx)}, b={format_value(b, idx)} ({why})"
    n_signed_zeros, n_mismatch = int(np.count_nonzero(signed_zeros)), int(np.count_nonzero(~same))
    if n_signed_zeros and n_mismatch > 1:
        text += f"; {n_signed_zeros} of {n_mismatch} mismatches differ only in the sign of zero"
    return text


def _max_abs_reason(actual: np.ndarray, reference: np.ndarray, max_abs: float, tol: Tolerance, bound: float) -> str:
    """Why max_abs failed, with the worst element shown in its own dtype's shortest form."""
    act64, ref64 = as_float64(actual), as_float64(reference)
    idx = np.unravel_index(int(np.argmax(np.abs(act64 - ref64))), actual.shape)
    return (
        f"max_abs {max_abs:.9g} > atol {tol.atol:g} + rtol {tol.rtol:g} * max|ref| "
        f"{max_abs_value(ref64):.9g} = {bound:.9g} at {format_index(idx)}: "
        f"actual={actual[idx]!s}, reference={reference[idx]!s}"
    )


def _describe_flip(
    actions: np.ndarray, ref_actions: np.ndarray, margin: np.ndarray, limit: np.ndarray, mask: np.ndarray
) -> str:
    idx = first_index(mask)
    return (
        f"first at {format_index(idx)}: action {actions[idx]}, reference {ref_actions[idx]} "
        f"(reference margin {margin[idx]:.6g}, limit {limit[idx]:.6g})"
    )
