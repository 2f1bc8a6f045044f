"""Judge one unit's gathered outputs: a `Check` per comparison. Pure: numpy in, records out.

Per batch unit and per output (logits or mu, action, stochastic_action):
  cross_card     every card against card 0, bit for bit
  cpu_reference  every card against torch float32 on the CPU, within the dtype's tolerance;
                 discrete actions as decisions (a flip fails unless the reference was a near tie)
  onnx_reference every card against onnxruntime on the original ONNX file, where there is one
Per episode unit: cross_card on each episode's action sequence and on the returns; cpu_reference
on the returns, with the first step where the trajectories part in `detail` and `episodes`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from harness.judge.compare import TOLERANCES, Comparison, Tolerance, compare_bitwise, compare_decisions, compare_tolerance
from harness.outputs import EpisodeOutput, Outputs

REFERENCE = "cpu"
ONNX_REFERENCE = "onnxruntime"
# A card's episode return may differ from the CPU's by this fraction: a near-tie decision can
# honestly send a low-precision trajectory elsewhere; a broken port loses the pole.
EPISODE_RETURN_RTOL = 0.05


@dataclass(frozen=True)
class Check:
    """One comparison: which output, which kind of check, which two devices, and its result."""

    output: str
    kind: str  # cross_card, cpu_reference, onnx_reference, error
    device_a: str
    device_b: str
    result: Comparison


def error_check(device: str, message: str) -> Check:
    """A card that produced nothing: recorded as a failed check, never skipped."""
    nan = float("nan")
    result = Comparison(
        passed=False, bitwise_equal=False, n_elements=0, n_mismatch=0, max_ulp=0, max_abs=nan, mean_abs=nan,
        max_rel=nan, cosine=nan, atol=None, rtol=None, min_cos=None, detail=message,
    )
    return Check("*", "error", device, "", result)


def judge_cross_card(dtype: str, cards: dict[str, Outputs]) -> list[Check]:
    labels = list(cards)
    checks = []
    for label in labels[1:]:
        for output, first in cards[labels[0]].items():
            a, b = in_compute_dtype(cards[label][output], first, dtype)
            checks.append(Check(output, "cross_card", label, labels[0], compare_bitwise(a, b)))
    return checks


def in_compute_dtype(a: np.ndarray, b: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Outputs computed in float16 or bfloat16 come back widened to float32, losslessly; narrowed
    again, their ULP distances count in the dtype the card computed in (1, not 8192)."""
    if dtype == "float32" or a.dtype != np.float32 or b.dtype != np.float32:
        return a, b
    import ml_dtypes

    native = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    na, nb = a.astype(native), b.astype(native)
    lossless = all(np.array_equal(n.astype(np.float32), x, equal_nan=True) for n, x in ((na, a), (nb, b)))
    return (na, nb) if lossless else (a, b)


def judge_against_reference(
    dtype: str, cards: dict[str, Outputs], reference: Outputs, kind: str, reference_label: str, noise: np.ndarray
) -> list[Check]:
    tol = TOLERANCES[dtype]
    checks = []
    for label, outputs in cards.items():
        for output, ref in reference.items():
            result = _against_reference(output, outputs[output], ref, reference, noise, tol)
            checks.append(Check(output, kind, label, reference_label, result))
    return checks


def _against_reference(output: str, actual: np.ndarray, ref: np.ndarray, reference: Outputs, noise: np.ndarray, tol: Tolerance) -> Comparison:
    if np.issubdtype(ref.dtype, np.integer) and "logits" in reference:
        # Gumbel-max samples argmax(logits + noise): the margin that matters includes the noise.
        scores = reference["logits"] + (noise if output == "stochastic_action" else 0.0)
        return compare_decisions(actual, ref, scores, decision_margin(reference["logits"], tol))
    if np.issubdtype(ref.dtype, np.integer):
        return compare_bitwise(actual, ref)
    return compare_tolerance(actual, ref, tol)


def decision_margin(logits: np.ndarray, tol: Tolerance) -> float:
    """Two logits each allowed to move by the tolerance can swap when they are this close."""
    finite = np.abs(logits[np.isfinite(logits)])
    scale = float(finite.max()) if finite.size else 0.0
    return 2.0 * (tol.atol + tol.rtol * scale)


def judge_batch(dtype: str, noise: np.ndarray, cards: dict[str, Outputs], reference: Outputs, onnx: Outputs | None) -> list[Check]:
    """Every card against card 0, the CPU reference and, where there is one, onnxruntime."""
    checks = judge_cross_card(dtype, cards)
    checks += judge_against_reference(dtype, cards, reference, "cpu_reference", REFERENCE, noise)
    if onnx:
        checks += judge_against_reference(dtype, cards, onnx, "onnx_reference", ONNX_REFERENCE, noise)
    return checks


def first_divergent_step(a: np.ndarray, b: np.ndarray) -> int | None:
    """First step where two action sequences differ (a shorter one parts where it ends)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    if differ.size:
        return int(differ[0])
    return None if len(a) == len(b) else n


def judge_episodes(
    cards: dict[str, list[EpisodeOutput]], reference: list[EpisodeOutput]
) -> tuple[list[Check], dict[str, list[int | None]]]:
    """The checks, and per card the step where each episode parts from the reference's (None: never)."""
    labels = list(cards)
    checks: list[Check] = []
    for label in labels[1:]:
        for mine, theirs in zip(cards[label], cards[labels[0]]):
            checks.append(_sequence_check(f"actions[seed={mine.episode_seed}]", label, labels[0], mine, theirs))
        checks.append(Check("returns", "cross_card", label, labels[0], compare_bitwise(_returns(cards[label]), _returns(cards[labels[0]]))))
    steps = {label: [first_divergent_step(e.actions, r.actions) for e, r in zip(episodes, reference)] for label, episodes in cards.items()}
    ref_returns = _returns(reference)
    episode_tol = Tolerance(atol=0.0, rtol=EPISODE_RETURN_RTOL, min_cos=0.0)
    for label, episodes in cards.items():
        result = compare_tolerance(_returns(episodes), ref_returns, episode_tol)
        parted = ", ".join(f"seed {e.episode_seed} parts at step {step}" for e, step in zip(episodes, steps[label]) if step is not None)
        detail = "; ".join(t for t in (result.detail, parted) if t)
        checks.append(Check("returns", "cpu_reference", label, REFERENCE, replace(result, detail=detail)))
    return checks, steps


def _sequence_check(output: str, a_label: str, b_label: str, a: EpisodeOutput, b: EpisodeOutput) -> Check:
    n = min(a.length, b.length)
    result = compare_bitwise(a.actions[:n], b.actions[:n])
    step = first_divergent_step(a.actions, b.actions)
    if step is not None:
        result = replace(result, passed=False, bitwise_equal=False, detail=f"trajectories part at step {step} (lengths {a.length} and {b.length})")
    return Check(output, "cross_card", a_label, b_label, result)


def _returns(episodes: list[EpisodeOutput]) -> np.ndarray:
    return np.asarray([e.episode_return for e in episodes], dtype=np.float64)
