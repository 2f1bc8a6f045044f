"""The kinds of check a sweep (and a bench's audit) makes: one enum, so a kind added here and not
given its result types in harness/judge/results.py is a type error (`result_types` matches over
it and ends in `assert_never`), never a row misrouted to a default branch; the summary and the
report ask the result. The values are the `checks.kind` column."""

from __future__ import annotations

from enum import StrEnum


class CheckKind(StrEnum):
    """In the order results list them: what failed to run, the port rule, then the dtype's."""

    ERROR = "error"
    """A card that produced nothing (died, kept dying)."""
    CROSS_CARD = "cross_card"
    """Every card against card 0, bit for bit: outputs, episode trajectories and returns."""
    CPU_REFERENCE = "cpu_reference"
    """A card against the float64 golden, relative to the CPU's own error in the card's dtype."""
    DECISIONS = "decisions"
    """Discrete actions against the golden's; a flip passes only as a near-tie."""
    EPISODE_RETURN = "episode_return"
    """A card's mean episode return against the CPU float32's."""
    TOLERANCE = "tolerance"
    """The fixed atol/rtol table against the CPU float32 output."""
    ONNX_REFERENCE = "onnx_reference"
    """The loader: onnxruntime on the original file against the golden, by the port rule."""
    BATCH_INVARIANCE = "batch_invariance"
    """A card's rows alone against the same rows inside a large batch, on the same card."""
    PUBLISHED_RETURN = "published_return"
    """The CPU float32's mean episode return against the score the policy's files state."""
    FIRST_NONFINITE = "first_nonfinite"
    """A finding: the first layer where a card's NaN or inf appeared (the golden finite there)."""
    BENCH_AUDIT = "bench_audit"
    """A bench's timed path against the sweep's run_batch, same card, same input, bit for bit."""
    MASKED_ACTIONS = "masked_actions"
    """A masked policy's actions against the masks they were chosen under: none forbidden, on any card."""
