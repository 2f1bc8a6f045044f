"""Verdicts from outputs computed in-process or built by hand: no Ray, no actors.

Every kind of check is shown passing and failing: the port (cross_card, cpu_reference), the dtype
(decisions, tolerance, episode_return), the loader (onnx_reference) and batch invariance.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from harness.devices import cpu_reference
from harness.inference.forward import run_batch
from harness.judge.compare import TOLERANCES, Tolerance
from harness.judge.golden import RatioLimits
from harness.judge.verdicts import (
    HONEST,
    Rules,
    first_divergent_step,
    judge_batch,
    judge_batch_invariance,
    judge_episodes,
    judge_onnx,
    tolerance_of,
)
from harness.outputs import EpisodeOutput
from harness.policies import GOLDEN_DTYPE, PolicyNet, cast_policy, load_policy
from harness.workloads import ObsBatch, batch_sha256, make_batch
from tests import builders
from tests.third_party import ZOO_ZIP

LIMITS = RatioLimits()


@pytest.fixture(scope="module")
def cartpole() -> PolicyNet:
    return load_policy("cartpole")


def _outputs(policy: PolicyNet, dtype: str, batch: ObsBatch) -> dict[str, np.ndarray]:
    return run_batch(cast_policy(policy, dtype), cpu_reference(), batch.obs, batch.noise)


def _rules(policy: PolicyNet, dtype: str, user: dict[str, Tolerance] | None = None) -> Rules:
    tolerance, user_set = tolerance_of(dtype, user or {})
    return Rules(dtype, LIMITS, tolerance, user_set, policy.bounded_outputs())


def _judge(policy: PolicyNet, dtype: str, batch: ObsBatch, cards: dict, user: dict[str, Tolerance] | None = None) -> list:
    golden, same, float32 = (_outputs(policy, d, batch) for d in (GOLDEN_DTYPE, dtype, "float32"))
    return judge_batch(_rules(policy, dtype, user), batch.noise, cards, golden, same, float32)


def _failed(checks: list) -> list:
    return [c for c in checks if not c.passed]


def test_identical_cards_pass_and_a_changed_bit_fails_cross_card_naming_the_element(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 8, seed=0)
    out = _outputs(cartpole, "float32", batch)
    checks = _judge(cartpole, "float32", batch, {"sim-cpu0": out, "sim-cpu1": dict(out)})
    assert checks and all(c.passed for c in checks)
    assert {c.kind for c in checks} == {"cross_card", "cpu_reference", "decisions", "tolerance"}
    assert {c.output for c in checks if c.kind == "decisions"} == {"action", "stochastic_action"}
    assert {c.output for c in checks if c.kind in ("cpu_reference", "tolerance")} == {"logits"}

    broken = dict(out, logits=out["logits"].copy())
    broken["logits"][5, 1] = np.nextafter(broken["logits"][5, 1], np.float32(np.inf))
    failed = _failed(_judge(cartpole, "float32", batch, {"sim-cpu0": out, "sim-cpu1": broken}))
    # One ULP is within the port rule: only the bitwise check across cards sees it.
    assert [(c.kind, c.output, c.device_a) for c in failed] == [("cross_card", "logits", "sim-cpu1")]
    assert failed[0].result.detail.startswith("first mismatch at [5, 1]") and failed[0].result.max_ulp == 1


def test_bfloat16_cards_pass_and_ulps_count_in_bfloat16(cartpole) -> None:
    import ml_dtypes

    batch = make_batch(cartpole.info, "normal", 256, seed=1)
    card = _outputs(cartpole, "bfloat16", batch)
    assert not _failed([c for c in _judge(cartpole, "bfloat16", batch, {"sim-cpu0": card}) if c.gating])
    shifted = dict(card, logits=card["logits"].copy())
    shifted["logits"][0, 0] = np.nextafter(card["logits"][0, 0].astype(ml_dtypes.bfloat16), ml_dtypes.bfloat16(np.inf)).astype(
        np.float32
    )
    [row] = [
        c
        for c in _judge(cartpole, "bfloat16", batch, {"sim-cpu0": card, "sim-cpu1": shifted})
        if c.kind == "cross_card" and not c.passed
    ]
    assert row.result.max_ulp == 1, "one bfloat16 ULP, not 65536 float32 ULPs"


def test_a_wrong_card_fails_the_port_and_a_clear_flipped_decision_fails_decisions(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 64, seed=2)
    out = _outputs(cartpole, "float32", batch)
    wrong = {k: v.copy() for k, v in out.items()}
    wrong["logits"] += 0.5
    i = int(np.argmax(np.abs(out["logits"][:, 0] - out["logits"][:, 1])))  # the clearest decision
    wrong["action"][i] = 1 - wrong["action"][i]
    checks = {(c.kind, c.output): c for c in _judge(cartpole, "float32", batch, {"sim-cpu0": wrong})}
    port = checks["cpu_reference", "logits"].result
    assert not port.passed and port.error_ratio > 1000
    assert checks["cpu_reference", "logits"].device_b == "cpu-float64"
    decisions = checks["decisions", "action"].result
    assert not decisions.passed and (decisions.n_flips, decisions.n_near_ties) == (1, 0)
    assert decisions.max_flip_margin > decisions.flip_margin_limit
    assert checks["decisions", "action"].gating and checks["cpu_reference", "logits"].gating


def test_a_near_tie_flip_passes_decisions(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 4096, seed=0)
    out = _outputs(cartpole, "float16", batch)
    golden = _outputs(cartpole, GOLDEN_DTYPE, batch)
    margins = np.abs(golden["logits"][:, 0] - golden["logits"][:, 1])
    i = int(np.argmin(margins))  # the closest call of 4096: a float16 card may go either way
    flipped = dict(out, action=out["action"].copy())
    flipped["action"][i] = 1 - golden["action"][i]
    checks = [
        c for c in _judge(cartpole, "float16", batch, {"sim-cpu0": flipped}) if c.kind == "decisions" and c.output == "action"
    ]
    result = checks[0].result
    assert result.passed and result.n_flips >= 1 and result.n_near_ties == result.n_flips, (margins[i], result)


def test_a_stochastic_flip_is_judged_against_the_noisy_margin(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 64, seed=4)
    out = _outputs(cartpole, "float32", batch)
    wrong = {k: v.copy() for k, v in out.items()}
    scores = out["logits"] + batch.noise
    i = int(np.argmax(np.abs(scores[:, 0] - scores[:, 1])))  # the clearest sampled decision
    wrong["stochastic_action"][i] = 1 - wrong["stochastic_action"][i]
    [row] = _failed(_judge(cartpole, "float32", batch, {"sim-cpu0": wrong}))
    assert (row.kind, row.output, row.result.n_flips) == ("decisions", "stochastic_action", 1)


def test_nan_inf_and_huge_observations_are_flagged_never_a_crash(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 4, seed=0)
    obs = batch.obs[0].copy()
    obs[0, 0], obs[1, 1], obs[2, 2], obs[3, 3] = np.nan, np.inf, -np.inf, 3e38
    hostile = replace(batch, obs=(obs,), sha256=batch_sha256((obs,), batch.noise))
    out = _outputs(cartpole, "float32", hostile)
    checks = _judge(cartpole, "float32", hostile, {"sim-cpu0": out, "sim-cpu1": out})
    table = [c for c in checks if c.kind == "tolerance" and c.output == "logits"]
    assert table and not table[0].passed and "nan" in table[0].result.detail


@pytest.mark.parametrize("which", ["built", "third-party"])
def test_the_float16_false_alarm_passes_the_port_and_is_reported_by_the_table(which: str, request) -> None:
    """An SB3 CartPole expert (Tanh, logits in the tens: the published one's reach 18) in float16:
    the fixed table fails it on any device, since the error is float16's own; the port rule,
    against the golden, passes. Ours and, where ../shared/cases is present, the published one."""
    if which == "built":
        path = request.getfixturevalue("sb3_expert").zip
    else:
        path = request.getfixturevalue("cases") / ZOO_ZIP
    policy = load_policy(str(path))
    batch = make_batch(policy.info, "normal", 4096, seed=1)
    checks = {
        c.kind: c
        for c in _judge(policy, "float16", batch, {"sim-cpu0": _outputs(policy, "float16", batch)})
        if c.output == "logits"
    }
    assert checks["cpu_reference"].passed and checks["cpu_reference"].result.error_ratio < 1.5
    table = checks["tolerance"]
    assert not table.passed and not table.gating and "max_abs" in table.result.detail
    assert table.result.max_abs > table.result.atol + table.result.rtol * table.result.ref_max_abs


def test_the_table_gates_bounded_outputs_and_where_the_user_sets_it(cartpole) -> None:
    huggy = load_policy("huggy-arch")
    batch = make_batch(huggy.info, "normal", 8, seed=0)
    card = _outputs(huggy, "bfloat16", batch)
    gating = {c.output: c.gating for c in _judge(huggy, "bfloat16", batch, {"sim-cpu0": card}) if c.kind == "tolerance"}
    assert gating == {"mu": False, "action": True, "stochastic_action": True}  # ML-Agents clips its actions to [-1, 1]
    strict = {"bfloat16": Tolerance(atol=1e-6, rtol=0.0, min_cos=0.999)}
    checks = [c for c in _judge(huggy, "bfloat16", batch, {"sim-cpu0": card}, strict) if c.kind == "tolerance"]
    assert all(c.gating and not c.passed for c in checks)
    assert tolerance_of("float32-tf32", {}) == (TOLERANCES["float32"], False)


def test_the_loader_check_judges_onnxruntime_by_the_port_rule(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 64, seed=0)
    golden, float32 = _outputs(cartpole, GOLDEN_DTYPE, batch), _outputs(cartpole, "float32", batch)
    onnx = {"logits": float32["logits"].copy(), "action": float32["action"].copy()}
    rules = _rules(cartpole, "float32")
    assert all(
        c.passed and c.kind == "onnx_reference" and c.device_a == "onnxruntime"
        for c in judge_onnx(rules, onnx, float32, golden)
    )
    onnx["logits"] = onnx["logits"] * np.float32(1.001)  # a loader that misread a weight
    [bad] = _failed(judge_onnx(rules, onnx, float32, golden))
    assert bad.output == "logits" and bad.result.error_ratio > 100


def test_batch_invariance_is_bit_for_bit_and_gates_only_when_required(cartpole) -> None:
    batch = make_batch(cartpole.info, "normal", 4096, seed=0)
    inside = {k: v[:8] for k, v in _outputs(cartpole, "float32", batch).items()}
    alone = _outputs(cartpole, "float32", replace(batch, obs=(batch.obs[0][:8],), noise=batch.noise[:8]))
    checks = judge_batch_invariance({"sim-cpu0": (alone, inside)}, gating=False)
    assert {c.kind for c in checks} == {"batch_invariance"} and not any(c.gating for c in checks)
    assert all(c.device_a == c.device_b == "sim-cpu0" for c in checks)
    shifted = dict(alone, logits=np.nextafter(alone["logits"], np.float32(np.inf)))
    [bad] = [c for c in judge_batch_invariance({"sim-cpu0": (shifted, inside)}, gating=True) if c.output == "logits"]
    assert bad.gating and not bad.passed and bad.result.max_ulp >= 1


def _episode(seed: int, actions: list[int]) -> EpisodeOutput:
    return EpisodeOutput(
        episode_seed=seed,
        stochastic=False,
        actions=np.asarray(actions, dtype=np.int64),
        episode_return=float(len(actions)),
        length=len(actions),
    )


def test_episodes_report_the_seed_and_step_where_trajectories_part() -> None:
    ref = [_episode(0, [0, 1, 0, 1]), _episode(1, [1, 1, 0, 0])]
    card1 = [_episode(0, [0, 1, 0, 1]), _episode(1, [1, 1, 1, 0])]
    honest = [_episode(0, [0, 1, 1, 1]), _episode(1, [1, 1, 0, 0])]
    checks, steps = judge_episodes({"sim-cpu0": ref, "sim-cpu1": card1}, ref, honest)
    [failed] = _failed(checks)
    assert (failed.kind, failed.output, failed.result.episode_seed, failed.result.first_divergent_step) == (
        "cross_card",
        "actions",
        1,
        2,
    )
    assert failed.result.detail == "1 of 2 trajectories part; seed 1 first, at step 2"
    assert {c.kind for c in checks} == {"cross_card"}, "returns are judged over every round of a mode, apart"
    assert steps == {"sim-cpu0": [None, None], "sim-cpu1": [None, 2], HONEST: [2, None]}


def test_first_divergent_step() -> None:
    a = np.array([0, 1, 1])
    assert first_divergent_step(a, a) is None
    assert first_divergent_step(a, np.array([0, 0, 1])) == 1
    assert first_divergent_step(a, np.array([0, 1])) == 2
    floats = np.array([[0.5, -1.0], [0.25, 0.0]], np.float32)
    assert first_divergent_step(floats, np.array([[0.5, -1.0], [0.25, 1e-9]], np.float32)) == 1


def test_episode_returns_that_differ_fail_across_cards() -> None:
    ref = [_episode(0, [0, 1] * 50)]
    fell = [_episode(0, [0, 1] * 20 + [1, 1])]  # the pole falls: a shorter episode, a lower return
    checks, steps = judge_episodes({"sim-cpu0": ref, "sim-cpu1": fell}, ref, ref)
    failed = {(c.kind, c.output, c.device_a) for c in _failed(checks)}
    assert failed == {("cross_card", "actions", "sim-cpu1"), ("cross_card", "returns", "sim-cpu1")}
    assert steps["sim-cpu1"] == [40] and steps[HONEST] == [None]


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory: pytest.TempPathFactory) -> PolicyNet:
    return load_policy(str(builders.float16_overflow(tmp_path_factory.mktemp("overflow"))))


def test_a_float16_overflow_the_cpu_shares_fails_the_dtype_not_the_port(overflowing: PolicyNet) -> None:
    batch = make_batch(overflowing.info, "normal", 256, seed=0)
    card = _outputs(overflowing, "float16", batch)  # an honest float16 card computes what the CPU in float16 does
    bad = ~np.isfinite(card["logits"])
    assert bad.any() and not bad.all() and np.isfinite(_outputs(overflowing, GOLDEN_DTYPE, batch)["logits"]).all()
    checks = {(c.kind, c.output): c for c in _judge(overflowing, "float16", batch, {"sim-cpu0": card})}
    port = checks["cpu_reference", "logits"]
    assert port.passed and port.gating and port.result.n_overflow == np.count_nonzero(bad)
    assert port.result.detail.startswith("float16 overflows, not the port: the CPU in float16 is not finite in")
    assert 0 < port.result.error_ratio <= port.result.ratio_limit, "judged where both computed finite values"
    table = checks["tolerance", "logits"]
    assert table.gating and not table.passed and "float16 cannot hold this policy's values here" in table.result.detail
    assert not checks["decisions", "action"].passed and checks["decisions", "action"].gating
    # In float32 the same policy is fine: nothing overflows, nothing is forgiven.
    float32 = {
        (c.kind, c.output): c
        for c in _judge(overflowing, "float32", batch, {"sim-cpu0": _outputs(overflowing, "float32", batch)})
    }
    assert float32["cpu_reference", "logits"].result.n_overflow == 0 and not float32["tolerance", "logits"].gating


def test_a_card_that_overflows_where_the_cpu_in_its_dtype_does_not_fails_the_port(overflowing: PolicyNet) -> None:
    batch = make_batch(overflowing.info, "normal", 256, seed=0)
    card = _outputs(overflowing, "float16", batch)
    worse = dict(card, logits=card["logits"].copy())
    row = int(np.flatnonzero(np.isfinite(card["logits"]).all(axis=1))[0])
    worse["logits"][row, 0] = np.inf
    port = next(c for c in _judge(overflowing, "float16", batch, {"sim-cpu0": worse}) if c.kind == "cpu_reference")
    assert not port.passed and port.result.n_overflow == 0
    assert "inf in the card's output where the golden is finite" in port.result.detail


def test_an_actor_that_loaded_other_bytes_is_refused(cartpole) -> None:
    from harness.errors import UsageError
    from harness.cluster.place import refuse_other_bytes

    from tests.builders import described

    mine = replace(described("sim-cpu0"), policies={"cartpole": cartpole.info.sha256})
    refuse_other_bytes([mine], {"cartpole": cartpole})
    card = replace(described("sim-cpu1").device, node="b")
    theirs = replace(described("sim-cpu1"), device=card, policies={"cartpole": "0" * 64})
    with pytest.raises(UsageError, match="sim-cpu1 on b loaded other policy bytes than the driver"):
        refuse_other_bytes([mine, theirs], {"cartpole": cartpole})


def test_a_card_in_tf32_mode_is_judged_against_a_cpu_that_reduces_the_same_way() -> None:
    """With --precision device-default a TF32/HF32 card is labelled float32-tf32: its port verdict
    compares it with the CPU emulating TF32, so a reduced mode signed off on purpose still gets
    one; judged as float32 the same outputs fail by three orders of magnitude."""
    from harness.policies.matmul_precision import reduce_float32_matmuls

    huggy = load_policy("huggy-arch")
    batch = make_batch(huggy.info, "normal", 4096, seed=0)
    card = run_batch(reduce_float32_matmuls(cast_policy(huggy, "float32")), cpu_reference(), batch.obs, batch.noise)
    as_tf32 = {c.output: c for c in _judge(huggy, "float32-tf32", batch, {"cuda0": card}) if c.kind == "cpu_reference"}
    assert all(c.passed for c in as_tf32.values()) and as_tf32["mu"].result.error_ratio <= 1.0
    as_float32 = {c.output: c for c in _judge(huggy, "float32", batch, {"cuda0": card}) if c.kind == "cpu_reference"}
    assert not as_float32["mu"].passed and as_float32["mu"].result.error_ratio > 100
