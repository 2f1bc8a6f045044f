"""Judge one unit's gathered outputs: a `Check` per comparison. Pure: numpy in, records out.

Two questions, kept apart (README, "Verdicts"):

Is the port right? Always gating.
  cross_card      every card against card 0, bit for bit (outputs, and episode trajectories)
  cpu_reference   every card against the float64 golden, relative to the CPU's own error in the
                  card's dtype (harness/judge/golden.py), on every floating output
Is this dtype good enough for this policy? Gating by default.
  decisions       discrete actions (deterministic and sampled) against the golden's; a flip
                  passes only as a near-tie: when the golden's margin is within what the dtype
                  may move two scores by
  episode_return  a card's mean episode return within 5% of the CPU float32's
  tolerance       the fixed atol/rtol table against the CPU float32 output, on every floating
                  output: reported always, gating only on outputs the policy declares bounded
                  and where the user sets `--tolerance` for the dtype
And:
  onnx_reference  the loader, not a card: the torch rebuild against onnxruntime on the original
                  file, by the golden rule
  batch_invariance  a card's first rows computed alone against the same rows inside the large
                  batch, bit for bit: a property of the card, gating only when required
  published_return  the CPU float32's mean return against the score the policy's files state it
                  was published with: the port, the loader and the harness's replay of the
                  environment together; gating only when required
  error           a card that produced nothing
  bench_audit     a bench's timed path against the sweep's run_batch on the same card and input,
                  bit for bit: what the bench timed computes what the sweep validated
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.judge.compare import (
    TOLERANCES,
    Comparison,
    DecisionComparison,
    Tolerance,
    compare_bitwise,
    compare_decisions,
    compare_tolerance,
)
from harness.judge.kinds import CheckKind
from harness.judge.golden import GoldenComparison, RatioLimits, compare_to_golden, row_errors
from harness.outputs import EpisodeOutput, Outputs

REFERENCE = "cpu"
GOLDEN = "cpu-float64"
ONNX_REFERENCE = "onnxruntime"
# A card's mean episode return may differ from the CPU's by this fraction: a near-tie decision
# can honestly send a low-precision trajectory elsewhere; a broken port loses the pole.
EPISODE_RETURN_RTOL = 0.05
# Two scores, each off by up to ratio_limit times the dtype's own error, can swap when the
# golden's margin between them is within twice that.
FLIP_SCORES = 2.0
PUBLISHED = "published"
# A published score's spread is its episodes' standard deviation; where that is 0 (every episode
# scored the same, as CartPole's 500) the mean may be this fraction off it.
PUBLISHED_RETURN_RTOL = 0.05


@dataclass(frozen=True)
class EpisodeComparison:
    """Episodes of one unit on a card against the same episodes elsewhere."""

    passed: bool
    n_elements: int
    episode_seed: int | None
    """The first episode whose trajectory parts from the other's; None when none does."""
    first_divergent_step: int | None
    return_a: float | None
    """Mean return of the card's episodes (episode_return checks)."""
    return_b: float | None
    return_rel_diff: float | None
    return_rtol: float | None
    detail: str


@dataclass(frozen=True)
class PublishedComparison:
    """A mean episode return against the one a policy was published with."""

    passed: bool
    n_elements: int  # episodes played
    return_a: float  # their mean return here
    return_b: float  # the published mean
    return_abs_diff: float
    return_atol: float  # the published standard deviation, or PUBLISHED_RETURN_RTOL of the mean where it is 0
    published_std: float
    detail: str


Result = Comparison | GoldenComparison | DecisionComparison | EpisodeComparison | PublishedComparison


@dataclass(frozen=True)
class Check:
    """One comparison: which output, which kind of check, which two devices, whether it counts
    toward the run's verdict, and the measured result (its fields are `checks` columns)."""

    output: str
    kind: CheckKind
    device_a: str
    device_b: str
    gating: bool
    result: Result

    @property
    def passed(self) -> bool:
        return self.result.passed


@dataclass(frozen=True)
class Rules:
    """The thresholds a sweep judges by, for one unit's dtype."""

    dtype: str
    limits: RatioLimits
    tolerance: Tolerance
    tolerance_gates: bool
    """True when the user set the tolerance of this dtype: it then gates every floating output."""
    bounded_outputs: frozenset[str]
    """Outputs the policy declares bounded (clipped actions): the tolerance gates on them."""
    published_gates: bool = False
    """True when the user requires the published score (--require-published-return)."""
    scores: str = "logits"
    """The discrete head's output, whose margins judge a flipped decision: a categorical
    policy's `logits`, a Q-network's `q_values`."""


def tolerance_of(dtype: str, user: dict[str, Tolerance]) -> tuple[Tolerance, bool]:
    """The tolerance for a dtype label (float32-tf32 falls back to float32's table) and whether
    it is the user's."""
    if dtype in user:
        return user[dtype], True
    return TOLERANCES[dtype.split("-")[0]], False


def error_check(device: str, message: str) -> Check:
    """A card that produced nothing: recorded as a failed check, never skipped."""
    nan = float("nan")
    result = Comparison(
        passed=False,
        bitwise_equal=False,
        n_elements=0,
        n_mismatch=0,
        max_ulp=0,
        max_abs=nan,
        mean_abs=nan,
        max_rel=nan,
        cosine=nan,
        ref_max_abs=None,
        atol=None,
        rtol=None,
        min_cos=None,
        detail=message,
    )
    return Check("*", CheckKind.ERROR, device, "", True, result)


def judge_cross_card(dtype: str, cards: dict[str, Outputs]) -> list[Check]:
    labels = list(cards)
    checks = []
    for label in labels[1:]:
        for output, first in cards[labels[0]].items():
            a, b = in_compute_dtype(cards[label][output], first, dtype)
            checks.append(Check(output, CheckKind.CROSS_CARD, label, labels[0], True, compare_bitwise(a, b)))
    return checks


def in_compute_dtype(a: np.ndarray, b: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Outputs computed in float16 or bfloat16 come back widened to float32, losslessly; narrowed
    again, their ULP distances count in the dtype the card computed in (1, not 8192)."""
    if dtype not in ("float16", "bfloat16") or a.dtype != np.float32 or b.dtype != np.float32:
        return a, b
    import ml_dtypes

    native = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    na, nb = a.astype(native), b.astype(native)
    lossless = all(np.array_equal(n.astype(np.float32), x, equal_nan=True) for n, x in ((na, a), (nb, b)))
    return (na, nb) if lossless else (a, b)


def judge_batch(
    rules: Rules, noise: np.ndarray, cards: dict[str, Outputs], golden: Outputs, cpu_same: Outputs, cpu_float32: Outputs
) -> list[Check]:
    """Every card against card 0, the golden (port and decisions) and the CPU float32 (tolerance)."""
    checks = judge_cross_card(rules.dtype, cards)
    for label, outputs in cards.items():
        for output, gold in golden.items():
            if np.issubdtype(gold.dtype, np.integer):
                checks.append(_decisions(rules, output, label, outputs[output], golden, cpu_same, noise))
                continue
            port = compare_to_golden(outputs[output], cpu_same[output], gold, rules.dtype, rules.limits)
            checks.append(Check(output, CheckKind.CPU_REFERENCE, label, GOLDEN, True, port))
            gates = rules.tolerance_gates or output in rules.bounded_outputs
            table = compare_tolerance(outputs[output], cpu_float32[output], rules.tolerance)
            checks.append(Check(output, CheckKind.TOLERANCE, label, REFERENCE, gates, table))
    return checks


def _decisions(
    rules: Rules, output: str, label: str, actions: np.ndarray, golden: Outputs, cpu_same: Outputs, noise: np.ndarray
) -> Check:
    """Argmax against the golden's; a flip is a near-tie when the golden's margin is within what
    the dtype may move two scores by (the CPU's largest score error in that row, times the limit)."""
    logits = golden[rules.scores]
    # Sampled actions are argmax(scores + noise) (Gumbel, or epsilon-greedy's): the margin that
    # matters includes the noise.
    scores = logits + noise.astype(np.float64) if output == "stochastic_action" else logits
    limit = FLIP_SCORES * rules.limits.for_size(logits.size) * row_errors(cpu_same[rules.scores], logits, rules.dtype)
    # A row whose golden or CPU score is not finite has no honest near-tie: any flip there fails.
    limit = np.where(np.isfinite(limit), limit, 0.0)
    return Check(output, CheckKind.DECISIONS, label, GOLDEN, True, compare_decisions(actions, golden[output], scores, limit))


def judge_onnx(rules: Rules, onnx: Outputs, torch_float32: Outputs, golden: Outputs) -> list[Check]:
    """The loader: onnxruntime on the original file against the golden, relative to the torch
    rebuild's float32 error. onnxruntime's error may be at most the limit times torch's."""
    checks = []
    for output, ort in onnx.items():
        if np.issubdtype(ort.dtype, np.integer):
            result: Result = compare_bitwise(ort.astype(np.int64), torch_float32[output].astype(np.int64))
        else:
            result = compare_to_golden(ort, torch_float32[output], golden[output], "float32", rules.limits, what="onnxruntime")
        checks.append(Check(output, CheckKind.ONNX_REFERENCE, ONNX_REFERENCE, GOLDEN, True, result))
    return checks


def judge_batch_invariance(cards: dict[str, tuple[Outputs, Outputs]], gating: bool) -> list[Check]:
    """Each card's first rows computed as a batch of their own against the same rows computed
    inside the large batch, on the same card: bit for bit or not."""
    checks = []
    for label, (alone, inside) in cards.items():
        for output, a in alone.items():
            checks.append(Check(output, CheckKind.BATCH_INVARIANCE, label, label, gating, compare_bitwise(a, inside[output])))
    return checks


def judge_bench_audit(label: str, timed: Outputs, swept: Outputs) -> list[Check]:
    """Outputs sampled from a bench's timed path against the same card's run_batch: always gating."""
    return [
        Check(output, CheckKind.BENCH_AUDIT, label, label, True, compare_bitwise(timed[output], swept[output]))
        for output in swept
    ]


def first_divergent_step(a: np.ndarray, b: np.ndarray) -> int | None:
    """First step where two action sequences differ (a shorter one parts where it ends)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero((a[:n] != b[:n]).reshape(n, -1).any(axis=1)) if n else np.array([], dtype=np.int64)
    if differ.size:
        return int(differ[0])
    return None if len(a) == len(b) else n


def judge_episodes(
    cards: dict[str, list[EpisodeOutput]], reference: list[EpisodeOutput]
) -> tuple[list[Check], dict[str, list[int | None]]]:
    """Trajectories across cards bit for bit, returns against the CPU float32's; and per card
    the step where each episode parts from the CPU's (None: never)."""
    labels = list(cards)
    checks: list[Check] = []
    for label in labels[1:]:
        checks.append(
            Check("actions", CheckKind.CROSS_CARD, label, labels[0], True, _trajectories(cards[label], cards[labels[0]]))
        )
        checks.append(
            Check(
                "returns",
                CheckKind.CROSS_CARD,
                label,
                labels[0],
                True,
                compare_bitwise(_returns(cards[label]), _returns(cards[labels[0]])),
            )
        )
    steps = {
        label: [first_divergent_step(e.actions, r.actions) for e, r in zip(episodes, reference, strict=True)]
        for label, episodes in cards.items()
    }
    for label, episodes in cards.items():
        checks.append(
            Check("returns", CheckKind.EPISODE_RETURN, label, REFERENCE, True, _mean_return(episodes, reference, steps[label]))
        )
    return checks, steps


def _trajectories(mine: list[EpisodeOutput], theirs: list[EpisodeOutput]) -> EpisodeComparison:
    """Every episode's actions bit for bit; the first one that parts, and where."""
    parted = [
        (m.episode_seed, step)
        for m, t in zip(mine, theirs, strict=True)
        if (step := first_divergent_step(m.actions, t.actions)) is not None
    ]
    seed, step = parted[0] if parted else (None, None)
    detail = f"{len(parted)} of {len(mine)} trajectories part; seed {seed} first, at step {step}" if parted else ""
    return EpisodeComparison(
        passed=not parted,
        n_elements=len(mine),
        episode_seed=seed,
        first_divergent_step=step,
        return_a=None,
        return_b=None,
        return_rel_diff=None,
        return_rtol=None,
        detail=detail,
    )


def _mean_return(episodes: list[EpisodeOutput], reference: list[EpisodeOutput], steps: list[int | None]) -> EpisodeComparison:
    """The card's mean return against the CPU float32's, within EPISODE_RETURN_RTOL; where the
    trajectories part is reported, not judged (a near-tie may honestly send them elsewhere)."""
    mine, theirs = float(_returns(episodes).mean()), float(_returns(reference).mean())
    rel = abs(mine - theirs) / abs(theirs) if theirs else (0.0 if mine == theirs else float("inf"))
    passed = bool(np.isfinite(mine)) and rel <= EPISODE_RETURN_RTOL
    parted = [(e.episode_seed, s) for e, s in zip(episodes, steps, strict=True) if s is not None]
    reasons = (
        [] if passed else [f"mean return {mine:.6g} vs the CPU's {theirs:.6g}: {rel:.3g} apart > {EPISODE_RETURN_RTOL:g}"]
    )
    if parted:
        reasons.append(
            f"{len(parted)} of {len(episodes)} episodes part from the CPU's; seed {parted[0][0]} first, at step {parted[0][1]}"
        )
    seed, step = parted[0] if parted else (None, None)
    return EpisodeComparison(
        passed=passed,
        n_elements=len(episodes),
        episode_seed=seed,
        first_divergent_step=step,
        return_a=mine,
        return_b=theirs,
        return_rel_diff=rel,
        return_rtol=EPISODE_RETURN_RTOL,
        detail="; ".join(reasons),
    )


def judge_published(reference: list[EpisodeOutput], mean: float, std: float, source: str, gating: bool) -> list[Check]:
    """The CPU float32's mean return against the published `mean`: within one published standard
    deviation, or PUBLISHED_RETURN_RTOL of the mean where the deviation is 0."""
    ours = float(_returns(reference).mean())
    limit = std if std > 0 else PUBLISHED_RETURN_RTOL * abs(mean)
    diff = abs(ours - mean)
    passed = bool(np.isfinite(ours)) and diff <= limit
    shown = f"mean return {ours:.6g} over {len(reference)} episodes vs {mean:.6g} +/- {std:.6g} published ({source})"
    detail = shown if passed else f"{shown}: {diff:.3g} apart > {limit:.3g}"
    result = PublishedComparison(passed, len(reference), ours, mean, diff, limit, std, detail)
    return [Check("returns", CheckKind.PUBLISHED_RETURN, REFERENCE, PUBLISHED, gating, result)]


def _returns(episodes: list[EpisodeOutput]) -> np.ndarray:
    return np.asarray([e.episode_return for e in episodes], dtype=np.float64)
