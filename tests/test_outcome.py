"""A run's verdict and exit code, decided once (harness/judge/outcome.py), and the commands that
read a run back holding to it: a run whose row says passed but whose rows hold a failed gating
check, a bench whose audit failed, a run that never finished. The rows are written to Parquet as
a run writes them and read back by the real `harness report`."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

from harness.judge.outcome import Gating, RunStatus, Verdict, fails_the_run, finished_status, run_verdict, unfinished
from harness.report.summary import gating_of, print_summary
from harness.store.writer import to_table, write_atomic, write_rows
from tests.helpers import cli, run_row
from tests.test_report import check_row


def test_a_gating_check_that_did_not_pass_fails_the_run_and_a_finding_never_does() -> None:
    assert fails_the_run(True, False) and not fails_the_run(True, True)
    assert not fails_the_run(False, False) and not fails_the_run(False, True)
    assert Gating.count([(True, True), (True, False), (False, False)]) == Gating(checks=2, failed=1)


def test_a_sweep_ends_passed_only_where_something_gated_and_nothing_failed() -> None:
    assert finished_status(Gating(3, 0)) == RunStatus.PASSED
    assert finished_status(Gating(3, 1)) == RunStatus.FAILED
    assert finished_status(Gating(0, 0)) == RunStatus.FAILED, "nothing proved is no pass"


def test_a_row_that_says_passed_does_not_hide_a_failed_gating_check() -> None:
    assert run_verdict(RunStatus.PASSED, Gating(5, 1)) is Verdict.FAILED
    assert run_verdict(RunStatus.PASSED, Gating(5, 1)).exit_code == 1


def test_a_bench_whose_audit_failed_is_failed() -> None:
    assert run_verdict(RunStatus.BENCH, Gating(24, 1), 18, ending=True) is Verdict.FAILED
    assert run_verdict(RunStatus.BENCH, Gating(24, 0), 18, ending=True) is Verdict.BENCH
    assert run_verdict(RunStatus.BENCH, Gating(), 0, ending=True).exit_code == 0, (
        "an audit that sampled nothing failed nothing"
    )


def test_the_command_whose_run_stopped_short_exits_by_how_it_stopped() -> None:
    """The sweep that was stopped exits 3 (or 130 for a signal) whatever its finished units found;
    the same run read back afterwards is judged by those units."""
    for status, verdict, code in (
        (RunStatus.INCOMPLETE, Verdict.INCOMPLETE, 3),
        (RunStatus.INTERRUPTED, Verdict.INTERRUPTED, 130),
    ):
        ended = run_verdict(status, Gating(4, 1), ending=True)
        assert (ended, ended.exit_code) == (verdict, code)
        assert run_verdict(status, Gating(4, 0)) is Verdict.INCOMPLETE, "read back, it is unfinished"
        assert run_verdict(status, Gating(4, 1)) is Verdict.FAILED, "read back, a failure found so far stands"
    assert run_verdict(RunStatus.RUNNING, Gating(4, 0)).exit_code == 3


def test_the_status_strings_are_the_runs_column_values() -> None:
    assert [str(s) for s in RunStatus] == ["running", "passed", "failed", "bench", "incomplete", "interrupted"]


def test_the_sweep_summary_says_the_verdict_it_was_given_and_the_rows_it_counted() -> None:
    rows = [check_row(True, 0.01), check_row(False, 0.2), check_row(False, 0.2, gating=False)]
    checks = to_table("checks", rows)
    assert gating_of(checks) == Gating(checks=2, failed=1)
    out = io.StringIO()
    print_summary(checks, "r", run_verdict(finished_status(gating_of(checks)), gating_of(checks)), out)
    assert out.getvalue().splitlines()[-1] == "run r: FAILED (3 checks, 2 gating, 1 failed)"


def _report(results: Path, run_id: str, status: str, passed: list[bool]) -> tuple[int, str]:
    """`harness report` of a run with `status` and one gating check per unit; an unfinished run's
    checks staged unit by unit, as a sweep stages them, a finished run's committed."""
    rows = [replace(check_row(p, 0.01), unit_id=f"u{i}") for i, p in enumerate(passed)]
    if unfinished(status):
        staging = results / ".staging" / run_id
        for row in rows:
            write_atomic(to_table("checks", [row]), staging / f"{row.unit_id}.checks.parquet")
            (staging / f"{row.unit_id}.done").touch()
    else:
        write_rows(results, "checks", run_id, rows)
    write_rows(results, "runs", run_id, [run_row(status)])
    proc = cli("report", run_id, "--results", str(results))
    return proc.returncode, proc.stdout.splitlines()[0]


def test_the_report_of_a_run_that_says_passed_with_a_failed_gating_row_is_failed(tmp_path: Path) -> None:
    code, headline = _report(tmp_path, "lied", "passed", [True, False])
    assert code == 1 and headline.startswith("run lied: FAILED (status passed; 2 checks, 2 gating, 1 failed"), headline
    code, headline = _report(tmp_path, "honest", "passed", [True, True])
    assert code == 0 and headline.startswith("run honest: PASSED (status passed;"), headline


def test_the_report_of_a_run_that_never_finished_is_incomplete(tmp_path: Path) -> None:
    code, headline = _report(tmp_path, "cut", "running", [True, True])
    assert code == 3 and headline.startswith("run cut: INCOMPLETE (status running; not finished: 2 units done"), headline
    code, headline = _report(tmp_path, "cut-failing", "interrupted", [True, False])
    assert code == 1 and headline.startswith("run cut-failing: FAILED (status interrupted; not finished: 2 units"), headline
