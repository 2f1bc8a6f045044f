"""Properties of the judge over arbitrary bit patterns: NaN payloads, infs, subnormals, huge values."""

from __future__ import annotations

from dataclasses import astuple

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.judge.compare import (
    Tolerance,
    compare_bitwise,
    compare_decisions,
    compare_tolerance,
    ulp_distance,
)
from harness.judge.numerics import ULP_NAN, Measures, _measure, measure

FLOATS = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
SETTINGS = settings(max_examples=100, deadline=None)


@st.composite
def bit_arrays(draw, n_arrays: int = 2, dtype: np.dtype | None = None) -> tuple[np.ndarray, ...]:
    """Arrays of one shape whose elements are any bit pattern of the dtype, biased towards the
    interesting ones (zeros, subnormals, the largest values, infs, NaNs) by mixing in copies."""
    dtype = dtype or draw(st.sampled_from(FLOATS))
    width = 8 * dtype.itemsize
    size = draw(st.integers(0, 12))
    pool = draw(st.lists(st.integers(0, 2**width - 1), min_size=1, max_size=6))
    special = [
        0,
        1,
        2 ** (width - 1),
        2 ** (width - 1) + 1,
        *(int(np.array(v, dtype=dtype).view(f"u{dtype.itemsize}")) for v in (np.inf, -np.inf, np.nan)),
    ]
    element = st.one_of(st.integers(0, 2**width - 1), st.sampled_from(pool), st.sampled_from(special))
    return tuple(
        np.array(draw(st.lists(element, min_size=size, max_size=size)), dtype=f"u{dtype.itemsize}").view(dtype)
        for _ in range(n_arrays)
    )


def is_nan(x: np.ndarray) -> np.ndarray:
    return np.isnan(x.astype(np.float64))


@SETTINGS
@given(bit_arrays())
def test_ulp_distance_is_symmetric_and_non_negative(pair):
    a, b = pair
    d = ulp_distance(a, b)
    assert d.dtype == np.int64 and d.shape == a.shape
    assert (d >= 0).all()
    assert (d == ulp_distance(b, a)).all()


@SETTINGS
@given(bit_arrays())
def test_ulp_distance_is_zero_exactly_for_equal_bits_or_signed_zeros(pair):
    a, b = pair
    bits = f"u{a.dtype.itemsize}"
    same_bits = a.view(bits) == b.view(bits)
    signed_zeros = (a.astype(np.float64) == 0) & (b.astype(np.float64) == 0)
    assert ((ulp_distance(a, b) == 0) == (same_bits | signed_zeros)).all()
    c = compare_bitwise(a, b)
    assert c.bitwise_equal == c.passed == bool(same_bits.all())
    assert c.n_mismatch == int((~same_bits).sum())
    assert (c.detail == "") == c.bitwise_equal


@SETTINGS
@given(bit_arrays())
def test_nan_against_other_bits_is_the_sentinel(pair):
    a, b = pair
    bits = f"u{a.dtype.itemsize}"
    involved = (is_nan(a) | is_nan(b)) & (a.view(bits) != b.view(bits))
    assert (ulp_distance(a, b)[involved] == ULP_NAN).all()
    assert (ulp_distance(a, b)[~involved] < ULP_NAN).all()


@SETTINGS
@given(bit_arrays(n_arrays=1))
def test_ulp_distance_adds_up_along_the_sorted_float_line(arrays):
    (x,) = arrays
    line = x[~is_nan(x)]
    line = line[np.argsort(line.astype(np.float64), kind="stable")]
    if line.size < 2:
        return
    steps = ulp_distance(line[:-1], line[1:])
    from_first = ulp_distance(np.repeat(line[:1], line.size), line)
    # monotone: farther along the line is never closer, and the steps add up exactly
    assert (np.diff(from_first) >= 0).all()
    assert (np.cumsum(steps) == from_first[1:]).all()


@SETTINGS
@given(bit_arrays(n_arrays=1))
def test_nextafter_is_one_ulp_away(arrays):
    (x,) = arrays
    x = x[np.isfinite(x.astype(np.float64))]
    up = np.nextafter(x, np.full_like(x, np.inf))
    assert (ulp_distance(x, up) == 1).all()


@st.composite
def tolerance_pairs(draw) -> tuple[Tolerance, Tolerance]:
    """A tolerance and a looser one, on the scale of the noise in `nearby_arrays`."""
    atol, rtol = draw(st.floats(0, 1e-2)), draw(st.floats(0, 1e-3))
    min_cos = draw(st.floats(0.999, 1))
    looser = Tolerance(
        atol=atol + draw(st.floats(0, 1e-2)),
        rtol=rtol + draw(st.floats(0, 1e-3)),
        min_cos=draw(st.floats(0.99, min_cos)),
    )
    return Tolerance(atol, rtol, min_cos), looser


@st.composite
def nearby_arrays(draw) -> tuple[np.ndarray, np.ndarray]:
    """A reference and an output that is often, but not always, close to it."""
    dtype = draw(st.sampled_from(FLOATS))
    size = draw(st.integers(1, 10))
    values = st.floats(-10, 10, allow_nan=False)
    reference = np.array(draw(st.lists(values, min_size=size, max_size=size)))
    noise = np.array(draw(st.lists(st.floats(-1, 1), min_size=size, max_size=size)))
    scale = draw(st.sampled_from([0.0, 1e-6, 1e-4, 1e-3, 1e-2, 1e-1]))
    return (reference + scale * noise).astype(dtype), reference.astype(dtype)


@SETTINGS
@given(nearby_arrays(), tolerance_pairs())
def test_tolerance_is_monotone(arrays, tols):
    actual, reference = arrays
    tight, loose = tols
    if compare_tolerance(actual, reference, tight).passed:
        assert compare_tolerance(actual, reference, loose).passed


@SETTINGS
@given(bit_arrays(), st.floats(0, 1e3), st.floats(0, 1), st.floats(-1, 1))
def test_hostile_values_are_flagged_never_a_crash(pair, atol, rtol, min_cos):
    actual, reference = pair
    c = compare_tolerance(actual, reference, Tolerance(atol, rtol, min_cos))
    act64, ref64 = actual.astype(np.float64), reference.astype(np.float64)
    for x, side in ((act64, "output"), (ref64, "reference")):
        if np.isnan(x).any():
            assert not c.passed and f"nan in {side}" in c.detail
        if np.isinf(x).any():
            assert not c.passed and f"inf in {side}" in c.detail
    if not c.passed:
        assert c.detail
    for value in (c.max_abs, c.mean_abs, c.max_rel):
        assert np.isnan(value) or value >= 0
    assert np.isnan(c.cosine) or -1 <= c.cosine <= 1
    assert c.max_ulp == int(ulp_distance(actual, reference).max(initial=0))


@SETTINGS
@given(bit_arrays(dtype=np.dtype(np.float32)), st.data())
def test_decisions_on_hostile_logits_never_crash(pair, data):
    logits = np.stack(pair, axis=-1)  # (n, 2) logits from any bit patterns
    n = logits.shape[0]
    ref_actions = np.array(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), dtype=np.int64)
    actions = np.array(data.draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n)), dtype=np.int64)
    margin_tol = data.draw(st.floats(0, 10))
    c = compare_decisions(actions, ref_actions, logits, margin_tol)
    if not np.isfinite(logits).all():
        assert not c.passed
    if ((actions < 0) | (actions > 1)).any():
        assert not c.passed and "out of range" in c.detail
    assert c.n_flips == int((actions != ref_actions).sum())
    assert (c.n_flips == 0) == c.bitwise_equal
    assert c.n_near_ties <= c.n_flips
    if c.n_flips:
        # The recorded pair re-judges the row.
        assert c.passed == (c.max_flip_margin <= c.flip_margin_limit) or not np.isfinite(logits).all()


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int64])
@SETTINGS
@given(data=st.data())
def test_integer_distance_is_the_absolute_difference(dtype, data):
    info = np.iinfo(dtype)
    values = st.integers(int(info.min), int(info.max))
    n = data.draw(st.integers(0, 8))
    a = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), dtype=dtype)
    b = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), dtype=dtype)
    expected = [min(abs(int(x) - int(y)), ULP_NAN) for x, y in zip(a, b, strict=True)]
    assert ulp_distance(a, b).tolist() == expected


@SETTINGS
@given(bit_arrays(n_arrays=1), st.booleans())
def test_equal_arrays_measure_as_the_full_computation_does(arrays, flip_zero_signs):
    """`measure` skips the arithmetic for equal finite values: what it returns instead must be,
    bit for bit, what the arithmetic gives (NaN, inf and signed zeros included)."""
    (a,) = arrays
    x = a.astype(np.float64)
    y = np.where(x == 0, -x, x) if flip_zero_signs else x.copy()

    def bits(m: Measures) -> list[bytes]:
        return [np.float64(v).tobytes() for v in astuple(m)]

    assert bits(measure(x, y)) == bits(_measure(x, y))
