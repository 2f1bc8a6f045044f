"""A run's verdict as `harness report` states it, and the exit code that follows from it.

The verdict follows the run, never only the rows at hand: a sweep that has not finished is
INCOMPLETE however well its finished units went (they are read from its staging), and a bench
is a BENCH, titled by how many of its rows are results, not PASSED.

- FAILED, exit 1: a gating check failed (also one in the finished units of a run that has not
  finished: the rest cannot undo it), or the run says `failed` or `error` (a sweep that judged
  nothing ends `failed`).
- INCOMPLETE, exit 3: the sweep has not finished (`running`, `incomplete`, or a status a later
  harness gives a run stopped short); `harness sweep --resume RUN_ID` finishes it.
- NO CHECKS, exit 1: no gating check and no status that says why (rows written without a `runs`
  row): nothing was proved, and a gate that asks "did it pass" must hear no.
- BENCH, exit 0: a bench whose audit passed, whatever share of its rows is valid (the title says
  how many, and an invalid row is never a result).
- PASSED, exit 0: a finished sweep whose gating checks all passed.
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    PASSED = "PASSED"
    FAILED = "FAILED"
    INCOMPLETE = "INCOMPLETE"
    NO_CHECKS = "NO CHECKS"
    BENCH = "BENCH"


EXIT_CODES = {
    Verdict.PASSED: 0,
    Verdict.BENCH: 0,
    Verdict.FAILED: 1,
    # Exit 1 as `harness sweep` gave it: nothing was proved, and a gate asking "did it pass" must hear no.
    Verdict.NO_CHECKS: 1,
    Verdict.INCOMPLETE: 3,
}

# The statuses a sweep ends with (harness/sweeps/driver.py); any other (running, incomplete,
# interrupted, or one a later harness adds for a run stopped short) is a run that has not finished.
FINISHED = ("passed", "failed")
BENCH_STATUS = "bench"
NO_RUN_ROW = "unknown"  # rows written without a `runs` row (by hand, or by an older harness)


def run_verdict(status: str, n_gating: int, n_failed: int, n_bench_rows: int) -> Verdict:
    """The verdict of a run with `runs.status` `status` (NO_RUN_ROW where it has none), whose
    checks (committed or staged) hold `n_gating` gating rows of which `n_failed` failed."""
    if n_failed:
        return Verdict.FAILED
    if status == BENCH_STATUS or (status == NO_RUN_ROW and n_bench_rows):
        return Verdict.BENCH
    if status not in (*FINISHED, NO_RUN_ROW):
        return Verdict.INCOMPLETE
    if status == "failed":
        return Verdict.FAILED
    return Verdict.PASSED if n_gating else Verdict.NO_CHECKS


def unfinished(status: str) -> bool:
    """A sweep that stopped short or is still running: its finished units wait in the staging."""
    return status not in (*FINISHED, BENCH_STATUS, NO_RUN_ROW)
