"""Multi-discrete actions: ML-Agents' several discrete branches with `action_masks`, read from its
layout (built node by node in tests/builders.py, run by onnxruntime), the masks drawn per
branch, the per-branch judge (decisions, masked_actions) and the faults that make each fail."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from gymnasium import spaces
from onnx import numpy_helper
from stable_baselines3 import A2C, PPO

from harness.devices import cpu_reference
from harness.errors import PolicyLoadError
from harness.inference.fault_specs import parse_faults
from harness.inference.faults import inject
from harness.inference.forward import run_batch
from harness.judge.compare import by_branch, compare_decisions, compare_masks
from harness.judge.golden import RatioLimits
from harness.judge.kinds import CheckKind
from harness.judge.verdicts import Rules, judge_batch, tolerance_of
from harness.policies import GOLDEN_DTYPE, PolicyNet, cast_policy, load_policy
from harness.policies.base import ACTION_MASK, PolicyInfo
from harness.policies.onnx_any import onnx_reference
from harness.workloads import ObsBatch, action_masks, make_batch
from tests.builders import mlagents_layout_export, save_sb3
from tests.helpers import cli
from tests.test_mlagents import assert_one_line_error
from tests.test_sb3_families import ON

DEVICE = cpu_reference()
BRANCHES = (3, 2)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mlagents_layout_export(tmp_path_factory.mktemp("multi-discrete") / "branches.onnx", branches=BRANCHES)


@pytest.fixture(scope="module")
def policy(export: Path) -> PolicyNet:
    return load_policy(str(export))


@pytest.fixture(scope="module")
def batch(policy: PolicyNet) -> ObsBatch:
    return make_batch(policy.info, "normal", 256, 1)


def _masks(batch: ObsBatch) -> np.ndarray:
    masks = batch.step_input(ACTION_MASK)
    assert masks is not None
    return masks


# --- pure numpy: the split by branch, the masks, the per-branch comparisons ----------------------


def test_by_branch_puts_each_branch_on_its_own_row_padded() -> None:
    values = np.arange(10, dtype=np.float32).reshape(2, 5)
    split = by_branch(values, (3, 2), -1.0)
    assert split.shape == (2, 2, 3)
    np.testing.assert_array_equal(split[0], [[0, 1, 2], [3, 4, -1]])
    np.testing.assert_array_equal(split[1], [[5, 6, 7], [8, 9, -1]])
    with pytest.raises(ValueError, match=r"values of 5 actions do not split into branches \[2, 2\]"):
        by_branch(values, (2, 2), 0.0)


def test_drawn_masks_leave_a_legal_action_in_every_branch_and_one_branch_draws_as_before() -> None:
    masks = action_masks((3, 2, 4), 2000, np.random.default_rng(0))
    assert masks.shape == (2000, 9) and not masks.all()
    assert by_branch(masks, (3, 2, 4), False).any(axis=-1).all(), "every branch of every row has a legal action"
    # One branch: the draws a discrete policy's batches always had (uniform, then one forced legal).
    rng, again = np.random.default_rng(7), np.random.default_rng(7)
    expected = again.uniform(0.0, 1.0, (64, 5)) < 0.5
    expected[np.arange(64), again.integers(0, 5, 64)] = True
    np.testing.assert_array_equal(action_masks((5,), 64, rng), expected)


def test_an_illegal_action_in_any_branch_counts_and_one_past_its_branch_too() -> None:
    masks = np.array([[1, 0, 1, 0, 1], [0, 1, 0, 1, 1]], dtype=bool)
    per_branch = by_branch(masks, (3, 2), False)
    assert compare_masks(np.array([[0, 1], [1, 0]]), per_branch).passed
    second = compare_masks(np.array([[0, 0], [1, 0]]), per_branch)  # row 0's second branch allows action 1 only
    assert (second.passed, second.n_illegal) == (False, 1)
    assert "first at [0, 1]: action 0, legal [1]" in second.detail
    past = compare_masks(np.array([[0, 2], [1, 0]]), per_branch)  # branch 1 has actions 0 and 1 only
    assert (past.passed, past.n_illegal) == (False, 1)


def test_a_flip_in_one_branch_fails_decisions_and_a_card_past_its_branch_is_no_near_tie() -> None:
    scores = by_branch(np.array([[0.0, 2.0, 1.0, 5.0, 0.0]]), (3, 2), float(np.finfo(np.float32).min))
    reference = np.array([[1, 0]])
    assert compare_decisions(reference, reference, scores, 0.1).passed
    flipped = compare_decisions(np.array([[1, 1]]), reference, scores, 0.1)
    assert not flipped.passed and flipped.n_flips == 1 and "first at [0, 1]" in flipped.detail
    near = compare_decisions(np.array([[2, 0]]), reference, scores, 1.5)  # margin 1 in branch 0: a near-tie
    assert near.passed and near.n_near_ties == 1
    assert not compare_decisions(np.array([[1, 2]]), reference, scores, 1e30).passed


def test_a_multi_discrete_info_has_branches_summing_to_its_actions(policy: PolicyNet) -> None:
    info = policy.info
    assert (info.action_kind, info.action_size, info.branches, info.branch_sizes) == ("multi_discrete", 5, BRANCHES, BRANCHES)
    with pytest.raises(ValueError, match="two branches or more, summing to its 5 actions"):
        replace(info, branches=(2, 2))
    with pytest.raises(ValueError, match="only it has branches"):
        replace(info, action_kind="discrete")
    assert isinstance(replace(info, action_kind="discrete", branches=()), PolicyInfo)


# --- the reader: onnxruntime on the file, masks, faults ------------------------------------------


def test_branches_read_as_onnxruntime_runs_them_with_no_masked_action(policy: PolicyNet, batch: ObsBatch) -> None:
    """The reader's policy on a batch with drawn masks is onnxruntime's on the file (its masked
    logits side by side, its argmax per branch), and no branch of any row takes a masked action,
    greedy or sampled; the ignore-masks fault takes some."""
    assert policy.info.masked and "discrete branches [3, 2], action masks" in policy.info.detail
    masks = _masks(batch)
    ours = run_batch(policy, DEVICE, batch.obs, batch.noise)
    theirs = onnx_reference(policy.info, 1).run(batch.obs)
    assert set(theirs) == {"logits", "action"} and theirs["action"].shape == ours["action"].shape == (256, 2)
    np.testing.assert_allclose(theirs["logits"], ours["logits"], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(theirs["action"], ours["action"])
    assert ours["stochastic_action"].shape == (256, 2) and not np.array_equal(ours["stochastic_action"], ours["action"])
    legal = by_branch(masks, BRANCHES, False)
    for output in ("action", "stochastic_action"):
        assert compare_masks(ours[output], legal).passed, output
    ignoring = run_batch(
        inject(cast_policy(policy, "float32"), parse_faults(["all:ignore-masks"])), DEVICE, batch.obs, batch.noise
    )
    assert not compare_masks(ignoring["action"], legal).passed


def test_a_wrong_branch_split_gives_other_actions(policy: PolicyNet, batch: ObsBatch) -> None:
    """Read as (2, 3) where the file holds (3, 2), the same logits give other per-branch actions
    than onnxruntime's: the split is what the actions are compared on."""
    wrong = cast_policy(policy, "float32")
    wrong.info = replace(wrong.info, branches=(2, 3))
    theirs = onnx_reference(policy.info, 1).run(batch.obs)
    ours = run_batch(wrong, DEVICE, batch.obs, batch.noise)
    np.testing.assert_allclose(theirs["logits"], ours["logits"], atol=1e-5, rtol=0)
    assert not np.array_equal(theirs["action"], ours["action"])


def test_a_declared_shape_other_than_the_masks_slices_is_refused(export: Path, tmp_path: Path) -> None:
    model = onnx.load(export)
    sizes = next(t for t in model.graph.initializer if t.name == "branch_sizes")
    sizes.CopyFrom(numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "branch_sizes"))
    path = tmp_path / "declared-2-3.onnx"
    onnx.save(model, path)
    with pytest.raises(PolicyLoadError) as error:
        load_policy(str(path))
    assert_one_line_error(
        error,
        path,
        "masked by columns [(0, 3), (3, 5)] of action_masks, expected [(0, 2), (2, 5)] "
        "for discrete_action_output_shape [2, 3]",
    )


def test_a_branch_masked_by_every_other_column_is_refused(export: Path, tmp_path: Path) -> None:
    """A Slice of action_masks with a step of 2 is no range of columns: refused, not read as one."""
    model = onnx.load(export)
    first = next(n for n in model.graph.node if n.op_type == "Slice" and n.input[0] == "action_masks")
    model.graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), "every_other"))
    first.input.append("every_other")
    path = tmp_path / "step-2.onnx"
    onnx.save(model, path)
    with pytest.raises(PolicyLoadError) as error:
        load_policy(str(path))
    assert_one_line_error(error, path, "of action_masks is not one range of columns with step 1: None")


def test_every_check_fails_per_branch_under_its_fault(policy: PolicyNet, batch: ObsBatch) -> None:
    """judge_batch on the branches: an honest float32 card passes; action-bias flips greedy and
    sampled decisions, noisy-sampler the sampled ones only, ignore-masks chooses masked actions."""
    tolerance, _ = tolerance_of("float32", {})
    rules = Rules("float32", RatioLimits(), tolerance, False, frozenset(), masked=True, branches=policy.info.branches)

    def run(dtype: str, *faults: str) -> dict[str, np.ndarray]:
        return run_batch(inject(cast_policy(policy, dtype), parse_faults(list(faults))), DEVICE, batch.obs, batch.noise)

    golden, same = run(GOLDEN_DTYPE), run("float32")

    def failed(*faults: str) -> set[tuple[str, str]]:
        checks = judge_batch(rules, batch.noise, {"card0": run("float32", *faults)}, golden, same, same, masks=_masks(batch))
        assert {c.kind for c in checks} >= {CheckKind.DECISIONS, CheckKind.MASKED_ACTIONS, CheckKind.CPU_REFERENCE}
        return {(c.output, c.kind.value) for c in checks if not c.passed}

    assert failed() == set()
    assert failed("all:action-bias") == {("action", "decisions"), ("stochastic_action", "decisions")}
    assert failed("all:noisy-sampler") == {("stochastic_action", "decisions")}
    masked = failed("all:ignore-masks")
    assert {("action", "masked_actions"), ("stochastic_action", "masked_actions")} <= masked


def test_one_masked_branch_fails_decisions_under_action_bias(tmp_path: Path) -> None:
    """The masked logit (-1e8) is left out of a row's error floor: with it in, every flip of a row
    holding a masked action passed as a near-tie, and one discrete branch hid a biased head."""
    policy = load_policy(str(mlagents_layout_export(tmp_path / "one.onnx", branches=(5,))))
    batch = make_batch(policy.info, "normal", 256, 1)
    tolerance, _ = tolerance_of("float32", {})
    rules = Rules("float32", RatioLimits(), tolerance, False, frozenset(), masked=True)
    golden = run_batch(cast_policy(policy, GOLDEN_DTYPE), DEVICE, batch.obs, batch.noise)
    same = run_batch(policy, DEVICE, batch.obs, batch.noise)
    card = run_batch(inject(cast_policy(policy, "float32"), parse_faults(["all:action-bias"])), DEVICE, batch.obs, batch.noise)
    checks = judge_batch(rules, batch.noise, {"card0": card}, golden, same, same, masks=_masks(batch))
    decisions = [c for c in checks if c.kind is CheckKind.DECISIONS and c.output == "action"]
    assert [c.passed for c in decisions] == [False]
    assert "flipped beyond their margin limit" in decisions[0].result.detail


# --- harness export-onnx ------------------------------------------------------------------------


def test_export_onnx_writes_the_branches_and_onnxruntime_agrees(
    export: Path, policy: PolicyNet, batch: ObsBatch, tmp_path: Path
) -> None:
    """`harness export-onnx` of the branches: `action_mask` in, the logits side by side and
    `deterministic_actions` [batch, branches] out, onnxruntime's equal to the harness's policy;
    with every action allowed, other actions (the masks are read)."""
    out = tmp_path / "again.onnx"
    proc = cli("export-onnx", str(export), str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    session = onnxruntime.InferenceSession(str(out))
    assert [i.name for i in session.get_inputs()] == ["obs_0", "action_mask"]
    masks = _masks(batch)
    logits, actions = session.run(None, {"obs_0": batch.obs[0], "action_mask": masks})
    ours = run_batch(policy, DEVICE, batch.obs, batch.noise)
    np.testing.assert_allclose(logits, ours["logits"], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(actions, ours["action"])
    _, unmasked = session.run(None, {"obs_0": batch.obs[0], "action_mask": np.ones_like(masks)})
    assert not compare_masks(unmasked, by_branch(masks, BRANCHES, False)).passed


@pytest.mark.parametrize(
    ("env_id", "theirs"),
    [("CartPole-v1", "Discrete(2)"), ("seals/Sort-v0", "MultiDiscrete([4, 4])")],
    ids=["discrete", "other-branches"],
)
def test_an_environment_of_other_actions_is_refused_by_name(policy: PolicyNet, env_id: str, theirs: str) -> None:
    """Episodes step each row's branches as one MultiDiscrete action: an environment whose actions
    are not those branches is refused, never played with the wrong actions."""
    from harness.envs.registry import check_env
    from harness.errors import UsageError

    info = replace(policy.info, inputs=(replace(policy.info.inputs[0], shape=(4,)),), masked=False)  # both give 4 values
    with pytest.raises(UsageError, match=rf"its actions are {re.escape(theirs)}, the policy's are MultiDiscrete\(\[3, 2\]\)"):
        check_env(env_id, info)


def test_a_branch_whose_chosen_action_is_masked_counts_as_illegal() -> None:
    """The episodes' count of masked choices, per row: each branch's action against its own
    columns of the masks (a multi-discrete policy), or the one action (discrete)."""
    from harness.inference.episodes import masked_choices

    masks = np.array([[True, False, True, True, False], [False, True, True, False, True]])  # branches 3 and 2
    assert masked_choices(masks, np.array([[0, 0], [1, 1]]), BRANCHES).tolist() == [0, 0]
    assert masked_choices(masks, np.array([[1, 1], [0, 0]]), BRANCHES).tolist() == [2, 2]
    assert masked_choices(masks, np.array([[2, 1], [2, 0]]), BRANCHES).tolist() == [1, 1]
    assert masked_choices(masks, np.array([1, 3]), (5,)).tolist() == [1, 1]


# --- SB3: a MultiDiscrete action space ----------------------------------------------------------


class _Branches(gym.Env[np.ndarray, np.ndarray]):
    """An environment whose only use is its spaces: SB3 builds a MultiDiscrete policy from them."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)

    def __init__(self, nvec: list[int] | None = None, start: list[int] | None = None) -> None:
        self.action_space = spaces.MultiDiscrete(nvec or [3, 2, 4], start=start)

    def reset(self, *, seed: int | None = None, options: dict[str, object] | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(4, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(4, np.float32), 0.0, True, False, {}


@pytest.mark.parametrize("family", [PPO, A2C], ids=["PPO", "A2C"])
def test_an_sb3_multidiscrete_policy_acts_as_sb3_predicts(family: type[PPO] | type[A2C], tmp_path: Path) -> None:
    """SB3's MultiCategoricalDistribution: action_net's logits, side by side, are the harness's head,
    and SB3's predict (deterministic) is the harness's argmax per branch."""
    kwargs = ON if family is PPO else {key: value for key, value in ON.items() if key != "batch_size"}
    model = family("MlpPolicy", _Branches(), policy_kwargs={"net_arch": [8]}, **kwargs)
    policy = load_policy(str(save_sb3(model, tmp_path / "branches.zip")))
    assert (policy.info.action_kind, policy.info.branches, policy.info.masked) == ("multi_discrete", (3, 2, 4), False)
    batch = make_batch(policy.info, "uniform", 256, 0)
    ours = run_batch(policy, DEVICE, batch.obs, batch.noise)
    obs = torch.from_numpy(batch.obs[0])
    with torch.no_grad():
        latent = model.policy.mlp_extractor.forward_actor(model.policy.extract_features(obs))
        logits = model.policy.action_net(latent).numpy()
    np.testing.assert_allclose(ours["logits"], logits, atol=1e-5, rtol=0)
    predicted, _ = model.predict(batch.obs[0], deterministic=True)
    np.testing.assert_array_equal(ours["action"], predicted)
    assert ours["stochastic_action"].shape == (256, 3)


@pytest.mark.parametrize(
    ("nvec", "start", "problem"),
    [
        ([5], None, "MultiDiscrete action space of shape [1] is not read (one axis of two branches or more)"),
        ([3, 2], [1, 0], "MultiDiscrete action space starts at [1.0, 0.0], not at 0: not read"),
    ],
    ids=["one-branch", "start"],
)
def test_a_multidiscrete_space_the_harness_does_not_read_is_refused_by_name(
    nvec: list[int], start: list[int] | None, problem: str, tmp_path: Path
) -> None:
    model = PPO("MlpPolicy", _Branches(nvec, start), policy_kwargs={"net_arch": [8]}, **ON)
    path = save_sb3(model, tmp_path / "branches.zip")
    with pytest.raises(PolicyLoadError) as error:
        load_policy(str(path))
    assert_one_line_error(error, path, problem)


def test_an_sb3_multidiscrete_policy_plays_its_episodes_as_sb3_predicts(tmp_path: Path) -> None:
    """seals/Sort-v0 (MultiDiscrete([4, 4]): which two values to swap): each row's branches are
    stepped as one action and recorded as (length, branches), in both batchings, as SB3's own
    predict plays the same seeds. The actions depend on the observations: no hidden layer, the
    action_net's weights drawn wide."""
    from harness.inference.episodes import run_episodes

    sort = "seals/Sort-v0"
    model = PPO("MlpPolicy", gym.make(sort), policy_kwargs={"net_arch": []}, **ON)
    with torch.no_grad():
        model.policy.action_net.weight.copy_(torch.from_numpy(np.random.default_rng(0).normal(0.0, 10.0, (8, 4))))
    policy = load_policy(str(save_sb3(model, tmp_path / "sort.zip")))
    assert policy.info.branches == (4, 4)
    played = set()
    for batching in ("lockstep", "single"):
        for episode in run_episodes(policy, DEVICE, sort, [3, 1, 2], False, batching):
            env = gym.make(sort)
            obs, _ = env.reset(seed=episode.episode_seed)
            actions, total, over = [], 0.0, False
            while not over:
                action, _ = model.predict(obs, deterministic=True)
                actions.append(action)
                obs, reward, terminated, truncated, _ = env.step(action)
                total, over = total + float(reward), terminated or truncated
            np.testing.assert_array_equal(episode.actions, np.asarray(actions))
            assert (episode.actions.shape, episode.episode_return, episode.illegal) == ((len(actions), 2), total, 0)
            played.update(map(tuple, episode.actions.tolist()))
    assert len(played) > 1
