"""`--junit-xml PATH`: a run's gating checks as the JUnit XML that CI systems read, read back here
with junitparser (a reader of its own, as a CI system's is): one testcase per gating check, a
failure per failed one with its measures and detail, errors for an actor that produced nothing,
inconclusive verdicts skipped, the run's provenance in the suite's properties."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from junitparser import Error, Failure, JUnitXml, Skipped, TestCase

from harness.report.junit import junit_tree, write_junit
from tests.conftest import FAULTS_RUN, SharedSweeps
from tests.helpers import assert_usage_error, cli


def row(kind: str, passed: bool, gating: bool = True, **columns: Any) -> dict[str, Any]:
    where = {"policy": "cartpole", "dtype": "float32", "workload": "batch8", "output": "logits", "device_a": "sim-cpu1"}
    return {**where, "device_b": "sim-cpu0", "kind": kind, "passed": passed, "gating": gating, "detail": "", **columns}


def cases_of(path: Path) -> list[TestCase]:
    [suite] = list(JUnitXml.fromfile(str(path)))
    return list(suite)


def test_each_gating_row_is_a_testcase_and_only_those(tmp_path: Path) -> None:
    rows = [
        row("cross_card", True),
        row("cpu_reference", False, max_abs=0.5, atol=1e-5, detail="first mismatch at [3, 1]"),
        row("error", False, detail="ActorDiedError: the actor died"),
        row("episode_return", False, gating=False, outcome="inconclusive", detail="straddles the margin"),
        row("batch_invariance", False, gating=False, detail="a finding, not gating"),
        row("episode_return", False, gating=True, outcome="inconclusive", detail="--require-conclusive"),
    ]
    path = tmp_path / "run.xml"
    write_junit(path, junit_tree("r1", {"status": "failed", "torch_version": "2.13.0"}, rows, {"cartpole": "cp"}))
    cases = cases_of(path)
    assert len(cases) == 5  # the finding is no testcase
    results = [type(r) for case in cases for r in case.result]
    assert results.count(Failure) == 2 and results.count(Error) == 1 and results.count(Skipped) == 1
    failure = next(r for case in cases for r in case.result if isinstance(r, Failure) and "max_abs" in (r.text or ""))
    assert "first mismatch at [3, 1]" in failure.message and "max_abs = 0.5 (limit atol = 1e-05)" in failure.text
    assert cases[0].classname == "cp float32 cross_card" and cases[0].name == "batch8 logits sim-cpu1 vs sim-cpu0"
    [suite] = list(JUnitXml.fromfile(str(path)))
    props = {p.name: p.value for p in suite.properties()}
    assert props["run_id"] == "r1" and props["torch_version"] == "2.13.0"
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (5, 2, 1, 1)


def test_a_passed_run_has_no_failure(tmp_path: Path) -> None:
    path = tmp_path / "run.xml"
    write_junit(path, junit_tree("r2", {}, [row("cross_card", True), row("decisions", True)], {}))
    assert [case.is_passed for case in cases_of(path)] == [True, True]


@pytest.mark.slow
def test_a_sweep_with_faults_writes_one_testcase_per_gating_check_and_a_failure_per_failed_one(
    shared_sweeps: SharedSweeps,
) -> None:
    """The shared faults run (a fault on each of cards 1-3, card3:corrupt-weight among them) exits 1
    and its XML holds exactly its gating rows, failed where they failed."""
    results = shared_sweeps.faults()
    checks = ds.dataset(results / "checks", partitioning="hive").to_table().to_pylist()
    mine = [c for c in checks if c["run_id"] == FAULTS_RUN]
    gating = [c for c in mine if c["gating"]]
    failed = [c for c in gating if not c["passed"]]
    cases = cases_of(shared_sweeps.faults_junit)
    assert failed and len(cases) == len(gating) + sum(not c["gating"] and c.get("outcome") == "inconclusive" for c in mine)
    failures = [r for case in cases for r in case.result if isinstance(r, (Failure, Error))]
    assert len(failures) == len(failed)
    assert any("sim-cpu3" in case.name for case in cases if not case.is_passed)
    [suite] = list(JUnitXml.fromfile(str(shared_sweeps.faults_junit)))
    assert {p.name: p.value for p in suite.properties()}["run_id"] == FAULTS_RUN


@pytest.mark.parametrize("where", ["folder", "missing-folder"])
def test_a_junit_path_that_cannot_be_written_is_refused_before_ray(where: str, tmp_path: Path) -> None:
    path = tmp_path if where == "folder" else tmp_path / "absent" / "run.xml"
    proc = cli("sweep", "--junit-xml", str(path), "--results", str(tmp_path / "results"))
    assert_usage_error(proc, "--junit-xml")
    assert not (tmp_path / "results").exists()
