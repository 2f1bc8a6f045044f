"""The judge on hand-made cases: every check is shown passing and failing."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from harness.judge.compare import (
    TOLERANCES,
    Comparison,
    Tolerance,
    ToleranceComparison,
    compare_bitwise,
    compare_decisions,
    compare_tolerance,
    ulp_distance,
)
from harness.judge.numerics import REL_FLOOR, ULP_NAN

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), np.dtype(np.float16), BF16]
LOOSE = Tolerance(atol=1.0, rtol=0.0, min_cos=-1.0)  # isolates one rule at a time


def arr(values: list[float], dtype: np.dtype) -> np.ndarray:
    return np.array(values, dtype=np.float64).astype(dtype)


def finfo(dtype: np.dtype):
    return ml_dtypes.finfo(dtype) if dtype == BF16 else np.finfo(dtype)


def ulp1(a: float, b: float, dtype: np.dtype) -> int:
    return int(ulp_distance(arr([a], dtype), arr([b], dtype))[0])


def from_bits(bits: list[int], dtype: np.dtype) -> np.ndarray:
    return np.array(bits, dtype=f"u{dtype.itemsize}").view(dtype)


# --- ULP distance ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_signed_zeros_are_zero_ulp_apart_but_not_bitwise_equal(dtype):
    assert ulp1(-0.0, 0.0, dtype) == 0
    c = compare_bitwise(arr([1.0, -0.0], dtype), arr([1.0, 0.0], dtype))
    assert not c.passed and not c.bitwise_equal
    assert (c.n_mismatch, c.max_ulp, c.max_abs) == (1, 0, 0.0)
    assert c.detail.startswith("first mismatch at [1]: a=-0")
    assert "(sign of zero)" in c.detail


def test_signed_zeros_are_counted_among_other_mismatches():
    c = compare_bitwise(arr([-0.0, 1.0, 2.0], np.float32), arr([0.0, 1.0, 3.0], np.float32))
    assert c.n_mismatch == 2
    assert "1 of 2 mismatches differ only in the sign of zero" in c.detail


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_subnormals_and_neighbours_across_zero(dtype):
    tiny = float(finfo(dtype).smallest_subnormal)
    assert ulp1(tiny, 0.0, dtype) == 1
    assert ulp1(tiny, -0.0, dtype) == 1
    assert ulp1(tiny, -tiny, dtype) == 2
    assert ulp1(-tiny, 0.0, dtype) == 1
    assert ulp1(2 * tiny, -tiny, dtype) == 3
    # the largest subnormal and the smallest normal are neighbours too
    smallest_normal = float(finfo(dtype).smallest_normal)
    largest_subnormal = float(np.nextafter(arr([smallest_normal], dtype), arr([0.0], dtype))[0])
    assert ulp1(largest_subnormal, smallest_normal, dtype) == 1


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("value", [1.0, -1.0, 0.1, -3.5, 1e-3, 0.0, -0.0])
def test_nextafter_neighbours_are_one_ulp_apart(dtype, value):
    x = arr([value], dtype)
    up = np.nextafter(x, arr([np.inf], dtype))
    down = np.nextafter(x, arr([-np.inf], dtype))
    assert ulp_distance(x, up)[0] == 1
    assert ulp_distance(down, x)[0] == 1
    assert ulp_distance(down, up)[0] == 2
    # the failing side: a neighbour is not bitwise equal
    assert not compare_bitwise(x, up).passed
    assert compare_bitwise(x, up).max_ulp == 1


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_largest_finite_and_inf_are_neighbours(dtype):
    big = float(finfo(dtype).max)
    assert ulp1(big, np.inf, dtype) == 1
    assert ulp1(-big, -np.inf, dtype) == 1


def test_large_distances_are_exact():
    assert ulp1(1.0, 2.0, np.dtype(np.float32)) == 2**23
    assert ulp1(1.0, 2.0, np.dtype(np.float16)) == 2**10
    assert ulp1(1.0, 2.0, BF16) == 2**7
    big = float(np.finfo(np.float32).max)
    assert ulp1(-big, big, np.dtype(np.float32)) == 2 * 0x7F7FFFFF
    assert ulp1(-np.inf, np.inf, np.dtype(np.float32)) == 2 * 0x7F800000
    assert ulp1(-np.inf, np.inf, np.dtype(np.float16)) == 2 * 0x7C00


def test_float64_distances_beyond_int64_saturate():
    big = float(np.finfo(np.float64).max)
    assert ulp1(-big, big, np.dtype(np.float64)) == ULP_NAN
    assert ulp1(1.0, 2.0, np.dtype(np.float64)) == 2**52


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_with_identical_bits_is_bitwise_equal(dtype):
    nan = arr([1.0, np.nan], dtype)
    assert ulp_distance(nan, nan.copy()).tolist() == [0, 0]
    c = compare_bitwise(nan, nan.copy())
    assert c.passed and c.bitwise_equal and c.detail == ""


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_against_a_number_or_another_nan_is_a_mismatch(dtype):
    assert ulp1(np.nan, 1.0, dtype) == ULP_NAN
    assert ulp1(0.0, np.nan, dtype) == ULP_NAN
    assert ulp1(np.inf, np.nan, dtype) == ULP_NAN
    c = compare_bitwise(arr([0.5, np.nan], dtype), arr([0.5, 1.0], dtype))
    assert not c.passed and c.n_mismatch == 1 and c.max_ulp == ULP_NAN
    assert c.detail.startswith("first mismatch at [1]: a=nan") and c.detail.endswith("(nan)")


def test_nans_with_different_payloads_differ():
    quiet, payload = from_bits([0x7FC00000, 0x7FC00001], np.dtype(np.float32))
    assert ulp_distance(np.array([quiet]), np.array([payload]))[0] == ULP_NAN
    c = compare_bitwise(np.array([quiet]), np.array([payload]))
    assert not c.bitwise_equal
    assert "0x7fc00000" in c.detail and "0x7fc00001" in c.detail


def test_first_mismatch_is_a_multidimensional_index():
    a = np.zeros((2, 3, 4), dtype=np.float32)
    b = a.copy()
    b[1, 2, 3] = np.nextafter(np.float32(0), np.float32(1))
    b[1, 2, 0] = 1.0
    c = compare_bitwise(a, b)
    assert c.n_mismatch == 2 and c.max_ulp == 0x3F800000
    assert c.detail.startswith("first mismatch at [1, 2, 0]: a=0.0 (0x00000000), b=1.0 (0x3f800000)")
    assert c.detail.endswith(f"({0x3F800000} ulp)")


def test_bitwise_keeps_the_measured_errors():
    c = compare_bitwise(arr([1.0, 2.0], np.float32), arr([1.0, 2.5], np.float32))
    assert (c.max_abs, c.mean_abs, c.max_rel) == (0.5, 0.25, 0.2)
    assert not isinstance(c, ToleranceComparison) and c.over_limit() is None, "bit for bit has no threshold to be near"


def test_bitwise_on_strided_views():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert compare_bitwise(a[:, ::2], a.copy()[:, ::2]).passed
    assert not compare_bitwise(a[:, ::2], a[:, 1::2]).passed


# --- integer actions ------------------------------------------------------------------------------


def test_integer_actions_report_the_largest_difference():
    c = compare_bitwise(np.array([[0, 1], [2, 1]]), np.array([[0, 3], [0, 1]]))
    assert not c.passed and c.n_mismatch == 2 and c.max_ulp == 2
    assert c.detail == "first mismatch at [0, 1]: a=1, b=3 (2 ulp)"
    same = compare_bitwise(np.array([0, 1, 1]), np.array([0, 1, 1]))
    assert same.passed and same.max_ulp == 0


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.uint64])
def test_integer_differences_do_not_overflow(dtype):
    info = np.iinfo(dtype)
    lo, hi = np.array([info.min], dtype=dtype), np.array([info.max], dtype=dtype)
    expected = min(int(info.max) - int(info.min), ULP_NAN)
    assert ulp_distance(lo, hi)[0] == expected == ulp_distance(hi, lo)[0]


def test_bool_arrays_compare():
    c = compare_bitwise(np.array([True, False]), np.array([True, True]))
    assert not c.passed and c.max_ulp == 1


# --- refused input --------------------------------------------------------------------------------


def test_shape_and_dtype_mismatches_are_refused():
    with pytest.raises(ValueError, match="shape mismatch"):
        compare_bitwise(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="dtype mismatch"):
        compare_tolerance(np.zeros(3, np.float32), np.zeros(3, np.float64), LOOSE)
    with pytest.raises(ValueError, match="dtype mismatch"):
        ulp_distance(np.zeros(3, np.float16), np.zeros(3, BF16))
    with pytest.raises(ValueError, match="unsupported dtype"):
        compare_bitwise(np.zeros(3, np.complex64), np.zeros(3, np.complex64))
    with pytest.raises(ValueError, match="unsupported dtype"):
        ulp_distance(np.zeros(3, ml_dtypes.float8_e4m3fn), np.zeros(3, ml_dtypes.float8_e4m3fn))


def test_bad_tolerances_are_refused():
    for bad in ({"atol": -1.0}, {"rtol": float("nan")}, {"min_cos": 1.5}):
        with pytest.raises(ValueError):
            Tolerance(**{"atol": 0.0, "rtol": 0.0, "min_cos": 0.0, **bad})


def test_ml_dtypes_is_imported_only_for_bfloat16():
    code = (
        "import sys, numpy as np\n"
        "from harness.judge.compare import compare_bitwise\n"
        "compare_bitwise(np.zeros(2, np.float32), np.zeros(2, np.float32))\n"
        "assert 'ml_dtypes' not in sys.modules, 'ml_dtypes imported for float32'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- tolerance ------------------------------------------------------------------------------------


def test_tolerance_passes_exactly_at_the_bound_and_fails_just_past_it():
    reference = arr([1.0, 2.0], np.float32)
    tol = Tolerance(atol=0.5, rtol=0.25, min_cos=-1.0)  # bound 0.5 + 0.25 * 2 = 1.0, exact in binary
    at_bound = compare_tolerance(arr([1.0, 3.0], np.float32), reference, tol)
    assert at_bound.passed and at_bound.max_abs == 1.0 and at_bound.detail == ""
    past = compare_tolerance(np.nextafter(arr([1.0, 3.0], np.float32), np.float32(4)), reference, tol)
    assert not past.passed
    assert past.detail.startswith("max_abs 1.00000") and "= 1 at [1]" in past.detail
    assert (past.atol, past.rtol, past.min_cos) == (0.5, 0.25, -1.0)


def test_rtol_scales_with_the_largest_reference_magnitude():
    reference = arr([100.0, 0.0], np.float32)
    actual = arr([100.5, 0.5], np.float32)
    assert compare_tolerance(actual, reference, Tolerance(atol=0.0, rtol=0.005, min_cos=-1.0)).passed
    assert not compare_tolerance(actual, reference, Tolerance(atol=0.0, rtol=0.004, min_cos=-1.0)).passed


def test_cosine_fails_while_max_abs_passes():
    # outputs small against atol but wrong in sign: only the cosine rule sees it
    reference = arr([1e-6, -2e-6, 3e-6], np.float32)
    c = compare_tolerance(-reference, reference, TOLERANCES["float32"])
    assert c.max_abs <= 1e-5 and c.cosine == pytest.approx(-1.0)
    assert not c.passed
    assert c.detail.startswith("cosine -1 < min_cos 0.999999") and "max_abs" not in c.detail
    assert compare_tolerance(reference, reference, TOLERANCES["float32"]).passed


def test_max_abs_fails_while_cosine_passes():
    # a scaled output points the same way: only the max_abs rule sees it
    reference = arr([1.0, -2.0, 3.0], np.float32)
    c = compare_tolerance(reference * np.float32(1.01), reference, TOLERANCES["float32"])
    assert c.cosine == pytest.approx(1.0) and not c.passed
    assert c.detail.startswith("max_abs 0.0299999") and "cosine" not in c.detail
    assert "at [2]: actual=3.03" in c.detail


def test_cosine_edge_cases():
    zeros = np.zeros(3, np.float32)
    ones = np.ones(3, np.float32)
    assert compare_tolerance(zeros, zeros.copy(), LOOSE).cosine == 1.0
    assert compare_tolerance(zeros, ones, LOOSE).cosine == 0.0
    assert compare_tolerance(ones, zeros, LOOSE).cosine == 0.0
    huge = arr([3e38, -3e38, 1e-30], np.float32)
    assert compare_tolerance(huge, huge.copy(), LOOSE).cosine == 1.0
    assert compare_tolerance(huge, -huge, LOOSE).cosine == -1.0


def test_max_rel_is_guarded_near_zero():
    reference = arr([1.0, 1e-30, 0.0], np.float32)
    actual = arr([1.0, 1e-7, 1e-7], np.float32)
    c = compare_tolerance(actual, reference, LOOSE)
    assert c.max_rel == pytest.approx(1e-7 / REL_FLOOR, rel=1e-6)
    # against an all-zero reference any error is infinitely relative
    assert compare_tolerance(arr([1e-7], np.float32), arr([0.0], np.float32), LOOSE).max_rel == np.inf


def test_metrics_are_computed_in_float64():
    reference = arr([1.0, 2.0, 4.0], np.float16)
    actual = arr([1.0, 2.001953125, 4.0], np.float16)  # one float16 ulp at 2.0
    c = compare_tolerance(actual, reference, LOOSE)
    assert c.max_abs == 2**-9 and c.mean_abs == 2**-9 / 3 and c.max_ulp == 1


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("side", ["output", "reference"])
def test_nan_and_inf_fail_with_their_reason(bad, side):
    clean = arr([1.0, 2.0, 3.0], np.float32)
    dirty = arr([1.0, bad, 3.0], np.float32)
    actual, reference = (dirty, clean) if side == "output" else (clean, dirty)
    c = compare_tolerance(actual, reference, LOOSE)
    name = "nan" if np.isnan(bad) else "inf"
    assert not c.passed
    assert c.detail == f"{name} in {side} (1 of 3, first at [1])"
    assert compare_tolerance(clean, clean.copy(), LOOSE).passed


def test_identical_infs_still_fail():
    c = compare_tolerance(arr([np.inf, 1.0], np.float32), arr([np.inf, 1.0], np.float32), LOOSE)
    assert not c.passed and c.bitwise_equal
    assert "inf in output" in c.detail and "inf in reference" in c.detail


def test_empty_arrays_are_clean():
    empty = np.zeros((0, 3), np.float32)
    for c in (compare_bitwise(empty, empty), compare_tolerance(empty, empty, TOLERANCES["float32"])):
        assert c.passed and c.n_elements == 0 and c.max_abs == 0.0 and c.cosine == 1.0 and c.detail == ""
    actions = np.zeros(0, np.int64)
    c = compare_decisions(actions, actions, np.zeros((0, 2), np.float32), 0.01)
    assert c.passed and c.n_elements == 0 and c.n_flips == 0 and c.max_flip_margin is None


@pytest.mark.parametrize(("dtype", "observed"), [("float32", 1.1e-6), ("float16", 1.1e-3), ("bfloat16", 1.07e-2)])
def test_default_tolerances_pass_the_observed_precision_and_fail_a_hundred_times_it(dtype, observed):
    reference = np.linspace(-1.0, 1.0, 21)
    tol = TOLERANCES[dtype]
    ok = compare_tolerance(reference + observed, reference, tol)
    assert ok.passed, ok.detail
    bad = compare_tolerance(reference + 100 * observed, reference, tol)
    assert not bad.passed and "max_abs" in bad.detail


def test_bfloat16_default_min_cos_admits_the_observed_cosine():
    assert TOLERANCES["bfloat16"].min_cos <= 0.99999458
    assert set(TOLERANCES) == {"float32", "float16", "bfloat16"}


def test_tolerance_on_bfloat16_arrays():
    reference = arr([0.5, -1.0, 0.25], BF16)
    actual = np.nextafter(reference, arr([2.0, 2.0, 2.0], BF16))
    c = compare_tolerance(actual, reference, TOLERANCES["bfloat16"])
    assert c.passed and c.max_ulp == 1 and not c.bitwise_equal
    assert not compare_tolerance(actual, reference, Tolerance(atol=1e-3, rtol=0.0, min_cos=0.0)).passed


def test_comparison_holds_plain_python_values():
    c = compare_tolerance(arr([1.0], np.float32), arr([1.0], np.float32), TOLERANCES["float32"])
    assert isinstance(c, Comparison)
    for name in ("n_elements", "n_mismatch", "max_ulp"):
        assert type(getattr(c, name)) is int
    for name in ("max_abs", "mean_abs", "max_rel", "cosine"):
        assert type(getattr(c, name)) is float
    assert type(c.passed) is bool and type(c.bitwise_equal) is bool


# --- decisions ------------------------------------------------------------------------------------

LOGITS = np.array([[2.0, 0.0], [1.0, 0.999], [0.0, 3.0], [0.5, 0.5]], np.float32)
REF_ACTIONS = np.array([0, 0, 1, 0])


def test_identical_decisions_pass():
    c = compare_decisions(REF_ACTIONS.copy(), REF_ACTIONS, LOGITS, 0.01)
    assert c.passed and c.bitwise_equal and c.n_flips == 0 and c.n_near_ties == 0
    assert c.detail == "" and c.max_flip_margin is None and c.flip_margin_limit is None


def test_near_tie_flips_are_reported_but_pass():
    actions = np.array([0, 1, 1, 1])  # rows 1 and 3 are (near) ties
    c = compare_decisions(actions, REF_ACTIONS, LOGITS, 0.01)
    assert c.passed and not c.bitwise_equal and (c.n_flips, c.n_near_ties) == (2, 2)
    assert c.detail.startswith("2 near-tie flips within their margin limit, first at [1]: action 1, reference 0")
    # The pair that re-judges the row: the flip nearest to failing, and its limit.
    assert c.max_flip_margin == pytest.approx(0.001, rel=1e-3) and c.flip_margin_limit == 0.01
    # the failing side: the same flips under a tighter margin
    tight = compare_decisions(actions, REF_ACTIONS, LOGITS, 1e-4)
    assert not tight.passed and tight.detail.startswith("1 of 4 decisions flipped beyond their margin limit, first at [1]")
    assert "1 near-tie flips" in tight.detail  # the exact tie in row 3 is still only a near-tie
    assert not tight.max_flip_margin <= tight.flip_margin_limit


def test_each_decision_has_its_own_margin_limit():
    actions = np.array([0, 1, 1, 1])
    limits = np.array([0.0, 1e-4, 0.0, 0.0])  # row 1's flip (margin 0.001) is beyond its own limit
    c = compare_decisions(actions, REF_ACTIONS, LOGITS, limits)
    assert not c.passed and (c.n_flips, c.n_near_ties) == (2, 1)
    assert c.flip_margin_limit == pytest.approx(1e-4) and c.max_flip_margin == pytest.approx(0.001, rel=1e-3)
    assert compare_decisions(actions, REF_ACTIONS, LOGITS, np.array([0.0, 0.002, 0.0, 0.0])).passed


def test_hard_flips_fail():
    actions = np.array([1, 0, 1, 0])  # row 0 flips against a margin of 2
    c = compare_decisions(actions, REF_ACTIONS, LOGITS, 0.01)
    assert not c.passed and (c.n_flips, c.n_near_ties) == (1, 0) and c.max_flip_margin == 2.0
    assert c.detail == (
        "1 of 4 decisions flipped beyond their margin limit, first at [0]: action 1, reference 0 (reference margin 2, "
        "limit 0.01)"
    )
    assert compare_decisions(actions, REF_ACTIONS, LOGITS, 2.0).passed  # the limit is inclusive


def test_decisions_over_a_batch_of_environments():
    logits = np.zeros((2, 3, 4), np.float32)
    logits[..., 2] = 1.0
    ref = np.full((2, 3), 2)
    actions = ref.copy()
    actions[1, 0] = 3
    c = compare_decisions(actions, ref, logits, 0.5)
    assert not c.passed and c.detail.endswith("first at [1, 0]: action 3, reference 2 (reference margin 1, limit 0.5)")


def test_out_of_range_actions_fail_and_bad_references_are_refused():
    c = compare_decisions(np.array([0, 7, 1, 0]), REF_ACTIONS, LOGITS, 0.01)
    assert not c.passed and c.max_flip_margin == np.inf
    assert c.detail == "actions out of range [0, 2) (1 of 4, first at [1]: action 7)"
    with pytest.raises(ValueError, match="ref_actions"):
        compare_decisions(REF_ACTIONS, np.array([0, 0, 2, 0]), LOGITS, 0.01)
    with pytest.raises(ValueError, match="ref_scores"):
        compare_decisions(REF_ACTIONS, REF_ACTIONS, LOGITS[:3], 0.01)
    with pytest.raises(ValueError, match="integer"):
        compare_decisions(REF_ACTIONS.astype(np.float32), REF_ACTIONS.astype(np.float32), LOGITS, 0.01)
    with pytest.raises(ValueError, match="float"):
        compare_decisions(REF_ACTIONS, REF_ACTIONS, LOGITS.astype(np.int64), 0.01)
    with pytest.raises(ValueError, match="margin_limit"):
        compare_decisions(REF_ACTIONS, REF_ACTIONS, LOGITS, -1.0)


def test_nonfinite_reference_scores_fail():
    logits = LOGITS.copy()
    logits[2, 0] = np.nan
    c = compare_decisions(REF_ACTIONS.copy(), REF_ACTIONS, logits, 0.01)
    assert not c.passed and c.detail == "nan in reference scores (1 of 8, first at [2, 0])"
    # a flip against a NaN row is never a quiet near-tie
    flipped = compare_decisions(np.array([0, 0, 0, 0]), REF_ACTIONS, logits, 0.01)
    assert "decisions flipped beyond their margin limit" in flipped.detail
