"""End to end: the real `harness sweep` on a local Ray with simulated cards, read back from Parquet.

Every check is also shown failing: each injected fault must turn the run red, with the failing
rows naming the card and the first mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.helpers import duckdb_rows, harness, read_table

pytestmark = pytest.mark.slow

SMALL = ["--policy", "cartpole", "--policy", "huggy-arch", "--dtypes", "float32,bfloat16", "--episodes", "2",
         "--batch-sizes", "1,8", "--no-progress", "--accelerator", "cpu"]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    results = tmp_path_factory.mktemp("clean")
    return results, harness("sweep", *SMALL, "--results", str(results), "--run-id", "clean")


def test_clean_sweep_passes_and_writes_every_table(clean_run: tuple[Path, object]) -> None:
    results, proc = clean_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "run clean: PASSED" in proc.stdout
    checks = read_table(results, "checks")
    assert checks.num_rows > 100
    assert set(checks.column("kind").to_pylist()) == {"cross_card", "cpu_reference"}
    assert all(checks.column("passed").to_pylist())
    assert set(checks.column("run_id").to_pylist()) == {"clean"}
    assert {"logits", "mu", "action", "stochastic_action", "returns"} <= set(checks.column("output").to_pylist())
    # Every row traces to the bytes that went in.
    assert all(len(h) == 64 for h in checks.column("input_sha256").to_pylist())
    cross = checks.filter(pc.equal(checks.column("kind"), "cross_card"))
    assert set(cross.column("device_a").to_pylist()) == {"sim-cpu1"}
    assert set(cross.column("device_b").to_pylist()) == {"sim-cpu0"}

    runs = read_table(results, "runs").to_pylist()
    assert len(runs) == 1 and runs[0]["status"] == "passed" and runs[0]["n_cards"] == 2
    devices = json.loads(runs[0]["devices"])
    assert [d["label"] for d in devices] == ["sim-cpu0", "sim-cpu1", "cpu"]
    assert all(d["simulated"] for d in devices[:2]) and not devices[2]["simulated"]
    assert json.loads(runs[0]["config_json"])["dtypes"] == ["float32", "bfloat16"]
    policies = {p["name"]: p for p in json.loads(runs[0]["policies"])}
    assert policies["huggy-arch"]["synthetic"] and policies["huggy-arch"]["detail"].startswith("SYNTHETIC")

    episodes = read_table(results, "episodes")
    # cartpole only: 2 dtypes x 2 modes x 2 seeds x (2 cards + the CPU reference)
    assert episodes.num_rows == 2 * 2 * 2 * 3
    assert set(episodes.column("length").to_pylist()) == {500}
    assert set(episodes.column("env_id").to_pylist()) == {"seals/CartPole-v0"}


def test_duckdb_reads_the_same_rows(clean_run: tuple[Path, object]) -> None:
    results, _ = clean_run
    [(n, failed)] = duckdb_rows(results, "SELECT count(*), count(*) FILTER (WHERE NOT passed) FROM checks", "checks")
    assert n == read_table(results, "checks").num_rows and failed == 0
    [(returns,)] = duckdb_rows(results, "SELECT min(episode_return) FROM episodes WHERE mode = 'deterministic'", "episodes")
    assert returns == 500.0  # the shipped cartpole balances the pole for the whole episode
    assert not list(results.glob(".staging/*")), "staging is removed once the run is written"


def _failed(results: Path) -> list[dict]:
    checks = read_table(results, "checks")
    return checks.filter(pc.invert(checks.column("passed"))).to_pylist()


def test_perturbed_weight_on_card1_fails_cross_card(tmp_path: Path) -> None:
    proc = harness("sweep", *SMALL, "--results", str(tmp_path), "--inject-fault", "card1:perturb-weight")
    assert proc.returncode == 1, proc.stderr[-3000:]
    failed = _failed(tmp_path)
    assert failed and {r["kind"] for r in failed} == {"cross_card"}
    assert {r["device_a"] for r in failed} == {"sim-cpu1"}
    assert all(r["detail"].startswith("first mismatch at [") and r["n_mismatch"] > 0 for r in failed)
    # ... and says where it broke: the perturbed weight is in the first Linear layer.
    assert all("first divergent layer: body.0 Linear(" in r["detail"] for r in failed), failed[0]["detail"]
    assert {r["policy"] for r in failed} == {"cartpole", "huggy-arch"}
    # One ULP of one weight stays inside the CPU tolerance: only the bitwise check can see it.
    [run] = read_table(tmp_path, "runs").to_pylist()
    assert run["status"] == "failed" and run["faults"] == "card1:perturb-weight"
    assert "FAIL" in proc.stdout


def test_mkl_avx2_on_card1_fails_cross_card(tmp_path: Path) -> None:
    proc = harness("sweep", "--policy", "huggy-arch", "--dtypes", "float32", "--batch-sizes", "1,8", "--no-progress",
                   "--accelerator", "cpu", "--results", str(tmp_path), "--inject-fault", "card1:mkl-avx2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    failed = _failed(tmp_path)
    assert failed and {(r["kind"], r["device_a"]) for r in failed} == {("cross_card", "sim-cpu1")}
    [run] = read_table(tmp_path, "runs").to_pylist()
    card1 = json.loads(run["devices"])[1]
    assert card1["runtime"]["mkl_cbwr"] == "AVX2"


def test_card_that_crashes_once_is_restarted_and_the_verdicts_hold(tmp_path: Path) -> None:
    proc = harness("sweep", "--policy", "cartpole", "--dtypes", "float32", "--episodes", "1", "--batch-sizes", "1,8",
                   "--no-progress", "--accelerator", "cpu", "--results", str(tmp_path), "--inject-fault", "card1:crash-once")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    checks = read_table(tmp_path, "checks")
    assert all(checks.column("passed").to_pylist()) and "error" not in checks.column("kind").to_pylist()
    [run] = read_table(tmp_path, "runs").to_pylist()
    assert run["faults"] == "card1:crash-once" and run["status"] == "passed"


def test_card_that_keeps_dying_is_recorded_and_the_rest_completes(tmp_path: Path) -> None:
    proc = harness("sweep", "--policy", "cartpole", "--dtypes", "float32", "--episodes", "1", "--batch-sizes", "1",
                   "--no-progress", "--accelerator", "cpu", "--results", str(tmp_path), "--inject-fault", "card1:crash-always")
    assert proc.returncode == 1
    checks = read_table(tmp_path, "checks")
    errors = checks.filter(pc.equal(checks.column("kind"), "error")).to_pylist()
    assert errors and {r["device_a"] for r in errors} == {"sim-cpu1"}
    # card 0 was still judged against the CPU on every unit
    ref = checks.filter(pc.equal(checks.column("kind"), "cpu_reference")).to_pylist()
    assert ref and {r["device_a"] for r in ref} == {"sim-cpu0"} and all(r["passed"] for r in ref)
    [run] = read_table(tmp_path, "runs").to_pylist()
    assert run["status"] == "failed" and "sim-cpu1" in json.loads(run["summary"])["dead_cards"]


def test_onnx_policy_is_judged_against_onnxruntime_and_a_broken_card_fails_both_references(cases: Path, tmp_path: Path) -> None:
    onnx = str(cases / "mlagents-3DBall" / "3DBall.onnx")
    args = ["--policy", onnx, "--dtypes", "float32", "--batch-sizes", "8", "--no-progress", "--accelerator", "cpu"]
    clean = harness("sweep", *args, "--results", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stderr[-3000:]
    checks = read_table(tmp_path / "clean", "checks")
    onnx_rows = checks.filter(pc.equal(checks.column("kind"), "onnx_reference")).to_pylist()
    assert onnx_rows and all(r["passed"] and r["device_b"] == "onnxruntime" and r["output"] == "action" for r in onnx_rows)

    broken = harness("sweep", *args, "--results", str(tmp_path / "broken"), "--inject-fault", "card1:corrupt-weight")
    assert broken.returncode == 1
    failed = _failed(tmp_path / "broken")
    assert {(r["kind"], r["device_a"]) for r in failed} == {("cross_card", "sim-cpu1"), ("cpu_reference", "sim-cpu1"), ("onnx_reference", "sim-cpu1")}
    ref_fail = next(r for r in failed if r["kind"] == "cpu_reference" and r["output"] == "mu")
    assert "max_abs" in ref_fail["detail"] and "first divergent layer: body.0 Linear(8, 128)" in ref_fail["detail"]
