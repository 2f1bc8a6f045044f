"""Verdicts from outputs built by hand or by in-process forwards: no Ray, no actors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from harness.devices import cpu_reference
from harness.inference.forward import run_batch
from harness.judge.verdicts import first_divergent_step, judge_batch, judge_episodes
from harness.outputs import EpisodeOutput
from harness.policies import cast_policy, load_policy
from harness.workloads import batch_sha256, make_batch


@pytest.fixture(scope="module")
def cartpole():
    return load_policy("cartpole")


def _outputs(policy, dtype: str, batch) -> dict[str, np.ndarray]:
    return run_batch(cast_policy(policy, dtype), cpu_reference(), batch.obs, batch.noise)


def test_identical_cards_pass_and_a_changed_bit_fails_naming_the_element(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 8, seed=0)
    out = _outputs(cartpole, "float32", batch)
    rows = judge_batch("float32", batch.noise, {"sim-cpu0": out, "sim-cpu1": dict(out)}, out, None)
    assert rows and all(r.result.passed for r in rows)
    assert {r.kind for r in rows} == {"cross_card", "cpu_reference"}

    broken = dict(out)
    broken["logits"] = out["logits"].copy()
    broken["logits"][5, 1] = np.nextafter(broken["logits"][5, 1], np.float32(np.inf))
    rows = judge_batch("float32", batch.noise, {"sim-cpu0": out, "sim-cpu1": broken}, out, None)
    failed = [r for r in rows if not r.result.passed]
    assert [(r.kind, r.output, r.device_a) for r in failed] == [("cross_card", "logits", "sim-cpu1")]
    assert failed[0].result.detail.startswith("first mismatch at [5, 1]") and failed[0].result.max_ulp == 1


def test_bfloat16_card_passes_the_reference_and_ulps_count_in_bfloat16(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 256, seed=1)
    card, ref = _outputs(cartpole, "bfloat16", batch), _outputs(cartpole, "float32", batch)
    rows = judge_batch("bfloat16", batch.noise, {"sim-cpu0": card}, ref, None)
    assert all(r.result.passed for r in rows), [r.result.detail for r in rows if not r.result.passed]
    shifted = dict(card, logits=card["logits"].copy())
    import ml_dtypes

    shifted["logits"][0, 0] = np.nextafter(card["logits"][0, 0].astype(ml_dtypes.bfloat16), ml_dtypes.bfloat16(np.inf)).astype(np.float32)
    [row] = [r for r in judge_batch("bfloat16", batch.noise, {"sim-cpu0": card, "sim-cpu1": shifted}, ref, None) if not r.result.passed]
    assert row.result.max_ulp == 1, "one bfloat16 ULP, not 65536 float32 ULPs"


def test_a_wrong_card_fails_the_reference_and_a_flipped_decision_is_caught(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 64, seed=2)
    ref = _outputs(cartpole, "float32", batch)
    wrong = {k: v.copy() for k, v in ref.items()}
    wrong["logits"] += 0.5
    i = int(np.argmax(np.abs(ref["logits"][:, 0] - ref["logits"][:, 1])))  # the clearest decision
    wrong["action"][i] = 1 - wrong["action"][i]
    rows = {(r.kind, r.output): r for r in judge_batch("float32", batch.noise, {"sim-cpu0": wrong}, ref, None)}
    assert not rows["cpu_reference", "logits"].result.passed and "max_abs" in rows["cpu_reference", "logits"].result.detail
    assert not rows["cpu_reference", "action"].result.passed and rows["cpu_reference", "action"].result.n_mismatch == 1


def test_nan_inf_and_huge_observations_are_flagged_never_a_crash(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 4, seed=0)
    obs = batch.obs[0].copy()
    obs[0, 0], obs[1, 1], obs[2, 2], obs[3, 3] = np.nan, np.inf, -np.inf, 3e38
    hostile = replace(batch, obs=(obs,), sha256=batch_sha256((obs,), batch.noise))
    out = _outputs(cartpole, "float32", hostile)
    rows = judge_batch("float32", hostile.noise, {"sim-cpu0": out, "sim-cpu1": out}, out, None)
    ref_rows = [r for r in rows if r.kind == "cpu_reference" and r.output == "logits"]
    assert ref_rows and not ref_rows[0].result.passed and "nan" in ref_rows[0].result.detail


def _episode(seed: int, actions: list[int]) -> EpisodeOutput:
    return EpisodeOutput(seed, False, np.asarray(actions, dtype=np.int64), float(len(actions)), len(actions))


def test_episodes_report_the_step_where_trajectories_part() -> None:
    ref = [_episode(0, [0, 1, 0, 1]), _episode(1, [1, 1, 0, 0])]
    card1 = [_episode(0, [0, 1, 0, 1]), _episode(1, [1, 1, 1, 0])]
    checks, steps = judge_episodes({"sim-cpu0": ref, "sim-cpu1": card1}, ref)
    failed = [r for r in checks if not r.result.passed]
    assert [(r.kind, r.output) for r in failed] == [("cross_card", "actions[seed=1]")]
    assert "part at step 2" in failed[0].result.detail
    # returns are equal, so the reference check passes but still says where seed 1 parted
    ref_row = next(r for r in checks if r.kind == "cpu_reference" and r.device_a == "sim-cpu1")
    assert ref_row.result.passed and "seed 1 parts at step 2" in ref_row.result.detail
    assert steps == {"sim-cpu0": [None, None], "sim-cpu1": [None, 2]}


def test_first_divergent_step() -> None:
    a = np.array([0, 1, 1])
    assert first_divergent_step(a, a) is None
    assert first_divergent_step(a, np.array([0, 0, 1])) == 1
    assert first_divergent_step(a, np.array([0, 1])) == 2


def test_episode_returns_that_differ_fail_across_cards_and_against_the_cpu() -> None:
    ref = [_episode(0, [0, 1] * 50)]
    fell = [_episode(0, [0, 1] * 20 + [1, 1])]  # the pole falls: a shorter episode, a lower return
    checks, _ = judge_episodes({"sim-cpu0": ref, "sim-cpu1": fell}, ref)
    failed = {(r.kind, r.output, r.device_a) for r in checks if not r.result.passed}
    assert failed == {("cross_card", "actions[seed=0]", "sim-cpu1"), ("cross_card", "returns", "sim-cpu1"),
                      ("cpu_reference", "returns", "sim-cpu1")}
    ref_row = next(r for r in checks if r.kind == "cpu_reference" and r.device_a == "sim-cpu1")
    assert "max_abs" in ref_row.result.detail and "seed 0 parts at step 40" in ref_row.result.detail


def test_a_stochastic_flip_is_judged_against_the_noisy_margin(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 64, seed=4)
    ref = _outputs(cartpole, "float32", batch)
    wrong = {k: v.copy() for k, v in ref.items()}
    scores = ref["logits"] + batch.noise
    i = int(np.argmax(np.abs(scores[:, 0] - scores[:, 1])))  # the clearest sampled decision
    wrong["stochastic_action"][i] = 1 - wrong["stochastic_action"][i]
    [row] = [r for r in judge_batch("float32", batch.noise, {"sim-cpu0": wrong}, ref, None) if not r.result.passed]
    assert (row.kind, row.output, row.result.n_mismatch) == ("cpu_reference", "stochastic_action", 1)


def test_an_actor_that_loaded_other_bytes_is_refused(cartpole) -> None:
    from harness.run.place import refuse_other_bytes
    from harness.errors import UsageError

    mine = {"label": "sim-cpu0", "node": "a", "policies": {"cartpole": cartpole.info.sha256}}
    refuse_other_bytes([mine], {"cartpole": cartpole})
    theirs = {"label": "sim-cpu1", "node": "b", "policies": {"cartpole": "0" * 64}}
    with pytest.raises(UsageError, match="sim-cpu1 on b loaded other policy bytes than the driver"):
        refuse_other_bytes([mine, theirs], {"cartpole": cartpole})
