"""Closed-loop episodes: the environments step on this process's CPU, the policy on the card.

A unit's episodes (one per seed) run together in lockstep environments (harness/envs/), and the
batching says how the policy sees them:

- lockstep: one forward per step over every episode's row. An ended episode keeps its row
  (its last observation, its action dropped), so the batch is as many rows as seeds from the
  first step to the last, whenever the others end.
- single: one forward per running episode per step, at batch 1, as a deployed agent runs.

Rows are in ascending seed order whatever order the caller gives, so a seed's row, like the
batch shape, depends only on the set of seeds. Stochastic episodes draw row i's noise at step t
from `episode_noise(info, seed_i, horizon)[t]` (gSDE: one exploration matrix held for the whole
episode, as SB3 holds it between resets) in both batchings, so on a batch-invariant card
the two agree bit for bit; where they part, the card is batch-variant: a finding, not a bug.
Continuous actions are clipped to the action space's bounds before stepping, as SB3 does, and
recorded as stepped.

A recurrent policy carries each episode's state from step to step, its own slice of the state in
both batchings, zeroed where the episode starts (and where a wrapper ended one inside the
environment's, as SB3's VecEnv says done there). A masked policy chooses among the actions its
environment's `action_masks()` allows at that step; the episode records how many it chose that
were not (`EpisodeOutput.illegal`; a multi-discrete policy's branches each count).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from harness.devices import Device
from harness.envs.lockstep import make_lockstep
from harness.envs.protocol import LockstepEnv, Obs
from harness.envs.registry import action_bounds, check_env
from harness.envs.spec import EnvSpec
from harness.outputs import EpisodeOutput
from harness.policies.base import PolicyNet, branch_starts
from harness.workloads import episode_noise

BATCHINGS = ("lockstep", "single")

Decide = Callable[[tuple[torch.Tensor, ...], int, np.ndarray, np.ndarray, torch.Tensor | None], np.ndarray]
"""(observations on the card, step, which episodes are running, which start their state anew,
the action masks on the card or None) -> every row's action."""


@torch.inference_mode()
def run_episodes(
    policy: PolicyNet,
    device: Device,
    env: EnvSpec | str,
    seeds: Sequence[int],
    stochastic: bool,
    batching: str,
    on_step: Callable[[], None] | None = None,
) -> list[EpisodeOutput]:
    """One seeded episode per seed, in the order of `seeds`; `on_step` is called after each step."""
    check_env(env, policy.info)
    envs = make_lockstep(env, len(seeds))
    try:
        return play(policy, device, envs, seeds, stochastic, batching, on_step)
    finally:
        envs.close()


@torch.inference_mode()
def play(
    policy: PolicyNet,
    device: Device,
    envs: LockstepEnv,
    seeds: Sequence[int],
    stochastic: bool,
    batching: str,
    on_step: Callable[[], None] | None = None,
) -> list[EpisodeOutput]:
    """The episodes of `seeds` on `envs` (one environment per seed), in the order of `seeds`;
    `on_step` after each step: an actor's progress, which tells the driver it is not hung."""
    if batching not in BATCHINGS:
        raise ValueError(f"unknown batching {batching!r}; known: {', '.join(BATCHINGS)}")
    order = np.argsort(np.asarray(seeds, dtype=np.int64), kind="stable")
    row_seeds = [int(seeds[i]) for i in order]
    noise = _noise(policy, device, row_seeds, envs.horizon) if stochastic else None
    decide = (_lockstep if batching == "lockstep" else _single)(policy, noise, len(row_seeds))
    bounds = action_bounds(envs.spec) if policy.info.action_kind == "continuous" else None

    obs = envs.reset(row_seeds)
    running = np.ones(len(row_seeds), dtype=bool)
    starts = np.ones(len(row_seeds), dtype=bool)
    totals = np.zeros(len(row_seeds), dtype=np.float64)
    lengths = np.zeros(len(row_seeds), dtype=np.int64)
    illegal = np.zeros(len(row_seeds), dtype=np.int64)
    stepped: list[np.ndarray] = []
    for t in range(envs.horizon):
        masks = envs.action_masks() if policy.info.masked else None
        on_card = tuple(torch.from_numpy(o).to(device.torch_device) for o in as_inputs(policy, obs))
        masks_on_card = None if masks is None else torch.from_numpy(masks).to(device.torch_device)
        actions = decide(on_card, t, running, starts, masks_on_card)
        if masks is not None:
            illegal += np.where(running, masked_choices(masks, actions, policy.info.branch_sizes), 0)
        if bounds is not None:
            # SB3's predict for a Box: np.clip to the bounds; the env gets the Box's dtype.
            actions = np.clip(actions, *bounds).astype(bounds[0].dtype, copy=False)
        obs, rewards, terminated, truncated = envs.step(actions)
        stepped.append(actions)
        totals += rewards  # 0 for ended episodes
        lengths += running
        running = ~(terminated | truncated)
        starts = envs.restarted()
        if on_step is not None:
            on_step()
        if not running.any():
            break
    history = np.stack(stepped)  # (steps, rows, ...): rows of ended episodes hold dropped actions
    batch_size = len(row_seeds) if batching == "lockstep" else 1
    episodes = [
        EpisodeOutput(
            seed,
            stochastic,
            np.ascontiguousarray(history[: lengths[row], row]),
            float(totals[row]),
            int(lengths[row]),
            batching=batching,
            batch_size=batch_size,
            illegal=int(illegal[row]),
        )
        for row, seed in enumerate(row_seeds)
    ]
    return [episodes[row] for row in np.argsort(order)]  # seed i of the caller sits in row rank(i)


def masked_choices(masks: np.ndarray, actions: np.ndarray, branches: tuple[int, ...]) -> np.ndarray:
    """Each row's chosen actions that its masks (rows, sum(branches)) did not allow: the action of
    a discrete policy (rows,), or each branch's of a multi-discrete one (rows, branches)."""
    columns = np.asarray(branch_starts(branches)) + actions.reshape(len(actions), -1)
    return (~np.take_along_axis(masks, columns, axis=1)).sum(axis=1)


def as_inputs(policy: PolicyNet, obs: Obs) -> Obs:
    """The environment's observation as the policy's inputs: as it is where the environment gives
    one array per input; split along the row where it gives one flat array and the policy takes
    several vectors (an ML-Agents policy of obs_0, obs_1 playing a gymnasium environment)."""
    inputs = policy.info.inputs
    if len(obs) == len(inputs):
        return obs
    if len(obs) == 1 and all(len(i.shape) == 1 for i in inputs):
        return tuple(np.split(obs[0], np.cumsum(policy.info.obs_sizes)[:-1], axis=1))
    raise ValueError(f"the environment gives {len(obs)} observation arrays, {policy.info.name} takes {len(inputs)} inputs")


def choose_actions(policy: PolicyNet, obs: tuple[torch.Tensor, ...], noise: torch.Tensor | None) -> torch.Tensor:
    """One forward over `obs` (one tensor per input of the policy) and each row's action."""
    latent, head = policy.latent_and_head(*obs)
    return _action(policy, latent, head, noise)


def _action(policy: PolicyNet, latent: torch.Tensor, head: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    return policy.deterministic_action(head) if noise is None else policy.stochastic_action(head, noise, latent)


class Stepper:
    """One forward over some rows: their observations, and for a recurrent policy their state,
    which it keeps, every row its own slice (`rows` None: all of them)."""

    def __init__(self, policy: PolicyNet, n_rows: int) -> None:
        self.policy = policy
        self.state = policy.zero_state(n_rows) if policy.memory is not None else None

    def __call__(
        self,
        obs: tuple[torch.Tensor, ...],
        noise: torch.Tensor | None,
        starts: np.ndarray,
        masks: torch.Tensor | None,
        rows: slice | None = None,
    ) -> torch.Tensor:
        policy = self.policy
        if self.state is None:
            latent, head = policy.latent_and_head(*obs)
        else:
            at = rows if rows is not None else slice(None)
            h, c = self.state[0][:, at], self.state[1][:, at]
            start = torch.from_numpy(np.ascontiguousarray(starts[at])).to(h.device)
            latent, head, (h, c) = policy.step(obs, (h, c), start)
            self.state[0][:, at], self.state[1][:, at] = h, c
        return _action(policy, latent, policy.masked_scores(head, masks), noise)


def _lockstep(policy: PolicyNet, noise: torch.Tensor | None, n_rows: int) -> Decide:
    stepper = Stepper(policy, n_rows)

    def decide(
        obs: tuple[torch.Tensor, ...], t: int, running: np.ndarray, starts: np.ndarray, masks: torch.Tensor | None
    ) -> np.ndarray:
        return stepper(obs, None if noise is None else noise[t], starts, masks).cpu().numpy()

    return decide


def _single(policy: PolicyNet, noise: torch.Tensor | None, n_rows: int) -> Decide:
    stepper = Stepper(policy, n_rows)

    def decide(
        obs: tuple[torch.Tensor, ...], t: int, running: np.ndarray, starts: np.ndarray, masks: torch.Tensor | None
    ) -> np.ndarray:
        rows = np.flatnonzero(running)
        # One forward per row; the chosen actions cross to the host together, once per step.
        per_row = [
            stepper(
                tuple(o[i : i + 1] for o in obs),
                None if noise is None else noise[t, i : i + 1],
                starts,
                None if masks is None else masks[i : i + 1],
                slice(i, i + 1),
            )
            for i in rows
        ]
        chosen = torch.cat(per_row).cpu().numpy()
        actions = np.zeros((len(running), *chosen.shape[1:]), dtype=chosen.dtype)
        actions[rows] = chosen
        return actions

    return decide


def _noise(policy: PolicyNet, device: Device, seeds: list[int], horizon: int) -> torch.Tensor:
    """float32 (horizon, rows, *noise shape) on the card: step t's noise is one slice. Noise held
    for a whole episode (gSDE's exploration matrix) is drawn once and repeated, not copied."""
    per_seed = np.stack([episode_noise(policy.info, seed, horizon) for seed in seeds], axis=1)
    noise = torch.from_numpy(per_seed).to(device.torch_device)
    return noise.expand(horizon, *noise.shape[1:])
