"""The port rule on hand-built arrays: a card's error against a float64 golden over the CPU's own
error in the card's dtype. Shown passing for honest rounding and failing for each defect it exists for."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from harness.judge.golden import RatioLimits, compare_to_golden, eps, row_errors
from harness.policies import cast_policy, load_policy

LIMITS = RatioLimits()


def golden_and_rounded(n: int, dtype: type, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    golden = np.random.default_rng(seed).standard_normal(n) * 3.0
    return golden, golden.astype(dtype).astype(np.float64)


def test_a_card_that_rounds_like_the_cpu_passes_with_a_ratio_of_one():
    golden, rounded = golden_and_rounded(4096, np.float16)
    c = compare_to_golden(rounded, rounded, golden, "float16", LIMITS)
    assert c.passed and c.error_ratio <= 1.0 and c.max_ratio <= 1.0 and c.ratio_limit == 3.0
    assert c.golden_rmse == c.cpu_golden_rmse > 0 and c.n_elements == 4096


def test_a_card_rounding_to_10_bits_in_float32_fails_by_more_than_a_hundred():
    golden, float32 = golden_and_rounded(4096, np.float32)
    _, ten_bits = golden_and_rounded(4096, np.float16)  # float16 keeps 10 mantissa bits, as TF32 does
    c = compare_to_golden(ten_bits, float32, golden, "float32", LIMITS)
    assert not c.passed and c.error_ratio > 100 and c.max_ratio > 100
    assert c.detail.startswith("error_ratio ") and "max_ratio" in c.detail


def test_the_floor_keeps_an_exact_cpu_from_making_any_rounding_infinite():
    golden = np.array([1.0, 2.0, 3.0])  # exactly representable: the CPU's float16 error is 0
    card = golden + np.array([2.0**-11, 0.0, 0.0])  # half an ULP of float16 at 1.0
    c = compare_to_golden(card, golden, golden, "float16", LIMITS)
    assert c.cpu_golden_rmse == 0 and c.rmse_floor == pytest.approx(0.5 * eps("float16") * np.sqrt(14 / 3))
    assert c.passed and np.isfinite(c.error_ratio)
    assert not compare_to_golden(golden + 0.1, golden, golden, "float16", LIMITS).passed


def test_one_bad_element_diluted_in_the_rmse_is_caught_by_the_max_ratio():
    golden, rounded = golden_and_rounded(100_000, np.float16)
    broken = rounded.copy()
    broken[-1] += 0.05  # an edge row's defect, common to every card: cross_card cannot see it
    c = compare_to_golden(broken, rounded, golden, "float16", LIMITS)
    assert c.error_ratio < c.ratio_limit < c.max_ratio
    assert not c.passed and c.detail.startswith("max_ratio") and "at [99999]" in c.detail


def test_the_limit_grows_as_the_elements_shrink():
    assert [LIMITS.for_size(n) for n in (1, 99, 100, 999, 1000, 10**6)] == [10.0, 10.0, 5.0, 5.0, 3.0, 3.0]
    golden = np.array([1.0, -2.0, 0.5, 4.0, -1.0, 2.0, 3.0, -0.5])  # exact in float16: the floor is the CPU's error
    floor = 0.5 * eps("float16") * np.sqrt(np.mean(golden**2))
    card = golden + 6 * floor  # error_ratio 6: within 10 for 8 elements, not within 3
    c = compare_to_golden(card, golden, golden, "float16", LIMITS)
    assert c.passed and c.error_ratio == pytest.approx(6.0) and c.ratio_limit == 10.0
    assert not compare_to_golden(card, golden, golden, "float16", RatioLimits(3.0, 3.0, 3.0)).passed
    with pytest.raises(ValueError, match="ratio limits"):
        RatioLimits(5.0, 3.0, 10.0)


def test_nan_or_inf_where_the_golden_is_finite_fails_with_the_reason():
    golden, rounded = golden_and_rounded(16, np.float16)
    card = rounded.copy()
    card[3] = np.nan
    c = compare_to_golden(card, rounded, golden, "float16", LIMITS)
    assert not c.passed and c.detail.startswith("nan in the card's output where the golden is finite (1 of 16, first at [3])")
    card[3] = np.inf
    assert "inf in the card's output" in compare_to_golden(card, rounded, golden, "float16", LIMITS).detail


def test_bfloat16_and_the_reduced_float32_labels_have_their_widths():
    assert eps("bfloat16") == 2.0**-7 and eps("float32-tf32") == eps("float32-hf32") == 2.0**-10
    golden = np.random.default_rng(1).standard_normal(4096)
    rounded = golden.astype(ml_dtypes.bfloat16).astype(np.float64)
    assert compare_to_golden(rounded, rounded, golden, "bfloat16", LIMITS).passed
    with pytest.raises(ValueError, match="no mantissa width"):
        eps("float8")


def test_row_errors_are_floored_per_row():
    golden = np.array([[4.0, 0.0], [1.0 + 2**-20, 2.0]])
    cpu = golden.astype(np.float16).astype(np.float64)
    errors = row_errors(cpu, golden, "float16")
    assert errors[0] == 0.5 * eps("float16") * 4.0  # exact row: the floor at its scale
    assert errors[1] == pytest.approx(max(2**-20, 0.5 * eps("float16") * 2.0))


def test_the_golden_is_float64_end_to_end():
    policy = load_policy("huggy-arch")
    golden = cast_policy(policy, "float64")
    out = golden(torch.zeros(3, 59))
    assert out.dtype == torch.float64 and golden.compute_dtype == golden.io_dtype == torch.float64
    assert {b.dtype for b in golden.buffers()} == {torch.float64}, "the normalizer computes in float64 too"
    assert policy.head.weight.dtype == torch.float32, "the float32 original is untouched"
