"""End to end: the real `harness sweep` on the session's Ray cluster with simulated cards, read
back from Parquet.

Every check is also shown failing: each injected fault must turn the run red on exactly the rows
it should, naming the card and where it broke. Faults that do not interfere share one sweep, one
card each; faults on every card (`all:`) show what `cross_card` cannot see.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.builders import EXPERT_ZIP, MLAGENTS_EXPORT
from tests.conftest import Head, SharedSweeps
from tests.helpers import duckdb_rows, read_table, sweep_on
from tests.third_party import BALL, BALL_SHA256, ZOO_SHA256, ZOO_ZIP

pytestmark = pytest.mark.slow

# Card 3 hangs on its first unit: found hung past its deadline, killed and restarted once.
CRASHES = (
    "--inject-fault",
    "card1:crash-once",
    "--inject-fault",
    "card2:crash-always",
    "--inject-fault",
    "card3:hang-once",
    "--hang-timeout",
    "5",
)


def _rows(results: Path, table: str, run_id: str) -> list[dict]:
    rows = read_table(results, table)
    return rows.filter(pc.equal(rows.column("run_id"), run_id)).to_pylist()


def _failed(results: Path, run_id: str) -> list[dict]:
    return [r for r in _rows(results, "checks", run_id) if not r["passed"]]


def _name(row: dict) -> str:
    return row["policy"].rsplit("/", 1)[-1]


def test_clean_sweep_passes_and_writes_every_table(shared_sweeps: SharedSweeps) -> None:
    results = shared_sweeps.clean()
    assert "run clean: PASSED" in shared_sweeps.procs["clean"].stdout
    checks = _rows(results, "checks", "clean")
    assert {r["kind"] for r in checks} == {
        "cross_card",
        "cpu_reference",
        "decisions",
        "tolerance",
        "batch_invariance",
        "episode_return",
    }
    assert all(r["passed"] for r in checks if r["gating"])
    # Every row traces to the bytes that went in, and says whether it counts.
    assert all(len(r["input_sha256"]) == 64 and r["gating"] is not None for r in checks)
    cross = [r for r in checks if r["kind"] == "cross_card"]
    assert {r["device_a"] for r in cross} == {"sim-cpu1"} and {r["device_b"] for r in cross} == {"sim-cpu0"}
    port = [r for r in checks if r["kind"] == "cpu_reference"]
    assert {r["device_b"] for r in port} == {"cpu-float64"} and all(r["gating"] for r in port)
    # Simulated cards compute exactly as the CPU in their dtype: the ratio is 1, or under it where the floor rules.
    assert all(0 < r["error_ratio"] <= 1.0 and r["ratio_limit"] in (3.0, 5.0, 10.0) for r in port)

    [run] = _rows(results, "runs", "clean")
    assert run["status"] == "passed" and run["n_cards"] == 2
    devices = json.loads(run["devices"])
    assert [d["label"] for d in devices] == ["sim-cpu0", "sim-cpu1", "cpu"]
    assert all(d["simulated"] for d in devices[:2]) and not devices[2]["simulated"]
    assert all(d["settings"]["precision"] == "strict" for d in devices)
    assert json.loads(run["config_json"])["dtypes"] == ["float32", "float16"]
    policies = {p["name"]: p for p in json.loads(run["policies"])}
    assert policies["huggy-arch"]["synthetic"] and policies["huggy-arch"]["detail"].startswith("SYNTHETIC")
    summary = json.loads(run["summary"])
    assert summary["without_episodes"] == {"huggy-arch": "--env ENV_ID"}
    assert {"float64", "float32", "float16"} <= set(summary["reference_s"])


def test_the_float16_false_alarm_is_a_finding_not_a_failure(shared_sweeps: SharedSweeps) -> None:
    results = shared_sweeps.clean()
    rows = [
        r
        for r in _rows(results, "checks", "clean")
        if _name(r) == EXPERT_ZIP and r["dtype"] == "float16" and r["output"] == "logits"
    ]
    table = [r for r in rows if r["kind"] == "tolerance" and not r["passed"]]
    assert table and all(not r["gating"] for r in table)
    assert all(r["max_abs"] > r["atol"] + r["rtol"] * r["ref_max_abs"] for r in table)  # re-judged from its own columns
    assert all(r["passed"] for r in rows if r["kind"] == "cpu_reference")
    assert "finding" in shared_sweeps.procs["clean"].stdout


def test_episodes_for_every_policy_with_an_environment_in_lockstep(shared_sweeps: SharedSweeps) -> None:
    results = shared_sweeps.clean()
    episodes = _rows(results, "episodes", "clean")
    by_policy = {_name(e): e["env_id"] for e in episodes}
    assert by_policy == {"cartpole": "seals/CartPole-v0", EXPERT_ZIP: "CartPole-v1"}  # the RL Zoo's args.yml, no --env
    # 2 policies x 2 dtypes x 2 modes x 2 seeds x (2 cards + the CPU reference + its replay as an honest port)
    assert len(episodes) == 2 * 2 * 2 * 2 * 4
    assert {(e["batching"], e["batch_size"]) for e in episodes} == {("lockstep", 2)}
    assert {e["length"] for e in episodes if e["env_id"] == "seals/CartPole-v0"} == {500}


def test_duckdb_reads_the_same_rows(shared_sweeps: SharedSweeps) -> None:
    results = shared_sweeps.clean()
    [(n, failed)] = duckdb_rows(
        results, "SELECT count(*), count(*) FILTER (WHERE gating AND NOT passed) FROM checks WHERE run_id = 'clean'", "checks"
    )
    assert n == len(_rows(results, "checks", "clean")) and failed == 0
    [(returns,)] = duckdb_rows(
        results,
        "SELECT min(episode_return) FROM episodes WHERE mode = 'deterministic' AND run_id = 'clean' AND policy = 'cartpole'",
        "episodes",
    )
    assert returns == 500.0  # the shipped cartpole balances the pole for the whole episode
    assert not list(results.glob(".staging/clean*")), "staging is removed once the run is written"


def test_the_third_party_policies_sweep_as_their_stand_ins_do(cases: Path, ray_head: Head, tmp_path: Path) -> None:
    """The real RL Zoo CartPole-v1 (SB3 1.0rc0) and ML-Agents 3DBall, swept on one card: what the
    shared sweeps show on their stand-ins holds for them, and the published expert balances the pole."""
    zoo, ball = cases / ZOO_ZIP, cases / BALL
    proc = sweep_on(
        ray_head.address,
        tmp_path,
        "--policy",
        str(zoo),
        "--policy",
        str(ball),
        "--dtypes",
        "float32,float16",
        "--episodes",
        "1",
        "--batch-sizes",
        "4096",
        "--seed",
        "1",
        "--cards",
        "1",
        "--run-id",
        "third-party",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "run third-party: PASSED" in proc.stdout and "finding" in proc.stdout
    [run] = _rows(tmp_path, "runs", "third-party")
    policies = {p["name"]: p for p in json.loads(run["policies"])}
    assert (policies[str(zoo)]["sha256"], policies[str(ball)]["sha256"]) == (ZOO_SHA256, BALL_SHA256)
    checks = _rows(tmp_path, "checks", "third-party")
    zoo16 = [r for r in checks if r["policy"] == str(zoo) and r["dtype"] == "float16" and r["output"] == "logits"]
    assert any(r["kind"] == "tolerance" and not r["passed"] and not r["gating"] for r in zoo16), "the float16 false alarm"
    port = [r for r in zoo16 if r["kind"] == "cpu_reference"]
    assert port and all(r["passed"] for r in port)
    loader = [r for r in checks if r["kind"] == "onnx_reference" and r["policy"] == str(ball)]
    assert loader and all(r["passed"] and r["gating"] for r in loader)
    episodes = _rows(tmp_path, "episodes", "third-party")
    assert {e["env_id"] for e in episodes} == {"CartPole-v1"}  # its args.yml names it; 3DBall names none
    assert {e["episode_return"] for e in episodes if e["mode"] == "deterministic"} == {500.0}


def test_perturbed_weight_fails_cross_card_only_and_names_the_layer(shared_sweeps: SharedSweeps) -> None:
    results = shared_sweeps.faults()
    failed = [r for r in _failed(results, "faults") if r["device_a"] == "sim-cpu1" and r["gating"]]
    assert failed and {r["kind"] for r in failed} == {"cross_card"}
    assert all(
        r["detail"].startswith("first mismatch at [") and r["n_mismatch"] > 0 for r in failed if r["output"] != "actions"
    )
    # ... and says where it broke: the perturbed weight is in the first Linear layer.
    batch_rows = [r for r in failed if not r["workload"].startswith(("episodes", "invariance"))]
    assert all("first divergent layer: body.0 Linear(" in r["detail"] for r in batch_rows), batch_rows[0]["detail"]
    # One ULP of one weight is within the port rule: only the bitwise check can see it.
    assert {r["policy"] for r in failed} >= {"cartpole", "huggy-arch"}
    [run] = _rows(results, "runs", "faults")
    assert run["status"] == "failed" and run["faults"] == "card1:perturb-weight,card2:mkl-avx2,card3:corrupt-weight"
    assert "FAIL" in shared_sweeps.procs["faults"].stdout


def test_an_honest_other_gemm_path_fails_cross_card_but_passes_the_port(shared_sweeps: SharedSweeps) -> None:
    results = shared_sweeps.faults()
    rows = [r for r in _rows(results, "checks", "faults") if r["device_a"] == "sim-cpu2"]
    assert {r["kind"] for r in rows if r["gating"] and not r["passed"]} == {"cross_card"}
    port = [r for r in rows if r["kind"] == "cpu_reference" and r["policy"] == "huggy-arch"]
    assert all(r["passed"] for r in port) and any(r["error_ratio"] != 1.0 for r in port), "the limits are exercised"
    [run] = _rows(results, "runs", "faults")
    card2 = json.loads(run["devices"])[2]
    assert card2["runtime"]["mkl_cbwr"] == "AVX2" and card2["faults"] == ["card2:mkl-avx2"]


def test_a_corrupt_weight_fails_the_port_and_the_decisions(shared_sweeps: SharedSweeps) -> None:
    results = shared_sweeps.faults()
    failed = [r for r in _failed(results, "faults") if r["device_a"] == "sim-cpu3"]
    kinds = {(_name(r), r["kind"]) for r in failed}
    assert {
        (MLAGENTS_EXPORT, "cross_card"),
        (MLAGENTS_EXPORT, "cpu_reference"),
        ("cartpole", "cpu_reference"),
        ("cartpole", "decisions"),
    } <= kinds
    port = next(r for r in failed if r["kind"] == "cpu_reference" and r["output"] == "mu" and _name(r) == MLAGENTS_EXPORT)
    assert "error_ratio" in port["detail"] and "first layer off the golden: body.0 Linear(8, 128)" in port["detail"]


def test_the_onnx_loader_is_checked_against_onnxruntime_once_per_batch(shared_sweeps: SharedSweeps) -> None:
    results = shared_sweeps.faults()
    rows = [r for r in _rows(results, "checks", "faults") if r["kind"] == "onnx_reference"]
    assert rows and {(r["device_a"], r["device_b"], r["output"], r["dtype"]) for r in rows} == {
        ("onnxruntime", "cpu-float64", "action", "float32")
    }
    assert all(r["passed"] and r["gating"] for r in rows)
    assert len(rows) == len({r["workload"] for r in rows}), "one row per batch, not per card: it checks the loader"


def test_a_defect_common_to_every_card_is_caught_against_the_golden(ray_head: Head, tmp_path: Path) -> None:
    """TF32-style float32 and a float16 accumulator on every card: the cards agree bit for bit, so
    only the port rule can see it."""
    proc = sweep_on(
        ray_head.address,
        tmp_path,
        "--policy",
        "cartpole",
        "--policy",
        "huggy-arch",
        "--dtypes",
        "float32,float16",
        "--episodes",
        "0",
        "--batch-sizes",
        "1,8,4096",
        "--inject-fault",
        "all:reduced-fp32",
        "--inject-fault",
        "all:fp16-accumulate",
        "--cards",
        "2",
        "--run-id",
        "all",
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    checks = _rows(tmp_path, "checks", "all")
    assert all(r["bitwise_equal"] for r in checks if r["kind"] == "cross_card")
    float32 = [
        r for r in checks if r["kind"] == "cpu_reference" and r["dtype"] == "float32" and r["output"] in ("logits", "mu")
    ]
    assert float32 and not any(r["passed"] for r in float32), "at every batch size"
    assert all(r["error_ratio"] > 100 for r in float32 if r["workload"] == "normal-b4096-s0")
    float16 = [r for r in checks if r["kind"] == "cpu_reference" and r["dtype"] == "float16" and r["policy"] == "huggy-arch"]
    assert not any(r["passed"] for r in float16 if r["workload"] == "normal-b4096-s0" and r["output"] == "mu")
    [run] = _rows(tmp_path, "runs", "all")
    assert run["faults"] == "all:reduced-fp32,all:fp16-accumulate" and run["status"] == "failed"


def test_a_sweep_says_what_it_starts_which_environment_it_played_and_where_the_time_went(
    ray_head: Head, tmp_path: Path
) -> None:
    """As it starts: Ray, then each actor as it comes up, then the units. At the end: the
    environment played instead of --env and why (cartpole names its own), the phases, and the
    command that reports the run."""
    proc = sweep_on(
        ray_head.address,
        tmp_path,
        *("--policy", "cartpole", "--env", "CartPole-v1", "--dtypes", "float32", "--batch-sizes", "1"),
        *("--episodes", "1", "--cards", "2", "--run-id", "said"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == f"joining the Ray cluster at {ray_head.address}"
    assert lines[1].startswith("Ray up in ") and "'NPU': 4.0" in lines[1]
    ups = [line for line in lines if line.startswith("actors ")]
    assert [u.split(":")[0] for u in ups] == ["actors 1/3 up", "actors 2/3 up", "actors 3/3 up"], ups
    assert {u.split(": ", 1)[1].split(" on ")[0] for u in ups} == {"sim-cpu0", "sim-cpu1", "cpu"}
    assert (
        "  cartpole plays seals/CartPole-v0 (built in), not --env CartPole-v1: --env gives an environment to the policies "
        "that name none; [envs] in a --config file sets one per policy"
    ) in lines
    assert {r["env_id"] for r in _rows(tmp_path, "episodes", "said")} == {"seals/CartPole-v0"}
    *_, verdict, phases, report = lines
    assert verdict.startswith("run said: PASSED")
    for phase in ("Ray start-up", "actors start-up", "compute", "judge", "write", "Ray shutdown"):
        assert f"{phase} " in phases, phases
    assert phases.startswith("time: ") and " s in all (" in phases
    assert report == f"report: harness report said --results {tmp_path}"
    [run] = _rows(tmp_path, "runs", "said")
    notes = json.loads(run["summary"])["env_notes"]
    assert len(notes) == 1 and notes[0].startswith("cartpole plays seals/CartPole-v0")
    assert set(json.loads(run["summary"])["timings_s"]) >= {"ray_s", "actors_s", "compute_s", "judge_s", "write_s"}


@pytest.mark.ray_recovery
def test_a_card_that_crashes_or_hangs_once_is_restarted_and_one_that_keeps_dying_is_recorded(
    ray_head: Head, tmp_path: Path
) -> None:
    results = tmp_path
    proc = sweep_on(
        ray_head.address,
        results,
        "--policy",
        "cartpole",
        "--dtypes",
        "float32",
        "--episodes",
        "1",
        "--batch-sizes",
        "1,8",
        "--cards",
        "4",
        *CRASHES,
        "--run-id",
        "crashes",
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    checks = _rows(results, "checks", "crashes")
    errors = [r for r in checks if r["kind"] == "error"]
    assert errors and {r["device_a"] for r in errors} == {"sim-cpu2"} and all(r["gating"] for r in errors)
    # card 1 died once and card 3 hung once, each was restarted and retried: their verdicts hold, as card 0's do
    judged = [r for r in checks if r["kind"] != "error" and r["gating"]]
    assert {r["device_a"] for r in judged} == {"sim-cpu0", "sim-cpu1", "sim-cpu3"} and all(r["passed"] for r in judged)
    [run] = _rows(results, "runs", "crashes")
    summary = json.loads(run["summary"])
    assert run["status"] == "failed" and summary["dead_cards"] == ["sim-cpu2"]
    # Only the card that hung: a healthy card is never taken for hung, however busy the machine.
    [hung] = [event for event in summary["events"] if " hung on " in event]
    assert hung.startswith("card3 (sim-cpu3) hung on cartpole float32 "), summary["events"]
    assert hung.endswith(": restarted") and f"  {hung}" in proc.stdout.splitlines(), hung
    assert run["faults"] == "card1:crash-once,card2:crash-always,card3:hang-once"
