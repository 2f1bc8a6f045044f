"""End to end: the real `harness sweep` on the session's Ray cluster with simulated cards, read
back from Parquet.

Every check is also shown failing: each injected fault must turn the run red, with the failing
rows naming the card and the first mismatch. Faults that do not interfere share one sweep, one
card each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.conftest import Head, SharedSweeps
from tests.helpers import cli, duckdb_rows, read_table

pytestmark = pytest.mark.slow

SMALL = ("--policy", "cartpole", "--policy", "huggy-arch", "--dtypes", "float32,bfloat16", "--episodes", "2", "--batch-sizes", "1,8", "--cards", "2")
# One fault per card; card 0 stays clean, so every other card is judged against an honest one.
FAULTS = ("--inject-fault", "card1:perturb-weight", "--inject-fault", "card2:mkl-avx2", "--inject-fault", "card3:corrupt-weight")
CRASHES = ("--inject-fault", "card1:crash-once", "--inject-fault", "card2:crash-always")


def clean_run(sweeps: SharedSweeps) -> Path:
    sweeps.run("clean", *SMALL)
    return sweeps.results


def faults_run(sweeps: SharedSweeps, cases: Path) -> Path:
    """cartpole, huggy-arch and the ML-Agents 3DBall export on 4 cards, a fault on each of cards 1-3."""
    onnx = str(cases / "mlagents-3DBall" / "3DBall.onnx")
    sweeps.run("faults", *SMALL[:-2], "--policy", onnx, "--cards", "4", *FAULTS, expect=1)
    return sweeps.results


def _rows(results: Path, table: str, run_id: str) -> list[dict]:
    rows = read_table(results, table)
    return rows.filter(pc.equal(rows.column("run_id"), run_id)).to_pylist()


def _failed(results: Path, run_id: str) -> list[dict]:
    return [r for r in _rows(results, "checks", run_id) if not r["passed"]]


def test_clean_sweep_passes_and_writes_every_table(shared_sweeps: SharedSweeps) -> None:
    results = clean_run(shared_sweeps)
    assert "run clean: PASSED" in shared_sweeps.procs["clean"].stdout
    checks = _rows(results, "checks", "clean")
    assert len(checks) > 100
    assert {r["kind"] for r in checks} == {"cross_card", "cpu_reference"}
    assert all(r["passed"] for r in checks)
    assert {"logits", "mu", "action", "stochastic_action", "returns"} <= {r["output"] for r in checks}
    # Every row traces to the bytes that went in.
    assert all(len(r["input_sha256"]) == 64 for r in checks)
    cross = [r for r in checks if r["kind"] == "cross_card"]
    assert {r["device_a"] for r in cross} == {"sim-cpu1"} and {r["device_b"] for r in cross} == {"sim-cpu0"}

    [run] = _rows(results, "runs", "clean")
    assert run["status"] == "passed" and run["n_cards"] == 2
    devices = json.loads(run["devices"])
    assert [d["label"] for d in devices] == ["sim-cpu0", "sim-cpu1", "cpu"]
    assert all(d["simulated"] for d in devices[:2]) and not devices[2]["simulated"]
    assert json.loads(run["config_json"])["dtypes"] == ["float32", "bfloat16"]
    policies = {p["name"]: p for p in json.loads(run["policies"])}
    assert policies["huggy-arch"]["synthetic"] and policies["huggy-arch"]["detail"].startswith("SYNTHETIC")

    episodes = _rows(results, "episodes", "clean")
    # cartpole only: 2 dtypes x 2 modes x 2 seeds x (2 cards + the CPU reference)
    assert len(episodes) == 2 * 2 * 2 * 3
    assert {e["length"] for e in episodes} == {500}
    assert {e["env_id"] for e in episodes} == {"seals/CartPole-v0"}


def test_duckdb_reads_the_same_rows(shared_sweeps: SharedSweeps) -> None:
    results = clean_run(shared_sweeps)
    [(n, failed)] = duckdb_rows(results, "SELECT count(*), count(*) FILTER (WHERE NOT passed) FROM checks WHERE run_id = 'clean'", "checks")
    assert n == len(_rows(results, "checks", "clean")) and failed == 0
    [(returns,)] = duckdb_rows(results, "SELECT min(episode_return) FROM episodes WHERE mode = 'deterministic' AND run_id = 'clean'", "episodes")
    assert returns == 500.0  # the shipped cartpole balances the pole for the whole episode
    assert not list(results.glob(".staging/clean*")), "staging is removed once the run is written"


def test_perturbed_weight_fails_cross_card_only_and_names_the_layer(shared_sweeps: SharedSweeps, cases: Path) -> None:
    results = faults_run(shared_sweeps, cases)
    failed = [r for r in _failed(results, "faults") if r["device_a"] == "sim-cpu1"]
    assert failed and {r["kind"] for r in failed} == {"cross_card"}
    assert all(r["detail"].startswith("first mismatch at [") and r["n_mismatch"] > 0 for r in failed)
    # ... and says where it broke: the perturbed weight is in the first Linear layer.
    assert all("first divergent layer: body.0 Linear(" in r["detail"] for r in failed), failed[0]["detail"]
    # One ULP of one weight stays inside the CPU tolerance: only the bitwise check can see it.
    assert {r["policy"] for r in failed} >= {"cartpole", "huggy-arch"}
    [run] = _rows(results, "runs", "faults")
    assert run["status"] == "failed" and run["faults"] == "card1:perturb-weight,card2:mkl-avx2,card3:corrupt-weight"
    assert "FAIL" in shared_sweeps.procs["faults"].stdout


def test_mkl_avx2_fails_cross_card_only(shared_sweeps: SharedSweeps, cases: Path) -> None:
    results = faults_run(shared_sweeps, cases)
    failed = [r for r in _failed(results, "faults") if r["device_a"] == "sim-cpu2"]
    assert failed and {r["kind"] for r in failed} == {"cross_card"}
    [run] = _rows(results, "runs", "faults")
    card2 = json.loads(run["devices"])[2]
    assert card2["runtime"]["mkl_cbwr"] == "AVX2" and card2["faults"] == ["card2:mkl-avx2"]


def test_corrupt_weight_fails_both_references_and_onnx_cards_pass_onnxruntime(shared_sweeps: SharedSweeps, cases: Path) -> None:
    results = faults_run(shared_sweeps, cases)
    onnx_rows = [r for r in _rows(results, "checks", "faults") if r["kind"] == "onnx_reference"]
    assert onnx_rows and {r["device_b"] for r in onnx_rows} == {"onnxruntime"} and {r["output"] for r in onnx_rows} == {"action"}
    assert all(r["passed"] for r in onnx_rows if r["device_a"] != "sim-cpu3")

    failed = [r for r in _failed(results, "faults") if r["device_a"] == "sim-cpu3"]
    kinds = {(r["policy"].rsplit("/", 1)[-1], r["kind"]) for r in failed}
    assert {("3DBall.onnx", "cross_card"), ("3DBall.onnx", "cpu_reference"), ("3DBall.onnx", "onnx_reference")} <= kinds
    ref_fail = next(r for r in failed if r["kind"] == "cpu_reference" and r["output"] == "mu" and r["policy"].endswith("3DBall.onnx"))
    assert "max_abs" in ref_fail["detail"] and "first divergent layer: body.0 Linear(8, 128)" in ref_fail["detail"]


def test_a_card_that_crashes_once_is_restarted_and_one_that_keeps_dying_is_recorded(ray_head: Head, tmp_path: Path) -> None:
    results = tmp_path
    proc = cli("sweep", "--policy", "cartpole", "--dtypes", "float32", "--episodes", "1", "--batch-sizes", "1,8", "--cards", "3",
               *CRASHES, "--accelerator", "cpu", "--no-progress", "--address", ray_head.address, "--results", str(results), "--run-id", "crashes")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    checks = _rows(results, "checks", "crashes")
    errors = [r for r in checks if r["kind"] == "error"]
    assert errors and {r["device_a"] for r in errors} == {"sim-cpu2"}, proc.stdout[-2000:]
    # card 1 died once, was restarted and retried: its verdicts hold, as card 0's do
    judged = [r for r in checks if r["kind"] != "error"]
    assert {r["device_a"] for r in judged} == {"sim-cpu0", "sim-cpu1"} and all(r["passed"] for r in judged)
    [run] = _rows(results, "runs", "crashes")
    assert run["status"] == "failed" and json.loads(run["summary"])["dead_cards"] == ["sim-cpu2"]
    assert run["faults"] == "card1:crash-once,card2:crash-always"
