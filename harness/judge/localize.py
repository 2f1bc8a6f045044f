"""Say where it broke: the first layer whose activations part, as msprobe's first-diverging-API
analysis does on Ascend. The judging half, pure numpy: `harness.inference.capture` records every
layer's output inside each actor; this walks two captures of the same input in execution order
and returns the first layer that fails the check, with the measured comparison.

Two cards must agree bit for bit at every layer, so the first layer that differs is where they
part. Against the CPU float32 reference a float16 or bfloat16 card drifts at every layer by
design; the first layer beyond tolerance is reported together with each layer's error and its
growth over the previous layer's, so a reader can tell a steady drift from one layer that blows
up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from harness.judge.compare import Comparison, Tolerance, compare_bitwise, compare_tolerance


@dataclass(frozen=True)
class LayerError:
    """How far one layer of a card is from the reference, in the terms the tolerance rule uses."""

    layer: str
    rel_error: float
    """max_abs / max|reference|: the layer's error against its own scale (NaN if non-finite)."""
    growth: float | None
    """rel_error over the previous layer's; None for the first layer or after an exact one."""


@dataclass(frozen=True)
class Divergence:
    """The first layer that fails the check, and what was measured there."""

    layer: str
    module: str
    """E.g. "Linear(4, 64)"; "" when the caller gave no `modules`."""
    index: tuple[int, ...]
    """First element that fails: differing bits (bitwise), beyond the bound or non-finite (tolerance)."""
    comparison: Comparison
    layers_checked: int
    """Layers compared up to and including this one; 1 means its input was the observations."""
    errors: tuple[LayerError, ...] = ()
    """Tolerance mode only: every layer checked, in order, this one last."""

    def describe(self) -> str:
        """One line for `checks.detail` and the report."""
        where = f"{self.layer} {self.module}" if self.module else self.layer
        parts = [f"first divergent layer: {where} ({self.comparison.detail})"]
        if self.comparison.atol is None:
            parts.append(
                f"{self.comparison.n_mismatch} of {self.comparison.n_elements} elements differ, "
                f"max {self.comparison.max_ulp} ulp"
            )
        parts.append(self._input_note())
        if self.errors:
            parts.append("error/max|ref| by layer: " + ", ".join(_format_error(e) for e in self.errors))
        return "; ".join(parts)

    def _input_note(self) -> str:
        if self.layers_checked == 1:
            return "input: the observations"
        # Bitwise mode only gets here past layers that agreed bit for bit.
        if not self.errors or self.errors[-2].rel_error == 0:
            return "inputs identical"
        return "input within tolerance"


def first_divergent_layer(
    acts: Mapping[str, np.ndarray],
    ref: Mapping[str, np.ndarray],
    tol: Tolerance | None,
    *,
    modules: Mapping[str, str] | None = None,
) -> Divergence | None:
    """The first layer of `acts` that fails against `ref`, or None when every layer agrees.

    `tol` None: bit for bit (two cards). A `Tolerance`: card against the CPU float32 reference.
    Both captures must come from the same architecture; anything else is a harness bug and
    raises ValueError rather than localizing a mismatch that is not there.
    """
    if list(acts) != list(ref):
        raise ValueError(f"the captures hold different layers: {list(acts)} vs {list(ref)}")
    errors: list[LayerError] = []
    for checked, layer in enumerate(acts, start=1):
        a, r = acts[layer], ref[layer]
        if tol is None:
            comparison = compare_bitwise(a, r)
        else:
            comparison = compare_tolerance(a, r, tol)
            errors.append(layer_error(layer, a, r, errors[-1] if errors else None))
        if not comparison.passed:
            return Divergence(
                layer=layer,
                module=(modules or {}).get(layer, ""),
                index=_failing_index(a, r, tol),
                comparison=comparison,
                layers_checked=checked,
                errors=tuple(errors),
            )
    return None


def layer_error(layer: str, actual: np.ndarray, reference: np.ndarray, previous: LayerError | None) -> LayerError:
    """The layer's error relative to its scale, and its growth over the previous layer's."""
    a64, r64 = actual.astype(np.float64), reference.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        # max() propagates NaN, so a layer with NaN or inf reports NaN, never a small number.
        max_abs = float(np.abs(a64 - r64).max(initial=0.0))
        scale = float(np.abs(r64).max(initial=0.0))
    if max_abs == 0:
        rel = 0.0
    elif scale == 0:
        rel = float("inf")
    else:
        rel = max_abs / scale
    # A ratio over an exact layer says nothing: the drift starts here.
    growth = rel / previous.rel_error if previous is not None and previous.rel_error > 0 else None
    return LayerError(layer, rel, growth)


def _failing_index(a: np.ndarray, r: np.ndarray, tol: Tolerance | None) -> tuple[int, ...]:
    differ = _differing_bits(a, r)
    if tol is None:
        return _first_index(differ)
    a64, r64 = a.astype(np.float64), r.astype(np.float64)
    finite_ref = np.abs(r64[np.isfinite(r64)])
    bound = tol.atol + tol.rtol * float(finite_ref.max(initial=0.0))
    with np.errstate(invalid="ignore", over="ignore"):
        # `not <=` so NaN counts as beyond; inf on either side fails compare_tolerance too.
        beyond = ~np.isfinite(a64) | ~np.isfinite(r64) | ~(np.abs(a64 - r64) <= bound)
    # A layer failing on cosine alone has no element beyond the bound: point at the first change.
    return _first_index(beyond if beyond.any() else differ)


def _differing_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    bits = np.dtype(f"u{a.dtype.itemsize}")
    return np.ascontiguousarray(a).view(bits) != np.ascontiguousarray(b).view(bits)


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
    hits = np.flatnonzero(mask)
    if hits.size == 0:
        return ()
    return tuple(int(i) for i in np.unravel_index(int(hits[0]), mask.shape))


def _format_error(e: LayerError) -> str:
    text = f"{e.layer} {e.rel_error:.3g}"
    return text if e.growth is None else f"{text} (x{e.growth:.3g})"
