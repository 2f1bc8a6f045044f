"""Localizing a divergence on real policies (torch on the CPU, no Ray): the layer named is the one
that was broken, identical runs name none, drift and NaN are reported without a crash."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.inference.capture import capture_activations, layer_modules, leaf_layers
from harness.inference.faults import corrupt_first_layer, perturb_one_weight
from harness.judge.compare import Comparison, compare_bitwise
from harness.judge.golden import GoldenComparison, RatioLimits, compare_to_golden
from harness.judge.kinds import CheckKind
from harness.judge.localize import (
    DIVERGENT,
    OFF_GOLDEN,
    FirstNonFinite,
    first_divergent_layer,
    first_layer_off_golden,
    first_overflow_layer,
    named_layer,
)
from harness.policies import GOLDEN_DTYPE, PolicyNet, cast_policy, load_policy
from harness.judge.verdicts import Check, Rules, tolerance_of
from harness.policies.matmul_precision import reduce_float32_matmuls
from harness.store.schema import CheckRow
from harness.sweeps.dispatch import Gathered, Located, check_row, judge
from harness.sweeps.localize import Searches
from harness.sweeps.plan import BatchWork, LocateWork, Search, Unit, unit_id
from harness.workloads import ObsBatch, make_batch
from tests import builders

POLICIES = ["cartpole", "huggy-arch"]


@pytest.fixture(scope="module", params=POLICIES)
def policy(request: pytest.FixtureRequest) -> PolicyNet:
    return load_policy(request.param)


def observations(policy: PolicyNet, size: int = 256, seed: int = 0) -> tuple[torch.Tensor, ...]:
    batch = make_batch(policy.info, "normal", size, seed)
    return tuple(torch.from_numpy(o) for o in batch.obs)


def perturb_head(policy: PolicyNet) -> None:
    # The bias, not a weight: a nudge to a weight can round away inside the dot product.
    with torch.no_grad():
        policy.head.bias[0] += 1e-3


def first_layer_after_input(policy: PolicyNet) -> int:
    return 2 if policy.normalizer is not None else 1


def test_capture_order_dtype_and_output(policy: PolicyNet) -> None:
    obs = observations(policy)
    acts = capture_activations(policy, obs)
    expected = (
        (["normalizer"] if policy.normalizer is not None else []) + [f"body.{i}" for i in range(len(policy.body))] + ["head"]
    )
    assert list(acts) == expected
    assert all(a.dtype == np.float32 for a in acts.values())
    with torch.inference_mode():
        np.testing.assert_array_equal(acts["head"], policy(*obs).numpy())


def test_perturbed_weight_diverges_at_body0(policy: PolicyNet) -> None:
    obs = observations(policy)
    card = copy.deepcopy(policy)
    perturb_one_weight(card)
    div = first_divergent_layer(capture_activations(card, obs), capture_activations(policy, obs), modules=layer_modules(card))
    assert div is not None
    assert div.layer == "body.0"
    # The normalizer, when there is one, was compared first and found identical.
    assert div.layers_checked == first_layer_after_input(policy)
    assert div.module == f"Linear({policy.info.obs_size}, {policy.body[0].out_features})"
    assert not div.comparison.bitwise_equal and len(div.index) == 2
    line = div.describe()
    assert line.startswith(f"first divergent layer: body.0 {div.module} (first mismatch at [")
    assert "ulp" in line and "\n" not in line
    # The report reads the layer back from a row's detail, where it follows the row's own mismatch.
    assert named_layer(f"first mismatch at [3, 1]: a=1, b=2 (1 ulp); {line}") == (DIVERGENT, f"body.0 {div.module}", "")
    assert named_layer(f"x; as found on normal-b8-s1: {line}") == (DIVERGENT, f"body.0 {div.module}", "normal-b8-s1")
    assert named_layer("first mismatch at [3, 1]: a=1, b=2 (1 ulp)") is None


def test_perturbed_head_diverges_at_head(policy: PolicyNet) -> None:
    obs = observations(policy)
    card = copy.deepcopy(policy)
    perturb_head(card)
    acts, ref = capture_activations(card, obs), capture_activations(policy, obs)
    div = first_divergent_layer(acts, ref)
    assert div is not None
    assert (div.layer, div.layers_checked) == ("head", len(acts))
    assert div.index[-1] == 0  # only logit / mu 0 was touched
    assert "inputs identical" in div.describe()


def test_identical_policies_agree(policy: PolicyNet) -> None:
    obs = observations(policy)
    acts, ref = capture_activations(copy.deepcopy(policy), obs), capture_activations(policy, obs)
    assert first_divergent_layer(acts, ref) is None
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    assert first_layer_off_golden(acts, ref, golden, "float32", LIMITS) is None


LIMITS = RatioLimits()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_honest_low_precision_is_on_the_golden_at_every_layer(policy: PolicyNet, dtype: str) -> None:
    obs = observations(policy)
    card = capture_activations(cast_policy(policy, dtype), obs)
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    assert all(a.dtype == np.float64 for a in golden.values())
    assert first_layer_off_golden(card, card, golden, dtype, LIMITS) is None


def test_reduced_float32_is_named_at_the_first_matmul(policy: PolicyNet) -> None:
    """TF32 rounding on a float32 card: the first Linear layer is where it leaves the golden."""
    obs = observations(policy)
    card = capture_activations(reduce_float32_matmuls(cast_policy(policy, "float32")), obs)
    cpu = capture_activations(cast_policy(policy, "float32"), obs)
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    div = first_layer_off_golden(card, cpu, golden, "float32", LIMITS, modules=layer_modules(policy))
    assert div is not None and div.layer == "body.0" and div.layers_checked == first_layer_after_input(policy)
    assert not div.comparison.passed and div.comparison.error_ratio > 100
    assert [r.layer for r in div.ratios] == list(card)[: div.layers_checked]
    line = div.describe()
    assert line.startswith(f"first layer off the golden: body.0 {div.module} (error_ratio") and "error ratio by layer:" in line
    assert named_layer(f"error_ratio 3e+04 > 3: ...; {line}") == (OFF_GOLDEN, f"body.0 {div.module}", "")


def test_a_layer_that_blows_up_is_named_with_its_growth() -> None:
    ref = {"a": np.array([1.0, 2.0]), "b": np.array([10.0, -4.0])}
    cpu = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([10.0, -4.0], np.float32)}
    card = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([10.5, -4.0], np.float32)}
    div = first_layer_off_golden(card, cpu, ref, "float32", LIMITS)
    assert div is not None and (div.layer, div.index, div.layers_checked) == ("b", (0,), 2)
    first, second = div.ratios
    assert first.ratio == 0.0 and first.growth is None and second.growth is None  # no growth over an exact layer
    assert "inputs within the rule" in div.describe()


def test_a_corrupt_weight_leaves_the_golden_at_body0(policy: PolicyNet) -> None:
    obs = observations(policy)
    broken = cast_policy(policy, "float32")
    corrupt_first_layer(broken)
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    div = first_layer_off_golden(capture_activations(broken, obs), capture_activations(policy, obs), golden, "float32", LIMITS)
    assert div is not None and div.layer == "body.0"


def test_hooks_are_removed(policy: PolicyNet) -> None:
    capture_activations(policy, observations(policy, size=4))
    with pytest.raises(RuntimeError):
        # Too wide an observation: the forward fails after some hooks have been installed.
        capture_activations(policy, (torch.zeros(2, policy.info.obs_size + 1),))
    assert all(not m._forward_hooks for m in policy.modules())
    assert list(leaf_layers(policy))[-1] == "head"


def test_nan_where_the_golden_is_finite_is_flagged_at_the_layer_producing_it() -> None:
    policy = load_policy("cartpole")
    obs = (torch.zeros(8, 4),)
    card, cpu = capture_activations(policy, obs), capture_activations(policy, obs)
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    card["body.2"][3, 5] = np.nan
    div = first_layer_off_golden(card, cpu, golden, "float32", LIMITS)
    assert div is not None and (div.layer, div.layers_checked, div.index) == ("body.2", 3, (3, 5))
    assert "nan in the card's output where the golden is finite" in div.describe()


def test_nan_on_one_card_only_is_a_bitwise_divergence() -> None:
    ref = {"body.0": np.ones((2, 3), np.float32), "body.1": np.ones((2, 3), np.float32)}
    card = {k: v.copy() for k, v in ref.items()}
    card["body.1"][1, 2] = np.nan
    div = first_divergent_layer(card, ref)
    assert div is not None
    assert (div.layer, div.index) == ("body.1", (1, 2))
    assert "(nan)" in div.describe()


def test_the_layer_where_a_dtype_overflows_is_named(tmp_path: Path) -> None:
    policy = load_policy(str(builders.float16_overflow(tmp_path)))
    obs = observations(policy)
    acts = capture_activations(cast_policy(policy, "float16"), obs)
    golden = capture_activations(cast_policy(policy, GOLDEN_DTYPE), obs)
    overflow = first_overflow_layer(acts, golden, modules=layer_modules(policy))
    assert overflow is not None and overflow.layer == "body.0" and overflow.largest > 65504
    assert overflow.describe("float16").startswith("the overflow begins at body.0 Linear(4, 16): ")
    assert first_overflow_layer(capture_activations(cast_policy(policy, "float32"), obs), golden) is None


def test_captures_of_different_architectures_are_refused() -> None:
    with pytest.raises(ValueError, match="different layers"):
        first_divergent_layer({"body.0": np.zeros(1, np.float32)}, {"head": np.zeros(1, np.float32)})


# ---- the searches as units the sweep schedules (harness/sweeps/localize.py, harness/sweeps/dispatch.py) ----

LANES = {"sim-cpu0": 0, "sim-cpu1": 1, "sim-cpu2": 2}


def batch_unit(policy: PolicyNet, size: int, dtype: str = "float32") -> Unit:
    work = BatchWork(make_batch(policy.info, "normal", size, 0))
    return Unit(unit_id(policy, dtype, work), "cartpole", dtype, work)


def batch_of(unit: Unit) -> ObsBatch:
    assert isinstance(unit.work, BatchWork)
    return unit.work.batch


def row(unit: Unit, kind: CheckKind, card: str, result: Comparison | GoldenComparison, output: str = "logits") -> CheckRow:
    check = Check(output, kind, card, "sim-cpu0" if kind == CheckKind.CROSS_CARD else "cpu-float64", True, result)
    return check_row(
        check, unit_id=unit.unit_id, policy=unit.policy, dtype=unit.dtype, workload=unit.workload, input_sha256=""
    )


ONES = np.ones(4, np.float32)
PARTED = compare_bitwise(np.nextafter(ONES, np.float32(2)), ONES)
SAME_BITS = compare_bitwise(ONES, ONES)
GOLD = np.arange(1.0, 5.0)
NAN = np.array([1, np.nan, 3, 4], np.float16)
NOT_FINITE = compare_to_golden(NAN, GOLD.astype(np.float16), GOLD, "float16", LIMITS)  # the card's own NaN
OVERFLOWED = compare_to_golden(NAN, NAN, GOLD, "float16", LIMITS)  # the CPU's too: float16's


def test_a_failed_batch_is_searched_once_and_its_rows_wait_for_what_the_search_finds() -> None:
    policy = load_policy("cartpole")
    first, later, clean = batch_unit(policy, 8), batch_unit(policy, 64), batch_unit(policy, 1)
    searches = Searches({"cartpole": policy}, LANES.__getitem__)
    firsts = [row(first, CheckKind.CROSS_CARD, "sim-cpu1", PARTED), row(first, CheckKind.CROSS_CARD, "sim-cpu2", SAME_BITS)]
    [search] = searches.follow(first, batch_of(first), firsts)
    assert search.work == LocateWork(Search.CROSS_CARD, batch_of(first), 1) and search.dtype == "float32"
    # A later batch failing the same way asks nothing more; a batch that passed waits for nothing.
    assert searches.follow(later, batch_of(later), [row(later, CheckKind.CROSS_CARD, "sim-cpu1", PARTED)]) == []
    assert searches.follow(clean, batch_of(clean), [row(clean, CheckKind.CROSS_CARD, "sim-cpu1", SAME_BITS)]) == []
    assert [unit for unit, _ in searches.ready()] == [clean]
    note = "first divergent layer: body.0 Linear(4, 64) (first mismatch at [0])"
    searches.judged(search, Located(note))
    ready = dict((unit.unit_id, rows) for unit, rows in searches.ready())
    assert list(ready) == [first.unit_id, later.unit_id] and searches.held == []
    assert [r.detail for r in ready[first.unit_id]] == [f"{PARTED.detail}; {note}", SAME_BITS.detail]
    assert [r.detail for r in ready[later.unit_id]] == [f"{PARTED.detail}; as found on {first.workload}: {note}"]
    assert firsts[0].detail == PARTED.detail, "the judged rows stay as the judge made them"
    # The search's id is a hash of what it computes: the same in a resumed run, another for another card.
    again = Searches({"cartpole": policy}, LANES.__getitem__)
    assert again.follow(first, batch_of(first), firsts) == [search] and search.unit_id not in (first.unit_id, later.unit_id)
    other = again.follow(later, batch_of(later), [row(later, CheckKind.CROSS_CARD, "sim-cpu2", PARTED)])
    assert [s.unit_id for s in other] != [search.unit_id] and len(other) == 1


def test_a_card_s_first_nan_is_a_finding_row_once_and_the_overflow_a_note_naming_its_batch() -> None:
    policy = load_policy("cartpole")
    first, later = batch_unit(policy, 8, "float16"), batch_unit(policy, 64, "float16")
    searches = Searches({"cartpole": policy}, LANES.__getitem__)
    rows = [
        row(first, CheckKind.CPU_REFERENCE, "sim-cpu1", NOT_FINITE),
        row(first, CheckKind.CPU_REFERENCE, "sim-cpu2", OVERFLOWED),
    ]
    port, overflow, nan1, nan2 = searches.follow(first, batch_of(first), rows)
    assert [s.work.name for s in (port, overflow, nan1, nan2)] == [
        f"locate-port-card1-of-{first.workload}",
        f"locate-overflow-of-{first.workload}",
        f"locate-nonfinite-card1-of-{first.workload}",
        f"locate-nonfinite-card2-of-{first.workload}",
    ]
    assert searches.follow(later, batch_of(later), [row(later, CheckKind.CPU_REFERENCE, "sim-cpu1", NOT_FINITE)]) == []
    finding = FirstNonFinite(False, 4, 1, "body.0", 1, 3.0, "the card's first value not finite appeared at body.0")
    searches.judged(port, Located("first layer off the golden: body.0"))
    [(_, named)] = searches.ready()  # the later batch waits for the search it names, no more
    searches.judged(overflow, Located(f"the overflow begins at body.0 (as found on {first.workload})"))
    searches.judged(nan1, Located(nonfinite=finding))
    assert searches.ready() == []
    searches.judged(nan2, Located("no layer is NaN or inf on a second run"))
    [(_, noted)] = searches.ready()
    assert [(r.kind, r.device_a) for r in noted] == [
        (CheckKind.CPU_REFERENCE, "sim-cpu1"),
        (CheckKind.CPU_REFERENCE, "sim-cpu2"),
        (CheckKind.FIRST_NONFINITE, "sim-cpu1"),
    ]
    assert noted[0].detail == f"{NOT_FINITE.detail}; first layer off the golden: body.0"
    overflow_note = f"the overflow begins at body.0 (as found on {first.workload})"
    assert noted[1].detail == f"{OVERFLOWED.detail}; {overflow_note}; no layer is NaN or inf on a second run"
    assert noted[2].result == finding and noted[2].unit_id == first.unit_id and not noted[2].gating
    assert [r.kind for r in named] == [CheckKind.CPU_REFERENCE], "a card's first NaN is named once"
    assert named[0].detail == f"{NOT_FINITE.detail}; as found on {first.workload}: first layer off the golden: body.0"


def test_a_search_is_judged_from_its_captures_and_one_that_got_nothing_says_why(policy: PolicyNet) -> None:
    batch = make_batch(policy.info, "normal", 64, 0)
    obs = tuple(torch.from_numpy(o) for o in batch.obs)
    card = copy.deepcopy(policy)
    perturb_one_weight(card)
    work = LocateWork(Search.CROSS_CARD, batch, 1)
    search = Unit(unit_id(policy, "float32", work), "p", "float32", work)
    rules = Rules("float32", LIMITS, *tolerance_of("float32", {}), frozenset(), layers=layer_modules(policy))
    captures = {"sim-cpu1": capture_activations(card, obs), "sim-cpu0": capture_activations(policy, obs)}
    got = Gathered(captures, {}, {}, lanes={1: "sim-cpu1", 0: "sim-cpu0"})
    located = judge(search, rules, False, got).located
    assert located is not None and located.note.startswith(
        f"first divergent layer: body.0 {layer_modules(policy)['body.0']} ("
    )
    same = Gathered(
        {"sim-cpu1": captures["sim-cpu0"], "sim-cpu0": captures["sim-cpu0"]}, {}, {}, lanes={1: "sim-cpu1", 0: "sim-cpu0"}
    )
    assert judge(search, rules, False, same).located == Located(
        "no layer differs on a second run: the mismatch did not repeat"
    )
    lost = Gathered(
        {"sim-cpu0": captures["sim-cpu0"]}, {}, {}, lanes={1: "sim-cpu1", 0: "sim-cpu0"}, failed={"sim-cpu1": "boom"}
    )
    assert judge(search, rules, False, lost).located == Located("layer search failed: boom")
