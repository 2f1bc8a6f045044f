"""Closed-loop episodes in lockstep: the same episodes as one environment at a time, whatever
the environment, action kind or batching; a batch shape that never changes; and a seed's
trajectory that depends on the set of seeds only through the batch shape."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from harness.devices import cpu_reference
from harness.envs.cartpole import ENV_ID
from harness.errors import UsageError
from harness.inference.episodes import run_episodes
from harness.outputs import EpisodeOutput
from harness.policies import load_policy
from harness.policies.base import ObsInput, PolicyInfo, PolicyNet, mlp
from harness.workloads import episode_noise

DEVICE = cpu_reference()
SEEDS = [5, 0, 3]  # not sorted: outputs come back in the caller's order


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """As every runner does: on a busy two-core machine two threads spin for milliseconds a call."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class BatchSizeShift(nn.Module):
    """Adds batch size x `shift` to the logits: a batch-variant card, exaggerated."""

    def __init__(self, shift: list[float]) -> None:
        super().__init__()
        self.register_buffer("shift", torch.tensor(shift))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x.shape[0] * self.shift


def tiny_policy(
    env_id: str, obs_size: int, action_size: int, continuous: bool = False, head: nn.Module | None = None
) -> PolicyNet:
    """Random weights, the same every time, sharp enough that actions follow the observations:
    episodes that end at different steps, and continuous means past the action bounds."""
    kind = "continuous" if continuous else "discrete"
    inputs = (ObsInput("obs", (obs_size,)),)
    info = PolicyInfo(f"tiny-{kind}", "synthetic", kind, inputs, action_size, sha256="", synthetic=True, env_id=env_id)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(obs_size * 10 + action_size)
        body, linear = mlp([obs_size, 16], nn.Tanh), nn.Linear(16, action_size)
        body[0].weight.mul_(30.0)
        linear.bias.zero_()
    log_sigma = torch.full((action_size,), -0.5) if continuous else None
    return PolicyNet(info, body, head or linear, log_sigma=log_sigma)


def one_at_a_time(policy: PolicyNet, env_id: str, seed: int, stochastic: bool, rows: int = 1, row: int = 0) -> EpisodeOutput:
    """The reference: one `gym.make`, one forward per step, SB3's clip for a Box. The forward is
    of the batch the episode is played in: `rows` rows, the episode's at `row` (a row's result may
    differ by an ULP between batch shapes, as it does on AVX-512 hosts), the others zero."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    noise = torch.from_numpy(episode_noise(policy.info, seed, env.spec.max_episode_steps))
    box = isinstance(env.action_space, gym.spaces.Box)
    actions, total, done = [], 0.0, False
    with torch.inference_mode():
        while not done:
            batch = np.zeros((rows, *np.shape(obs)), dtype=np.float32)
            batch[row] = obs
            head = policy(torch.from_numpy(batch))[row : row + 1]
            step = len(actions)
            chosen = (
                policy.stochastic_action(head, noise[step : step + 1]) if stochastic else policy.deterministic_action(head)
            ).numpy()[0]
            action = np.clip(chosen, env.action_space.low, env.action_space.high) if box else int(chosen)
            obs, reward, terminated, truncated, _ = env.step(action)
            actions.append(action)
            total += float(reward)
            done = terminated or truncated
    env.close()
    return EpisodeOutput(seed, stochastic, np.asarray(actions), total, len(actions))


def assert_same_episodes(got: list[EpisodeOutput], want: list[EpisodeOutput]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.episode_seed == w.episode_seed
        assert (g.length, g.episode_return) == (w.length, w.episode_return), f"seed {g.episode_seed}"
        assert g.actions.dtype == w.actions.dtype and g.actions.shape == w.actions.shape
        assert g.actions_sha256 == w.actions_sha256, f"seed {g.episode_seed}: actions differ"


CASES = {
    "CartPole-v1": dict(obs_size=4, action_size=2),
    "Acrobot-v1": dict(obs_size=6, action_size=3),
    "Pendulum-v1": dict(obs_size=3, action_size=1, continuous=True),
    "MountainCarContinuous-v0": dict(obs_size=2, action_size=1, continuous=True),
}


@pytest.mark.parametrize("batching", ["lockstep", "single"])
@pytest.mark.parametrize("stochastic", [False, True], ids=["deterministic", "stochastic"])
@pytest.mark.parametrize("env_id", list(CASES))
def test_lockstep_plays_the_episodes_of_one_env_at_a_time(env_id: str, stochastic: bool, batching: str) -> None:
    policy = tiny_policy(env_id, **CASES[env_id])
    got = run_episodes(policy, DEVICE, env_id, SEEDS, stochastic, batching)
    # Lockstep plays the seeds in rows sorted by seed, in one batch of them all.
    rows = len(SEEDS) if batching == "lockstep" else 1
    rank = {seed: i for i, seed in enumerate(sorted(SEEDS))}
    want = [one_at_a_time(policy, env_id, seed, stochastic, rows, rank[seed] if rows > 1 else 0) for seed in SEEDS]
    assert_same_episodes(got, want)
    assert {(e.batching, e.batch_size) for e in got} == {(batching, len(SEEDS) if batching == "lockstep" else 1)}
    if env_id == "CartPole-v1":
        assert len({e.length for e in got}) == len(SEEDS), "masking is only tested if episodes end at different steps"


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "MountainCarContinuous-v0"])
def test_continuous_actions_are_clipped_float_rows_as_stepped(env_id: str) -> None:
    policy = tiny_policy(env_id, **CASES[env_id])
    low, high = gym.make(env_id).action_space.low, gym.make(env_id).action_space.high
    for episode in run_episodes(policy, DEVICE, env_id, SEEDS, True, "lockstep"):
        assert episode.actions.dtype == np.float32 and episode.actions.shape == (episode.length, 1)
        assert (episode.actions >= low).all() and (episode.actions <= high).all()
        assert ((episode.actions == low) | (episode.actions == high)).any(), "the clip never bit"
        assert ((episode.actions > low) & (episode.actions < high)).any(), "every action was clipped"


def test_fingerprints_tell_integer_from_float_actions_of_the_same_bytes() -> None:
    same_bytes = [
        np.zeros(2, dtype=np.int64),
        np.zeros(2, dtype=np.float64),
        np.zeros((4, 1), dtype=np.float32),
        np.zeros(4, dtype=np.float32),
    ]
    assert len({EpisodeOutput(0, False, a, 0.0, len(a)).actions_sha256 for a in same_bytes}) == len(same_bytes)


@pytest.mark.parametrize("batching", ["lockstep", "single"])
def test_batch_shape_stays_the_same_when_episodes_end_at_different_steps(batching: str) -> None:
    policy = tiny_policy("CartPole-v1", **CASES["CartPole-v1"])
    sizes: list[int] = []
    policy.body.register_forward_hook(lambda _module, inputs, _output: sizes.append(inputs[0].shape[0]))
    episodes = run_episodes(policy, DEVICE, "CartPole-v1", SEEDS, False, batching)
    lengths = [e.length for e in episodes]
    assert len(set(lengths)) == len(SEEDS)
    if batching == "lockstep":
        assert sizes == [len(SEEDS)] * max(lengths)  # one forward per step, ended rows included
    else:
        assert sizes == [1] * sum(lengths)  # one forward per decision, none for ended episodes


@pytest.mark.parametrize("stochastic", [False, True], ids=["deterministic", "stochastic"])
def test_shipped_cartpole_lockstep_equals_single_on_this_cpu(stochastic: bool) -> None:
    """The CPU is batch-invariant for this policy; a card that is not shows up as a finding."""
    policy, seeds = load_policy("cartpole"), [7, 2, 40, 11]
    lockstep = run_episodes(policy, DEVICE, ENV_ID, seeds, stochastic, "lockstep")
    assert_same_episodes(lockstep, run_episodes(policy, DEVICE, ENV_ID, seeds, stochastic, "single"))


def test_a_seed_trajectory_depends_on_the_set_of_seeds_not_their_order() -> None:
    """Rows are in ascending seed order, so a permutation is the same batch, bit for bit."""
    policy = tiny_policy("CartPole-v1", **CASES["CartPole-v1"])
    forward = run_episodes(policy, DEVICE, "CartPole-v1", [1, 9, 4, 6], True, "lockstep")
    backward = run_episodes(policy, DEVICE, "CartPole-v1", [6, 4, 9, 1], True, "lockstep")
    assert_same_episodes(forward, backward[::-1])


def test_on_a_batch_variant_card_other_seeds_matter_only_through_the_batch_shape() -> None:
    """Seed 7 beside three others that all end before it, at other steps in each set: the same
    trajectory, because ended rows stay in the batch. Alone (batch 1), it takes another one;
    were ended rows dropped, it would change the moment the first of the others ended."""
    policy = tiny_policy(
        "CartPole-v1", 4, 2, head=nn.Sequential(tiny_policy("CartPole-v1", 4, 2).head, BatchSizeShift([0.0, 0.02]))
    )
    beside_some, beside_others = (
        run_episodes(policy, DEVICE, "CartPole-v1", seeds, False, "lockstep") for seeds in ([7, 0, 8, 9], [7, 1, 2, 3])
    )
    others_end = sorted(e.length for e in beside_some[1:]), sorted(e.length for e in beside_others[1:])
    assert others_end[0] != others_end[1] and max(others_end[0] + others_end[1]) < beside_some[0].length
    assert_same_episodes(beside_some[:1], beside_others[:1])
    for batching in ("lockstep", "single"):
        alone = run_episodes(policy, DEVICE, "CartPole-v1", [7], False, batching)[0]
        assert alone.actions_sha256 != beside_some[0].actions_sha256


def test_unknown_batching_and_unfit_environment_are_refused() -> None:
    policy = load_policy("cartpole")
    with pytest.raises(ValueError, match="lockstep, single"):
        run_episodes(policy, DEVICE, ENV_ID, [0], False, "batched")
    with pytest.raises(UsageError, match="does not fit policy cartpole"):
        run_episodes(policy, DEVICE, "Pendulum-v1", [0], False, "lockstep")
