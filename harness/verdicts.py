"""Turn one unit's gathered outputs into `checks` rows. Pure: numpy in, rows out, no Ray.

Per batch unit and per output (logits or mu, action, stochastic_action):
  cross_card     every card against card 0, bit for bit
  cpu_reference  every card against torch float32 on the CPU, within the dtype's tolerance;
                 discrete actions as decisions (a flip fails unless the reference was a near tie)
  onnx_reference every card against onnxruntime on the original ONNX file, where there is one
Per episode unit: cross_card on each episode's action sequence and on the returns; cpu_reference
on the returns, with the first step where the trajectories part in `detail` and `episodes`.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from harness.compare import TOLERANCES, Comparison, Tolerance, compare_bitwise, compare_decisions, compare_tolerance
from harness.inference import EpisodeOutput
from harness.plan import BatchWork, EpisodeWork, Unit
from harness.results import CheckRow, EpisodeRow

REFERENCE = "cpu"
ONNX_REFERENCE = "onnxruntime"
# A card's episode return may differ from the CPU's by this fraction: a near-tie decision can
# honestly send a low-precision trajectory elsewhere; a broken port loses the pole.
EPISODE_RETURN_RTOL = 0.05

Outputs = dict[str, np.ndarray]


def check_row(unit: Unit, output: str, kind: str, device_a: str, device_b: str, result: Comparison) -> CheckRow:
    """Where the comparison was made (unit, output, devices) beside what it measured and judged."""
    return CheckRow(
        unit_id=unit.unit_id, policy=unit.policy, dtype=unit.dtype, workload=unit.workload, output=output, kind=kind,
        device_a=device_a, device_b=device_b, input_sha256=unit.work.input_sha256, **asdict(result),
    )


def error_row(unit: Unit, device: str, message: str) -> CheckRow:
    """A card that produced nothing: recorded as a failed check, never skipped."""
    return CheckRow(unit.unit_id, unit.policy, unit.dtype, unit.workload, "*", "error", device, "", unit.work.input_sha256,
                    False, 0, 0, 0, float("nan"), float("nan"), float("nan"), float("nan"), None, None, None, False, message)


def judge_cross_card(unit: Unit, cards: dict[str, Outputs]) -> list[CheckRow]:
    labels = list(cards)
    rows = []
    for label in labels[1:]:
        for output, first in cards[labels[0]].items():
            a, b = in_compute_dtype(cards[label][output], first, unit.dtype)
            rows.append(check_row(unit, output, "cross_card", label, labels[0], compare_bitwise(a, b)))
    return rows


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
    unit: Unit, cards: dict[str, Outputs], reference: Outputs, kind: str, reference_label: str, noise: np.ndarray
) -> list[CheckRow]:
    tol = TOLERANCES[unit.dtype]
    rows = []
    for label, outputs in cards.items():
        for output, ref in reference.items():
            result = _against_reference(output, outputs[output], ref, reference, noise, tol)
            rows.append(check_row(unit, output, kind, label, reference_label, result))
    return rows


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


def judge_batch(unit: Unit, cards: dict[str, Outputs], reference: Outputs, onnx: Outputs | None) -> list[CheckRow]:
    assert isinstance(unit.work, BatchWork)
    noise = unit.work.batch.noise
    rows = judge_cross_card(unit, cards)
    rows += judge_against_reference(unit, cards, reference, "cpu_reference", REFERENCE, noise)
    if onnx:
        rows += judge_against_reference(unit, cards, onnx, "onnx_reference", ONNX_REFERENCE, noise)
    return rows


def first_divergent_step(a: np.ndarray, b: np.ndarray) -> int | None:
    """First step where two action sequences differ (a shorter one parts where it ends)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    if differ.size:
        return int(differ[0])
    return None if len(a) == len(b) else n


def judge_episodes(
    unit: Unit, cards: dict[str, list[EpisodeOutput]], reference: list[EpisodeOutput]
) -> tuple[list[CheckRow], list[EpisodeRow]]:
    assert isinstance(unit.work, EpisodeWork)
    labels = list(cards)
    rows: list[CheckRow] = []
    for label in labels[1:]:
        for mine, theirs in zip(cards[label], cards[labels[0]]):
            rows.append(_sequence_row(unit, f"actions[seed={mine.episode_seed}]", "cross_card", label, labels[0], mine, theirs))
        rows.append(check_row(unit, "returns", "cross_card", label, labels[0], compare_bitwise(_returns(cards[label]), _returns(cards[labels[0]]))))
    ref_returns = _returns(reference)
    episode_tol = Tolerance(atol=0.0, rtol=EPISODE_RETURN_RTOL, min_cos=0.0)
    for label, episodes in cards.items():
        result = compare_tolerance(_returns(episodes), ref_returns, episode_tol)
        parted = [(e.episode_seed, first_divergent_step(e.actions, r.actions)) for e, r in zip(episodes, reference)]
        parted_text = ", ".join(f"seed {s} parts at step {step}" for s, step in parted if step is not None)
        detail = "; ".join(t for t in (result.detail, parted_text) if t)
        row = check_row(unit, "returns", "cpu_reference", label, REFERENCE, result)
        row.detail = detail
        rows.append(row)
    return rows, _episode_rows(unit, cards, reference)


def _sequence_row(unit: Unit, output: str, kind: str, a_label: str, b_label: str, a: EpisodeOutput, b: EpisodeOutput) -> CheckRow:
    n = min(a.length, b.length)
    row = check_row(unit, output, kind, a_label, b_label, compare_bitwise(a.actions[:n], b.actions[:n]))
    step = first_divergent_step(a.actions, b.actions)
    if step is not None:
        row.passed = row.bitwise_equal = False
        row.detail = f"trajectories part at step {step} (lengths {a.length} and {b.length})"
    return row


def _returns(episodes: list[EpisodeOutput]) -> np.ndarray:
    return np.asarray([e.episode_return for e in episodes], dtype=np.float64)


def _episode_rows(unit: Unit, cards: dict[str, list[EpisodeOutput]], reference: list[EpisodeOutput]) -> list[EpisodeRow]:
    assert isinstance(unit.work, EpisodeWork)
    mode = "stochastic" if unit.work.stochastic else "deterministic"
    rows = []
    for label, episodes in {REFERENCE: reference, **cards}.items():
        for episode, ref in zip(episodes, reference):
            rows.append(EpisodeRow(
                unit.unit_id, unit.policy, unit.dtype, label, unit.work.env_id, mode, episode.episode_seed,
                episode.episode_return, episode.length, episode.actions_sha256,
                None if label == REFERENCE else first_divergent_step(episode.actions, ref.actions),
            ))
    return rows
