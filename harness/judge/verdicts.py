"""Judge one unit's gathered outputs: a `Check` per comparison. Pure: numpy in, records out.

Two questions, kept apart (docs/verdicts.md):

Is the port right? Always gating.
  cross_card      every card against card 0, bit for bit (outputs, and episode trajectories)
  cpu_reference   every card against the float64 golden, relative to the CPU's own error in the
                  card's dtype (harness/judge/golden.py), on every floating output
  masked_actions  a masked policy's actions (on batches and in episodes) against the masks they
                  were chosen under: none forbidden, on any card
Is this dtype good enough for this policy? Gating by default.
  decisions       discrete actions (deterministic and sampled) against the golden's; a flip
                  passes only as a near-tie: when the golden's margin is within what the dtype
                  may move two scores by
  episode_return  a card's returns against the CPU float32's of the same seeds, as distributions:
                  the paired difference's interval against a margin; PASS, FAIL or INCONCLUSIVE
                  (harness/judge/returns.py), INCONCLUSIVE gating only when required
  tolerance       the fixed atol/rtol table against the CPU float32 output, on every floating
                  output: reported always, gating only on outputs the policy declares bounded
                  and where the user sets `--tolerance` for the dtype
And:
  onnx_reference  the loader, not a card: the torch rebuild against onnxruntime on the original
                  file, by the golden rule
  batch_invariance  a card's first rows computed alone against the same rows inside the large
                  batch, bit for bit: a property of the card, gating only when required
  published_return  the CPU float32's returns against the score the policy's files state it was
                  published with, as episode_return judges: the port, the loader and the
                  harness's replay of the environment together; gating only when required
  error           a card that produced nothing
  first_nonfinite  a finding, never gating: the first layer where a card's NaN or inf appeared
                  (the golden finite there), found after the unit is judged, by localisation
  bench_audit     a bench's timed path against the sweep's run_batch on the same card and input,
                  bit for bit: what the bench timed computes what the sweep validated
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from harness.dtypes import precision_of
from harness.judge.compare import (
    TOLERANCES,
    Comparison,
    EpisodeComparison,
    Tolerance,
    by_branch,
    compare_bitwise,
    compare_decisions,
    compare_masks,
    compare_tolerance,
    masked_in_episodes,
)
from harness.judge.golden import RatioLimits, compare_to_golden, row_errors
from harness.judge.kinds import CheckKind
from harness.judge.results import Result, holds
from harness.judge.returns import Decision, Interval, Margin, Outcome, ReturnComparison, decide, interval, iqm, mean
from harness.judge.returns import t_interval
from harness.outputs import STATE_OUTPUTS, EpisodeOutput, Outputs

# The `device_b` of a check, where the other side is no card: the CPU float32, the float64
# golden (the dtype harness.dtypes.GOLDEN_DTYPE), onnxruntime on the original file.
REFERENCE = "cpu"
GOLDEN_DEVICE = "cpu-float64"
ONNX_REFERENCE = "onnxruntime"
# The CPU float32's episodes replayed under the honest-card model (the ulp-noise fault, nudges
# of its own): where an honest port's trajectories part from the CPU's.
HONEST = "cpu-ulp-noise"
# Two scores, each off by up to ratio_limit times the dtype's own error, can swap when the
# golden's margin between them is within twice that.
FLIP_SCORES = 2.0
PUBLISHED = "published"
# A recurrent policy's state is judged again in these windows of steps since its episode started,
# each a finding of its own (`STATE_OUTPUTS` name@first-last): does its error stay bounded?
STATE_WINDOWS = ((1, 10), (11, 100), (101, 1000), (1001, 10_000))
# The `device_b` of a masked_actions check: the batch's drawn masks, or the environment's action_masks().
MASKS = "masks"
ENV_MASKS = "env-masks"
# A multi-discrete policy's scores past the last action of a shorter branch (`Rules.per_action`):
# finite, so the reference stays measurable, and below any score, so an action there is no near-tie.
BEYOND_BRANCH = float(np.finfo(np.float32).min)
# Where neither a published score nor our episodes vary (CartPole's 500.00 +/- 0.00), our return
# must be the published one as a model card prints it: to two decimals.
PUBLISHED_ROUNDING = 0.005
# Why a published score the CPU float32 misses is no fault of the port: no card played those episodes.
NOT_THE_AGENTS = (
    "the CPU float32 reference itself misses the published score: the environment or the weights are not the "
    "agent's, not the port's, and every closed-loop verdict of this policy was made in that environment"
)
_Z95 = 1.959963984540054


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

    def __post_init__(self) -> None:
        if not holds(self.kind, self.result):
            raise TypeError(f"a {self.kind} check cannot hold a {type(self.result).__name__}")

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
    scores: str = "logits"
    """The discrete head's output, whose margins judge a flipped decision: a categorical
    policy's `logits`, a Q-network's `q_values`."""
    masked: bool = False
    """The policy chooses among the actions a mask allows: every card's actions are checked against it."""
    branches: tuple[int, ...] = ()
    """A multi-discrete policy's branches: its scores and masks split so, its actions one per branch."""
    layers: Mapping[str, str] = field(default_factory=dict)
    """The policy's leaf layers as a layer search names them, e.g. {"body.0": "Linear(4, 64)"}."""

    def per_action(self, values: np.ndarray, fill: float | bool) -> np.ndarray:
        """Scores or masks (rows, actions) as its actions index them: split by branch (`by_branch`) where it has several."""
        return by_branch(values, self.branches, fill) if self.branches else values


def tolerance_of(dtype: str, user: Mapping[str, Tolerance]) -> tuple[Tolerance, bool]:
    """The tolerance for a dtype label (float32-tf32 falls back to float32's table) and whether
    it is the user's."""
    if dtype in user:
        return user[dtype], True
    return TOLERANCES[precision_of(dtype).split("-")[0]], False


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
    if precision_of(dtype) not in ("float16", "bfloat16") or a.dtype != np.float32 or b.dtype != np.float32:
        return a, b
    import ml_dtypes

    native = ml_dtypes.bfloat16 if precision_of(dtype) == "bfloat16" else np.float16
    with np.errstate(over="ignore"):  # a value past the dtype's range is no narrowing back: kept float32 below
        na, nb = a.astype(native), b.astype(native)
    lossless = all(np.array_equal(n.astype(np.float32), x, equal_nan=True) for n, x in ((na, a), (nb, b)))
    return (na, nb) if lossless else (a, b)


def judge_batch(
    rules: Rules,
    noise: np.ndarray,
    cards: dict[str, Outputs],
    golden: Outputs,
    cpu_same: Outputs,
    cpu_float32: Outputs,
    masks: np.ndarray | None = None,
    starts: np.ndarray | None = None,
) -> list[Check]:
    """Every card against card 0, the golden (port and decisions) and the CPU float32 (tolerance);
    a masked policy's actions against the batch's `masks`; a recurrent policy's state by how many
    steps its episode has run (`starts`: where the batch's episodes start), as findings."""
    checks = judge_cross_card(rules.dtype, cards)
    if starts is not None:
        checks += _state_growth(rules, cards, golden, cpu_same, starts)
    for label, outputs in cards.items():
        for output, gold in golden.items():
            if np.issubdtype(gold.dtype, np.integer):
                checks.append(_decisions(rules, output, label, outputs[output], golden, cpu_same, noise, masks))
                if rules.masked and masks is not None:
                    result = compare_masks(outputs[output], rules.per_action(masks, False))
                    checks.append(Check(output, CheckKind.MASKED_ACTIONS, label, MASKS, True, result))
                continue
            port = compare_to_golden(outputs[output], cpu_same[output], gold, rules.dtype, rules.limits)
            checks.append(Check(output, CheckKind.CPU_REFERENCE, label, GOLDEN_DEVICE, True, port))
            table = compare_tolerance(outputs[output], cpu_float32[output], rules.tolerance)
            # Values the dtype cannot hold are no question of tolerance: beyond any, whatever the output.
            overflow = bool((~np.isfinite(outputs[output]) & np.isfinite(cpu_float32[output])).any())
            if overflow:
                table = replace(table, detail=f"{table.detail}; {rules.dtype} cannot hold this policy's values here")
            gates = rules.tolerance_gates or output in rules.bounded_outputs or overflow
            checks.append(Check(output, CheckKind.TOLERANCE, label, REFERENCE, gates, table))
    return checks


def steps_run(starts: np.ndarray) -> np.ndarray:
    """Each row's step of its episode, 1 where one starts, for a sequence whose first row starts one."""
    rows = np.arange(len(starts))
    return rows - np.maximum.accumulate(np.where(starts, rows, 0)) + 1


def _state_growth(
    rules: Rules, cards: dict[str, Outputs], golden: Outputs, cpu_same: Outputs, starts: np.ndarray
) -> list[Check]:
    """The state's error against the golden in each window of steps (`STATE_WINDOWS`), by the port
    rule, reported and never gating: how the error grows with the step (the whole state gates)."""
    step = steps_run(starts)
    checks = []
    for first, last in STATE_WINDOWS:
        rows = (step >= first) & (step <= last)
        if not rows.any():
            continue
        for name in STATE_OUTPUTS:
            window = f"{name}@{first}-{last}"
            for label, outputs in cards.items():
                port = compare_to_golden(
                    outputs[name][rows], cpu_same[name][rows], golden[name][rows], rules.dtype, rules.limits
                )
                checks.append(Check(window, CheckKind.CPU_REFERENCE, label, GOLDEN_DEVICE, False, port))
    return checks


def _decisions(
    rules: Rules,
    output: str,
    label: str,
    actions: np.ndarray,
    golden: Outputs,
    cpu_same: Outputs,
    noise: np.ndarray,
    masks: np.ndarray | None,
) -> Check:
    """Argmax against the golden's; a flip is a near-tie when the golden's margin is within what
    the dtype may move two scores by (the CPU's largest score error in that row, times the limit)."""
    logits = golden[rules.scores]
    # Sampled actions are argmax(scores + noise) (Gumbel, or epsilon-greedy's): the margin that
    # matters includes the noise.
    scores = logits + noise.astype(np.float64) if output == "stochastic_action" else logits
    cpu = cpu_same[rules.scores]
    if rules.masked and masks is not None:
        # A masked action's score is the masked logit, exact on every side: left in, its 1e8
        # would set the row's error floor, and every flip of the row would pass as a near-tie.
        cpu, logits = np.where(masks, cpu, 0), np.where(masks, logits, 0)
    limit = FLIP_SCORES * rules.limits.for_size(logits.size) * row_errors(cpu, logits, rules.dtype)
    # A row whose golden or CPU score is not finite has no honest near-tie: any flip there fails.
    limit = np.where(np.isfinite(limit), limit, 0.0)
    if rules.branches:  # each branch's decision held to its row's limit
        limit = limit[:, None]
    result = compare_decisions(actions, golden[output], rules.per_action(scores, BEYOND_BRANCH), limit)
    return Check(output, CheckKind.DECISIONS, label, GOLDEN_DEVICE, True, result)


def judge_onnx(rules: Rules, onnx: Outputs, torch_float32: Outputs, golden: Outputs) -> list[Check]:
    """The loader: onnxruntime on the original file against the golden, relative to the torch
    rebuild's float32 error. onnxruntime's error may be at most the limit times torch's."""
    checks = []
    for output, ort in onnx.items():
        if np.issubdtype(ort.dtype, np.integer):
            result: Result = compare_bitwise(ort.astype(np.int64), torch_float32[output].astype(np.int64))
        else:
            result = compare_to_golden(ort, torch_float32[output], golden[output], "float32", rules.limits, what="onnxruntime")
        checks.append(Check(output, CheckKind.ONNX_REFERENCE, ONNX_REFERENCE, GOLDEN_DEVICE, True, result))
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
    cards: dict[str, list[EpisodeOutput]], reference: list[EpisodeOutput], honest: list[EpisodeOutput], masked: bool = False
) -> tuple[list[Check], dict[str, list[int | None]]]:
    """Trajectories and returns across cards, bit for bit; and the step where each episode parts
    from the CPU float32's (None: never), per card and for the CPU's replay under the honest-card
    model (`HONEST`). Returns are judged against the CPU's over every round of a mode, apart
    (`judge_returns`). A masked policy's actions on every card, against its environment's masks."""
    labels = list(cards)
    checks: list[Check] = []
    if masked:
        for label, episodes in cards.items():
            result = masked_in_episodes([e.illegal for e in episodes], [e.episode_seed for e in episodes])
            checks.append(Check("actions", CheckKind.MASKED_ACTIONS, label, ENV_MASKS, True, result))
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
        for label, episodes in {**cards, HONEST: honest}.items()
    }
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
        passed=not parted, n_elements=len(mine), episode_seed=seed, first_divergent_step=step, detail=detail
    )


@dataclass(frozen=True)
class Paired:
    """One card's episodes of a mode and the CPU float32's of the same seeds, in seed order, with
    where each parts from the CPU's trajectory: the card's, and the honest-card replay's."""

    seeds: np.ndarray
    card: np.ndarray  # returns
    cpu: np.ndarray
    card_steps: list[int | None]
    honest_steps: list[int | None]


@dataclass(frozen=True)
class ClosedLoopRules:
    """How closed-loop returns are judged (docs/verdicts.md, "Closed-loop returns")."""

    margin: Margin = field(default_factory=Margin)
    require_conclusive: bool = False
    """INCONCLUSIVE gates (fails the run) only when asked; it never passes."""
    published_gates: bool = True
    """A published score the CPU falls short of fails the run (--published-return gate, the
    default); False reports it as a finding (--published-return finding)."""

    def gating(self, gates: bool, outcome: Outcome) -> bool:
        return gates and (outcome is not Outcome.INCONCLUSIVE or self.require_conclusive)


def judge_returns(label: str, paired: Paired, rules: ClosedLoopRules, published_std: float | None = None) -> Check:
    """The card's returns against the CPU float32's of the same seeds (`harness.judge.returns`):
    exact answers first, then the paired difference's interval against the margin. The margin's
    spread is the larger of the returns' own (card and CPU pooled: under an honest card they are
    one distribution, and the CPU's episodes alone may have missed its rare ones) and the
    published standard deviation, where the policy states one for this mode."""
    card, cpu = paired.card, paired.cpu
    n = int(card.size)
    pooled = float(np.std(np.concatenate([card, cpu]), ddof=1)) if n > 1 and np.isfinite(card).all() else 0.0
    spread, source = (published_std, "the published std") if published_std and published_std > pooled else (pooled, "std")
    margin = rules.margin.of(spread)
    differ = np.flatnonzero(card != cpu)
    if not np.isfinite(card).all():
        bad = int(np.count_nonzero(~np.isfinite(card)))
        decision = _exact(Outcome.FAIL, margin, f"the card's return is not finite in {bad} of {n} episodes")
    elif not differ.size:
        decision = _exact(Outcome.PASS, margin, f"returns identical to the CPU's in all {n} episodes")
    # One episode cannot show that the CPU's return never varies.
    elif n > 1 and float(np.ptp(cpu)) == 0 and (rules.margin.absolute is None or margin == 0):
        first = int(differ[0])
        decision = _exact(
            Outcome.FAIL,
            0.0,
            f"the CPU's return never varies ({cpu[0]:.6g} in all {n} episodes), the card's differs in {differ.size} "
            f"(seed {int(paired.seeds[first])} first: {card[first]:.6g})",
            Interval.exact(float(np.mean(card - cpu))),
        )
    else:
        decision = decide(t_interval(card - cpu), margin, n)
        decision = replace(decision, reason=f"{decision.reason}; {rules.margin.describe(spread, source)}")
    detail = "; ".join([decision.reason, _parting(paired)])
    seeds = [int(s) for s, step in zip(paired.seeds, paired.card_steps, strict=True) if step is not None]
    first_step = next((step for step in paired.card_steps if step is not None), None)
    result = ReturnComparison.of(decision, n, _spread(card), _spread(cpu), None, detail)
    result = replace(result, episode_seed=seeds[0] if seeds else None, first_divergent_step=first_step)
    gating = rules.gating(True, decision.outcome)
    return Check("returns", CheckKind.EPISODE_RETURN, label, REFERENCE, gating, result)


def _exact(outcome: Outcome, margin: float, reason: str, difference: Interval | None = None) -> Decision:
    return Decision(outcome, difference or Interval.exact(0.0), margin, None, reason)


def _parting(paired: Paired) -> str:
    """Where the card's trajectories part from the CPU's, next to where an honest port's do."""

    def said(steps: list[int | None]) -> str:
        parted = [s for s in steps if s is not None]
        if not parted:
            return f"none of {len(steps)}"
        return f"{len(parted)} of {len(steps)} (median step {float(np.median(parted)):g}, first {min(parted)})"

    return f"trajectories part from the CPU's: this card {said(paired.card_steps)}, an honest port {said(paired.honest_steps)}"


def _spread(returns: np.ndarray) -> tuple[Interval, Interval]:
    """Mean and IQM of one side's returns, each with its interval; NaN where a return is not finite."""
    if not np.isfinite(returns).all():
        nan = Interval.exact(float("nan"))
        return nan, nan
    return interval(returns, mean), interval(returns, iqm)


@dataclass(frozen=True)
class Published:
    """A published score as the judge reads it: mean, standard deviation, of how many episodes
    (None where the files do not say), and where it was stated."""

    mean: float
    std: float
    n_episodes: int | None
    source: str


def judge_published(cpu: np.ndarray, score: Published, rules: ClosedLoopRules) -> Check:
    """The CPU float32's returns against the score the policy's files state: the interval of our
    mean minus the published mean (widened by the published mean's own uncertainty where its
    episode count is stated) against the margin, as `judge_returns` does."""
    n = int(cpu.size)
    ours, ours_iqm = _spread(cpu)
    spread = max(score.std, float(np.std(cpu, ddof=1)) if n > 1 else 0.0)
    margin = rules.margin.of(spread)
    stated = score.n_episodes is not None and score.n_episodes > 0
    # The published mean is one draw of its own: its 95% half-width, where we know of how many episodes.
    fixed = _Z95 * score.std / math.sqrt(score.n_episodes) if score.n_episodes else 0.0
    published = Interval(score.mean, score.mean - fixed, score.mean + fixed)
    shown = f"mean return {ours} over {n} episodes vs {score.mean:.6g} +/- {score.std:.6g} published ({score.source})"
    if not math.isfinite(ours.estimate):
        decision = _exact(Outcome.FAIL, margin, f"{shown}: a return is not finite")
    elif spread == 0 and (rules.margin.absolute is None or margin == 0):
        # Neither side ever varies: the returns are the published figure as printed (two decimals), or not.
        same = abs(ours.estimate - score.mean) <= PUBLISHED_ROUNDING
        outcome = Outcome.PASS if same else Outcome.FAIL
        decision = _exact(outcome, margin, f"{shown}: every return {'is' if same else 'differs from'} the published one")
    else:
        # Our mean's t interval, its spread at least the published one: under the published
        # score's own environment that is the spread, and four episodes that happen to agree
        # (four crashes of a lander) must not make our mean surer than it allows.
        gap = ours.estimate - score.mean
        half = math.hypot(t_interval(cpu, sd_floor=score.std).high - ours.estimate, fixed)
        difference = Interval(gap, gap - half, gap + half)
        decision = decide(difference, margin, n, fixed)
        source = "the published std" if score.std >= spread else "std"
        exact = "" if stated else "; the published mean taken as exact (its episode count is not stated)"
        decision = replace(decision, reason=f"{shown}: {decision.reason}; {rules.margin.describe(spread, source)}{exact}")
    if decision.outcome is Outcome.FAIL:
        decision = replace(decision, reason=f"{decision.reason}; {NOT_THE_AGENTS}")
    result = ReturnComparison.of(decision, n, (ours, ours_iqm), (published, None), score.std, decision.reason)
    gating = rules.gating(rules.published_gates, decision.outcome)
    return Check("returns", CheckKind.PUBLISHED_RETURN, REFERENCE, PUBLISHED, gating, result)


def _returns(episodes: list[EpisodeOutput]) -> np.ndarray:
    return np.asarray([e.episode_return for e in episodes], dtype=np.float64)
