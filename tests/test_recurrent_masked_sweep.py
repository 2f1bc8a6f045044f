"""RecurrentPPO, MaskablePPO and an ML-Agents export with a memory and two masked discrete
branches end to end: one sweep on the session's Ray cluster (two simulated cards and the CPU),
read back from Parquet and the report. The recurrent policy plays CartPole episodes (its state
carried per environment, in lockstep) and its batches are sequences whose state after each step
is checked; the masked ones run batches with drawn masks (the ML-Agents one per branch); the
ML-Agents export (no environment: batches only) is both, its loader check onnxruntime stepping
the file with its memory fed back. Two faults on card1: it ignores the masks (masked_actions must
fail there, and only there) and it is an honest card that rounds otherwise (its state parts bit
for bit from card0's, and stays within the port rule)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from sb3_contrib import MaskablePPO, RecurrentPPO

from tests.builders import mlagents_layout_export, save_sb3
from tests.conftest import Head
from tests.helpers import cli, read_table, sweep_on
from tests.test_sb3_families import ON

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def swept(ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    folder = tmp_path_factory.mktemp("recurrent-masked")
    recurrent = save_sb3(
        RecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs={"lstm_hidden_size": 8, "net_arch": [8]}, **ON),
        folder / "recurrent.zip",
    )
    masked = save_sb3(MaskablePPO("MlpPolicy", "CartPole-v1", policy_kwargs={"net_arch": [8]}, **ON), folder / "masked.zip")
    mlagents = mlagents_layout_export(folder / "mlagents.onnx", memory_size=16, branches=(3, 2))
    config = folder / "sweep.toml"
    policies = json.dumps([str(recurrent), str(masked), str(mlagents)])
    config.write_text(f'policies = {policies}\n[envs]\n"{recurrent}" = "CartPole-v1"\n')
    results = folder / "results"
    faults = ("--inject-fault", "card1:ignore-masks", "--inject-fault", "card1:ulp-noise")
    proc = sweep_on(ray_head.address, results, "--config", str(config), "--episodes", "2", "--dtypes", "float32",
                    "--batch-sizes", "8", "--cards", "2", *faults)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return recurrent, masked, results, proc.stdout


def _checks(results: Path, policy: Path) -> list[dict[str, Any]]:
    return [r for r in read_table(results, "checks").to_pylist() if r["policy"] == str(policy)]


def test_masked_actions_fail_on_the_card_that_ignores_the_masks_only(swept: tuple[Path, Path, Path, str]) -> None:
    _, masked, results, _ = swept
    verdicts: dict[str, set[bool]] = {}
    for c in _checks(results, masked):
        if c["kind"] == "masked_actions":
            verdicts.setdefault(c["device_a"], set()).add(c["passed"])
            assert c["gating"] and c["output"] in ("action", "stochastic_action") and c["device_b"] == "masks"
    # A batch where every unmasked choice happens to be legal passes on card1 too: some do not.
    assert verdicts == {"sim-cpu0": {True}, "sim-cpu1": {True, False}}
    failed = next(c for c in _checks(results, masked) if c["kind"] == "masked_actions" and not c["passed"])
    assert failed["n_illegal"] > 0 and "masked, first at" in failed["detail"]


def test_the_recurrent_state_is_an_output_checked_on_every_card(swept: tuple[Path, Path, Path, str]) -> None:
    recurrent, _, results, _ = swept
    checks = _checks(results, recurrent)
    state = [c for c in checks if c["output"] in ("state_h", "state_c")]
    cross = {(c["device_a"], c["passed"]) for c in state if c["kind"] == "cross_card"}
    # card1 rounds otherwise: its state parts from card0's, honestly.
    assert ("sim-cpu1", False) in cross
    port = [c for c in state if c["kind"] == "cpu_reference"]
    assert {c["device_a"] for c in port} == {"sim-cpu0", "sim-cpu1"} and all(c["passed"] for c in port)
    assert all(c["gating"] for c in port)
    growth = [c for c in checks if c["kind"] == "cpu_reference" and "@" in c["output"]]
    assert {c["output"] for c in growth} >= {"state_h@1-10", "state_c@11-100", "state_h@101-1000", "state_c@101-1000"}
    assert not any(c["gating"] for c in growth)


def test_an_mlagents_export_with_a_memory_sweeps_with_its_state(swept: tuple[Path, Path, Path, str]) -> None:
    """The ML-Agents export's state is an output as RecurrentPPO's is (bit for bit on card0, the
    port rule on both cards); the loader check, onnxruntime stepping the file with recurrent_in fed
    back, passes on the state, the masked logits and the actions."""
    results = swept[2]
    checks = [c for c in read_table(results, "checks").to_pylist() if c["policy"].endswith("mlagents.onnx")]
    loader = {(c["output"], c["passed"]) for c in checks if c["kind"] == "onnx_reference"}
    assert loader == {("logits", True), ("action", True), ("state_h", True), ("state_c", True)}
    state = [c for c in checks if c["output"] in ("state_h", "state_c")]
    assert {(c["device_a"], c["passed"]) for c in state if c["kind"] == "cross_card"} >= {("sim-cpu1", False)}
    port = [c for c in state if c["kind"] == "cpu_reference"]
    assert {c["device_a"] for c in port} == {"sim-cpu0", "sim-cpu1"} and all(c["passed"] and c["gating"] for c in port)


def test_recurrent_episodes_on_a_faultless_card_are_the_cpus(swept: tuple[Path, Path, Path, str]) -> None:
    """card0 computes as the CPU's float32 reference does: its episodes, the state carried per
    environment in both batchings, are the reference's action for action."""
    recurrent, _, results, _ = swept
    episodes = [e for e in read_table(results, "episodes").to_pylist() if e["policy"] == str(recurrent)]
    assert {e["device"] for e in episodes} >= {"sim-cpu0", "sim-cpu1", "cpu"}
    played = {(e["device"], e["mode"], e["batching"], e["episode_seed"]): e["actions_sha256"] for e in episodes}
    card0 = {key[1:]: sha for key, sha in played.items() if key[0] == "sim-cpu0"}
    assert card0 and card0 == {key[1:]: sha for key, sha in played.items() if key[0] == "cpu"}


def test_the_report_shows_the_states_error_by_step(swept: tuple[Path, Path, Path, str]) -> None:
    results = swept[2]
    proc = cli("report", "--results", str(results))
    assert proc.returncode == 1, proc.stderr[-2000:]
    section = proc.stdout.split("A recurrent policy's state against the float64 golden")[1].split("\n\n")[0]
    assert "state_h" in section and "101-1000" in section and "sim-cpu1" in section, section


def test_masked_branches_fail_on_the_card_that_ignores_the_masks_only(swept: tuple[Path, Path, Path, str]) -> None:
    """The ML-Agents export's branches: card0's branch actions are the golden's and legal, onnxruntime on
    the file agrees with the rebuild; card1, which ignores the masks, chooses a masked action in
    some branch of some row, and the detail names the row and the branch."""
    results = swept[2]
    checks = _checks(results, results.parent / "mlagents.onnx")
    verdicts: dict[tuple[str, str], set[bool]] = {}
    for c in checks:
        verdicts.setdefault((c["kind"], c["device_a"]), set()).add(c["passed"])
    assert verdicts[("masked_actions", "sim-cpu0")] == {True} and False in verdicts[("masked_actions", "sim-cpu1")]
    assert verdicts[("decisions", "sim-cpu0")] == {True} and verdicts[("onnx_reference", "onnxruntime")] == {True}
    failed = next(c for c in checks if c["kind"] == "masked_actions" and not c["passed"])
    # The first masked choice named by its row and its branch.
    assert failed["n_illegal"] > 0 and re.search(r"first at \[\d+, [01]\]: action \d+, legal", failed["detail"])
    assert not any(c["kind"] == "episode_return" for c in checks)
