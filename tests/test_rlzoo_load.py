"""The RL Zoo's published agents (../shared/cases/rlzoo: 45 classic-control and Box2D agents of nine
algorithms, saved by Stable-Baselines3 1.x and sb3-contrib 1.x, 20 behind VecNormalize), each
loaded as `--policy PATH` loads it, with nothing beside it but what the RL Zoo publishes: it
rebuilds, acts as SB3's or sb3-contrib's own `predict` acts on the same observations, and exports
to ONNX that onnxruntime runs as the harness's float32 forward. A published agent that loaded
must keep loading: this is that guard, one test per agent, so a failure names the agent.

SB3 2.x loads these 1.x saves once `gym` (whose spaces their `data` and vecnormalize.pkl pickle)
is gymnasium, with training's schedules replaced by `custom_objects`; sb3-contrib's ARS.load
renames its < 1.7 layout itself. The harness reads them with neither. No Ray here.
"""

from __future__ import annotations

import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import onnxruntime
import pytest
import torch
from sb3_contrib import ARS, QRDQN, TQC, TRPO
from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm

from harness.dtypes import GOLDEN_DTYPE
from harness.inference.forward import forward_outputs
from harness.policies import PolicyNet, cast_policy, load_policy
from harness.policies.export_onnx import export_onnx
from harness.workloads import make_batch
from tests.third_party import RLZOO, RLZOO_AGENTS, rlzoo_zip

AGENTS = RLZOO_AGENTS
# Without them, one skipped test per check that says why, not pytest's "empty parameter set"
# (test_the_corpus_holds_every_published_agent fails where CI requires them).
EACH_AGENT = AGENTS or [pytest.param("", marks=pytest.mark.skip(reason=f"no RL Zoo agents in {RLZOO}; CI has them"))]
PUBLISHED = 45  # ../shared/cases/README.md
ALGORITHMS: dict[str, type[BaseAlgorithm]] = {
    "a2c": A2C,
    "ppo": PPO,
    "dqn": DQN,
    "sac": SAC,
    "ddpg": DDPG,
    "ars": ARS,
    "qrdqn": QRDQN,
    "tqc": TQC,
    "trpo": TRPO,
}
# Training's schedules: functions pickled by Python 3.7, whose code SB3 2.x cannot rebuild (it
# warns and goes on); predict never reads them, so they are replaced, not tried.
SCHEDULES = {name: 0.0 for name in ("learning_rate", "lr_schedule", "clip_range", "exploration_schedule")}
ROWS = 64
# Float32 on the same CPU as SB3's own modules, and VecNormalize's float64 against the harness's
# float32 normalizer: equal but for rounding.
ATOL = 1e-5


def test_the_corpus_holds_every_published_agent(cases: Path) -> None:
    """The parametrized tests below are the glob's: an empty or partial folder must not pass as a short corpus."""
    assert len(AGENTS) == PUBLISHED, AGENTS
    assert {agent.split("/")[0] for agent in AGENTS} == set(ALGORITHMS)


@pytest.fixture
def gym_is_gymnasium(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gym` and the space modules 1.x pickled, as gymnasium's, for this test only."""
    for name in ("", ".spaces", ".spaces.box", ".spaces.discrete"):
        monkeypatch.setitem(sys.modules, f"gym{name}", sys.modules[f"gymnasium{name}"])


def sb3_model(agent: str) -> BaseAlgorithm:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 1.x save's versions, and the schedules replaced
        return ALGORITHMS[agent.split("/")[0]].load(rlzoo_zip(agent), device="cpu", custom_objects=SCHEDULES)


def sb3_observations(agent: str, raw: np.ndarray) -> np.ndarray:
    """`raw` as the agent's policy is handed it: through its VecNormalize where it trained behind one."""
    stats = rlzoo_zip(agent).with_suffix("") / "vecnormalize.pkl"
    if not stats.exists():
        return raw
    with stats.open("rb") as f:
        venv: Any = pickle.load(f)  # the RL Zoo's own file, trusted test data
    return np.asarray(venv.normalize_obs(raw))


def max_diff(a: Any, b: Any) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


def scaled(reference: Any) -> float:
    return ATOL * max(1.0, float(np.abs(np.asarray(reference)).max()))


def mismatch(agent: str, policy: PolicyNet) -> str:
    """How `policy`'s deterministic action parts from SB3's predict on the agent's own save; "" where it does not."""
    model = sb3_model(agent)
    space = model.action_space
    batch = make_batch(policy.info, "uniform", ROWS, 3)
    action = forward_outputs(policy, tuple(map(torch.from_numpy, batch.obs)), torch.from_numpy(batch.noise))["action"]
    predicted = model.predict(sb3_observations(agent, batch.obs[0]), deterministic=True)[0]
    if isinstance(space, gymnasium.spaces.Box):  # SB3 clips what it does not squash, as an environment step does
        error = max_diff(np.clip(action.numpy(), space.low, space.high), predicted)
        return f"actions {error:.3g} apart" if error > scaled(predicted) else ""
    differ = int((action.numpy() != predicted).sum())
    return f"{differ} of {ROWS} actions differ" if differ else ""


@pytest.mark.parametrize("agent", EACH_AGENT)
@pytest.mark.usefixtures("gym_is_gymnasium")
def test_the_agent_loads_and_acts_as_its_library_predicts(agent: str, cases: Path) -> None:
    policy = load_policy(str(rlzoo_zip(agent)))
    space = sb3_model(agent).action_space
    assert policy.info.source == "sb3-zip"
    assert policy.info.action_size == (int(space.n) if isinstance(space, gymnasium.spaces.Discrete) else space.shape[0])
    assert (policy.normalizer is not None) == (rlzoo_zip(agent).with_suffix("") / "vecnormalize.pkl").exists()
    assert mismatch(agent, policy) == ""


@pytest.mark.usefixtures("gym_is_gymnasium")
def test_a_policy_read_wrong_fails_the_comparison(cases: Path) -> None:
    """The comparison can fail: ARS's 1.x linear layer with its rows (the actions) swapped, or an
    agent trained behind VecNormalize read without its statistics."""
    linear = load_policy(str(rlzoo_zip("ars/CartPole-v1_1")))
    with torch.no_grad():
        linear.head.weight.copy_(linear.head.weight.flip(0))
    assert mismatch("ars/CartPole-v1_1", linear).endswith(f"of {ROWS} actions differ")
    normalized = load_policy(str(rlzoo_zip("ars/Pendulum-v1_1")))
    normalized.normalizer = None
    assert mismatch("ars/Pendulum-v1_1", normalized).startswith("actions ")


@pytest.mark.parametrize("agent", EACH_AGENT)
def test_the_agent_exports_to_onnx_that_runs_as_its_forward(agent: str, cases: Path, tmp_path: Path) -> None:
    """onnxruntime's kernels round otherwise than torch's: the head within float32's own error of
    the float64 golden, doubled, or 1e-5 of its scale; the greedy action the same."""
    policy = load_policy(str(rlzoo_zip(agent)))
    path = tmp_path / "policy.onnx"
    export_onnx(policy, path)
    head, got = onnx_outputs(policy, path)
    batch = make_batch(policy.info, "uniform", ROWS, 3)
    obs, noise = tuple(map(torch.from_numpy, batch.obs)), torch.from_numpy(batch.noise)
    ours = forward_outputs(policy, obs, noise)
    golden = forward_outputs(cast_policy(policy, GOLDEN_DTYPE), obs, noise)
    limit = max(scaled(ours[head]), 2 * max_diff(ours[head], golden[head]))
    assert max_diff(got[head], ours[head]) <= limit, (agent, max_diff(got[head], ours[head]), limit)
    if policy.info.action_kind == "discrete":
        assert np.array_equal(got["deterministic_actions"], ours["action"].numpy()), agent
    else:  # tanh and the bounds shrink an error, never grow it past the bounds' span
        span = 1.0 if policy.action_low is None else float((policy.action_high - policy.action_low).max())
        assert max_diff(got["deterministic_actions"], ours["action"]) <= limit * max(1.0, span), agent


def onnx_outputs(policy: PolicyNet, path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """The head's name, and onnxruntime's outputs by name on the test's batch."""
    session = onnxruntime.InferenceSession(str(path))
    batch = make_batch(policy.info, "uniform", ROWS, 3)
    feeds = {i.name: o.astype(np.float32) for i, o in zip(policy.info.inputs, batch.obs, strict=True)}
    names = [o.name for o in session.get_outputs()]
    assert names == [policy.head_output(), "deterministic_actions"], names
    return names[0], dict(zip(names, session.run(None, feeds), strict=True))
