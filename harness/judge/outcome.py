"""A run's status, its verdict and the exit code that follows from them: the one place that says
whether a run passed, for every command that ends a run or reads one back (the sweep, the bench,
their summaries, `harness report` and its page, JUnit, diagnose, repro, the Python API). Plain
values in, plain values out: the callers count the rows, this decides what they mean.

The verdict follows the run, never only the rows at hand: a sweep that has not finished is
INCOMPLETE however well its finished units went (they are read from its staging), and a bench
is a BENCH, titled by how many of its rows are results, not PASSED.

- FAILED, exit 1: a gating check failed (also one in the finished units of a run that has not
  finished: the rest cannot undo it), or the run says `failed` (a sweep that judged nothing ends
  `failed`).
- INCOMPLETE, exit 3: the sweep has not finished (`running`, `incomplete`, `interrupted`, or a
  status a later harness gives a run stopped short); `harness sweep --resume RUN_ID` finishes it.
- INTERRUPTED, exit 130: said only by the command whose own run a signal stopped, as a shell
  reports a process ended by SIGINT; read back afterwards, that run is INCOMPLETE like any other.
- NO CHECKS, exit 1: no gating check and no status that says why (rows written without a `runs`
  row): nothing was proved, and a gate that asks "did it pass" must hear no.
- BENCH, exit 0: a bench whose audit passed, whatever share of its rows is valid (the title says
  how many, and an invalid row is never a result).
- PASSED, exit 0: a finished sweep whose gating checks all passed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class RunStatus(StrEnum):
    """`runs.status`, as the column holds it: `running` from the row written once the actors are
    up, then how the run ended."""

    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    BENCH = "bench"
    # How a run that stopped early ends; both keep what was done, and `--resume RUN_ID` runs the rest.
    INCOMPLETE = "incomplete"  # the cluster lost a card or node, Ray did not start, or the results disk failed
    INTERRUPTED = "interrupted"  # Ctrl-C (SIGINT) or SIGTERM


# A run's status once all its tables are in place: the writer publishes them before the row that
# says so, and the views show the other tables' rows of such runs only.
PUBLISHED = (RunStatus.PASSED, RunStatus.FAILED, RunStatus.BENCH)
# The statuses a sweep ends with; any other but `bench` (running, incomplete, interrupted, or one a
# later harness adds for a run stopped short) is a run that has not finished.
FINISHED = (RunStatus.PASSED, RunStatus.FAILED)
NO_RUN_ROW = "unknown"  # rows written without a `runs` row (by hand, or by an older harness)


class Verdict(StrEnum):
    PASSED = "PASSED"
    FAILED = "FAILED"
    INCOMPLETE = "INCOMPLETE"
    INTERRUPTED = "INTERRUPTED"
    NO_CHECKS = "NO CHECKS"
    BENCH = "BENCH"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self]


EXIT_CODES = {
    Verdict.PASSED: 0,
    Verdict.BENCH: 0,
    Verdict.FAILED: 1,
    # Exit 1 as `harness sweep` gave it: nothing was proved, and a gate asking "did it pass" must hear no.
    Verdict.NO_CHECKS: 1,
    Verdict.INCOMPLETE: 3,
    Verdict.INTERRUPTED: 130,
}


def fails_the_run(gating: bool, passed: bool) -> bool:
    """Whether a check fails its run: a gating one that did not pass (a finding never does)."""
    return gating and not passed


@dataclass(frozen=True)
class Gating:
    """A run's gating checks, counted: what its verdict stands on."""

    checks: int = 0
    failed: int = 0

    @classmethod
    def count(cls, rows: Iterable[tuple[bool, bool]]) -> Gating:
        """From each check's (gating, passed)."""
        checks = failed = 0
        for gating, passed in rows:
            checks += gating
            failed += fails_the_run(gating, passed)
        return cls(checks, failed)

    @property
    def passed(self) -> bool:
        """Every gating check passed, and there was one: nothing proved is no pass."""
        return self.checks > 0 and not self.failed


def finished_status(gating: Gating) -> RunStatus:
    """How a sweep that judged every unit ends."""
    return RunStatus.PASSED if gating.passed else RunStatus.FAILED


def run_verdict(status: str, gating: Gating, n_bench_rows: int = 0, *, ending: bool = False) -> Verdict:
    """The verdict of a run with `runs.status` `status` (NO_RUN_ROW where it has none), whose
    checks (committed or staged) count `gating`, with `n_bench_rows` bench rows. `ending`: said by
    the command whose own run this is, as it ends: a run it stopped short ends by how it stopped
    (INCOMPLETE, or INTERRUPTED for a signal) whatever its finished units found, since what that
    command owes its caller is the resume, and `harness report` gives the verdict of those units."""
    if ending and unfinished(status):
        return Verdict.INTERRUPTED if status == RunStatus.INTERRUPTED else Verdict.INCOMPLETE
    if gating.failed:
        return Verdict.FAILED
    if is_bench(status, n_bench_rows):
        return Verdict.BENCH
    if status not in (*FINISHED, NO_RUN_ROW):
        return Verdict.INCOMPLETE
    if status == RunStatus.FAILED:
        return Verdict.FAILED
    return Verdict.PASSED if gating.checks else Verdict.NO_CHECKS


def is_bench(status: str, n_bench_rows: int) -> bool:
    """A bench's run: its row says so, or it has no row and has bench rows."""
    return status == RunStatus.BENCH or (status == NO_RUN_ROW and n_bench_rows > 0)


def unfinished(status: str) -> bool:
    """A sweep that stopped short or is still running: its finished units wait in the staging."""
    return status not in (*FINISHED, RunStatus.BENCH, NO_RUN_ROW)
