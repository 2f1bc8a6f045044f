"""Say where it broke: the first layer whose activations part, as msprobe's first-diverging-API
analysis does on Ascend. The judging half, pure numpy: `harness.inference.capture` records every
layer's output inside each actor; this walks captures of the same input in execution order and
returns the first layer that fails, with what was measured there.

Two cards must agree bit for bit at every layer, so the first layer that differs is where they
part (`first_divergent_layer`). A card that fails the port rule is walked the same way against
the golden: each layer's error against the float64 golden over the CPU's own error in the card's
dtype (`first_layer_off_golden`), every layer's ratio reported with its growth over the previous
one, so a reader can tell a steady drift from one layer that blows up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from harness.judge.compare import Comparison, compare_bitwise
from harness.judge.golden import GoldenComparison, RatioLimits, compare_to_golden
from harness.judge.numerics import as_float64, first_index, same_bits


# How `Divergence.describe` names the layer, and the reader of it (`named_layer`), side by side.
DIVERGENT = "first divergent layer"
OFF_GOLDEN = "first layer off the golden"
# "as found on WORKLOAD: " where a later batch names an earlier batch's search (harness/sweeps/localize.py).
_NAMED = re.compile(rf"(?:as found on (?P<on>[^:;]+): )?(?P<how>{DIVERGENT}|{OFF_GOLDEN}): (?P<where>.+?) \(")


@dataclass(frozen=True)
class LayerRatio:
    """One layer's error ratio against the golden (the port rule's larger ratio)."""

    layer: str
    ratio: float
    growth: float | None
    """ratio over the previous layer's; None for the first layer or after an exact one."""


@dataclass(frozen=True)
class Divergence:
    """The first layer that fails the check, and what was measured there."""

    layer: str
    module: str
    """E.g. "Linear(4, 64)"; "" when the caller gave no `modules`."""
    index: tuple[int, ...]
    """First element that fails: differing bits (bitwise), the largest error (golden)."""
    comparison: Comparison | GoldenComparison
    layers_checked: int
    """Layers compared up to and including this one; 1 means its input was the observations."""
    ratios: tuple[LayerRatio, ...] = ()
    """Golden mode only: every layer checked, in order, this one last."""

    def describe(self) -> str:
        """One line for `checks.detail` and the report."""
        where = f"{self.layer} {self.module}" if self.module else self.layer
        c = self.comparison
        if isinstance(c, Comparison):
            parts = [
                f"{DIVERGENT}: {where} ({c.detail})",
                f"{c.n_mismatch} of {c.n_elements} elements differ, max {c.max_ulp} ulp",
            ]
            parts.append("input: the observations" if self.layers_checked == 1 else "inputs identical")
        else:
            parts = [f"{OFF_GOLDEN}: {where} ({c.detail})"]
            parts.append("input: the observations" if self.layers_checked == 1 else "inputs within the rule")
            parts.append("error ratio by layer: " + ", ".join(_format_ratio(r) for r in self.ratios))
        return "; ".join(parts)


def named_layer(detail: str) -> tuple[str, str, str] | None:
    """From a check's `detail`: which layer search named a layer (DIVERGENT or OFF_GOLDEN), the
    layer with its module, and the workload it was found on ("" for this row's own); None where
    no layer was named."""
    found = _NAMED.search(detail)
    return (found["how"], found["where"], found["on"] or "") if found else None


def first_divergent_layer(
    acts: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], *, modules: Mapping[str, str] | None = None
) -> Divergence | None:
    """The first layer where two cards' captures of the same input differ bit for bit, or None."""
    _same_layers(acts, ref)
    for checked, layer in enumerate(acts, start=1):
        comparison = compare_bitwise(acts[layer], ref[layer])
        if not comparison.passed:
            index = first_index(~same_bits(acts[layer], ref[layer]))
            return Divergence(layer, (modules or {}).get(layer, ""), index, comparison, checked)
    return None


def first_layer_off_golden(
    acts: Mapping[str, np.ndarray],
    cpu_same: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    dtype: str,
    limits: RatioLimits,
    *,
    modules: Mapping[str, str] | None = None,
) -> Divergence | None:
    """The first layer where a card's capture fails the port rule against the golden, or None."""
    _same_layers(acts, cpu_same)
    _same_layers(acts, golden)
    ratios: list[LayerRatio] = []
    for checked, layer in enumerate(acts, start=1):
        comparison = compare_to_golden(acts[layer], cpu_same[layer], golden[layer], dtype, limits)
        ratios.append(_layer_ratio(layer, comparison, ratios[-1] if ratios else None))
        if not comparison.passed:
            error = np.abs(as_float64(acts[layer]) - as_float64(golden[layer]))
            index = tuple(
                int(i) for i in np.unravel_index(int(np.nanargmax(np.where(np.isnan(error), np.inf, error))), error.shape)
            )
            return Divergence(layer, (modules or {}).get(layer, ""), index, comparison, checked, tuple(ratios))
    return None


@dataclass(frozen=True)
class Overflow:
    """The first layer whose output in a dtype is not finite where the golden's is."""

    layer: str
    module: str
    count: int
    n_elements: int
    largest: float
    """The golden's largest magnitude at that layer: what the dtype would have had to hold."""

    def describe(self, dtype: str) -> str:
        where = f"{self.layer} {self.module}" if self.module else self.layer
        return (
            f"the overflow begins at {where}: {self.count} of {self.n_elements} values not finite in {dtype} "
            f"(the golden's largest there {self.largest:.4g})"
        )


def first_overflow_layer(
    acts: Mapping[str, np.ndarray], golden: Mapping[str, np.ndarray], *, modules: Mapping[str, str] | None = None
) -> Overflow | None:
    """The first layer of a capture in a dtype that is NaN or inf where the golden is finite, or None."""
    found = _first_not_finite(acts, golden)
    if found is None:
        return None
    layer, bad = found
    gold = as_float64(golden[layer])
    largest = float(np.abs(gold[np.isfinite(gold)]).max(initial=0.0))
    return Overflow(layer, (modules or {}).get(layer, ""), int(np.count_nonzero(bad)), int(bad.size), largest)


@dataclass(frozen=True)
class FirstNonFinite:
    """A finding, not a rule: where a card's NaN or inf began, as msprobe's first-NaN analysis
    names it on Ascend. `passed` is False: a card's output held a value the golden's did not."""

    passed: bool
    n_elements: int
    n_nonfinite: int
    """Values of that layer not finite on the card where the golden's are."""
    layer: str
    input_row: int
    """The first row of the batch where it happened."""
    input_max_abs: float
    """The layer's largest finite input magnitude on the card (float16 holds up to 65504)."""
    detail: str

    def over_limit(self) -> float | None:
        return None


def first_nonfinite_layer(
    acts: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    observations: np.ndarray,
    *,
    modules: Mapping[str, str] | None = None,
) -> FirstNonFinite | None:
    """The first layer, in forward order, of a card's capture that is NaN or inf where the
    golden is finite, or None. A layer's input is the layer before it (the observations for the
    first): exact for the sequential bodies and heads of this harness's policies."""
    found = _first_not_finite(acts, golden)
    if found is None:
        return None
    layer, bad = found
    layers = list(acts)
    position = layers.index(layer)
    given = as_float64(acts[layers[position - 1]] if position else observations)
    largest = float(np.abs(given[np.isfinite(given)]).max(initial=0.0))
    row = first_index(bad)[0] if bad.ndim else 0
    where = f"{layer} {(modules or {}).get(layer, '')}".strip()
    detail = (
        f"the card's first value not finite appeared at {where}: {int(np.count_nonzero(bad))} of {bad.size} values, "
        f"first on input row {row}; the layer's largest finite input {largest:.4g}"
    )
    return FirstNonFinite(False, int(bad.size), int(np.count_nonzero(bad)), layer, row, largest, detail)


def _first_not_finite(acts: Mapping[str, np.ndarray], golden: Mapping[str, np.ndarray]) -> tuple[str, np.ndarray] | None:
    """The first layer of `acts` with a value not finite where the golden's is, and where."""
    _same_layers(acts, golden)
    for layer, values in acts.items():
        bad = ~np.isfinite(as_float64(values)) & np.isfinite(as_float64(golden[layer]))
        if bad.any():
            return layer, bad
    return None


def _same_layers(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> None:
    # Captures of different architectures are a harness bug: localizing them would invent a layer.
    if list(a) != list(b):
        raise ValueError(f"the captures hold different layers: {list(a)} vs {list(b)}")


def _layer_ratio(layer: str, comparison: GoldenComparison, previous: LayerRatio | None) -> LayerRatio:
    ratio = max(comparison.error_ratio, comparison.max_ratio)
    # A ratio over an exact layer says nothing: the drift starts here.
    growth = ratio / previous.ratio if previous is not None and previous.ratio > 0 else None
    return LayerRatio(layer, ratio, growth)


def _format_ratio(r: LayerRatio) -> str:
    text = f"{r.layer} {r.ratio:.3g}"
    return text if r.growth is None else f"{text} (x{r.growth:.3g})"
