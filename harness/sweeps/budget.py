"""What a plan will hold in memory, estimated before Ray starts, and the bounds it is held to.

A sweep makes every batch on the driver, sends every unit to every actor at once (each call a
copy of its inputs in Ray's object store) and gathers the outputs, while each actor holds its
policies, the activations of its largest batch and the environments of its episodes. A typo such
as `--batch-sizes 1000000000` or `--episodes 100000000` would otherwise be found by the kernel's
OOM killer minutes later, or leave orphan actors behind; here it is one line, before anything
starts, with the estimate, the bound and the flag that raises it (`--max-memory`).

The figures are upper bounds from sizes, not measurements of a run: every activation of a
forward counted at once, in float64 (the golden's dtype), and the object store holding every
input and output until the end.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from harness.envs.registry import entry_point, max_episode_steps
from harness.errors import UsageError
from harness.policies import PolicyNet
from harness.config.command_plan import BenchPlan, SweepPlan
from harness.config.options import AUTO_EPISODES
from harness.sweeps.plan import planned_batches
from harness.workloads import noise_shape

GIB = 1024**3
# A card or reference actor's own footprint: measured 278 MiB (RSS) for a process with torch,
# Ray, gymnasium and cartpole + huggy-arch in three dtypes.
ACTOR_BYTES = 320 * 1024**2
# One gymnasium environment of a lockstep set, by where it comes from: measured 6 KB for
# seals/CartPole-v0 and under 1 KB for the other classic-control ones, 96 KiB for a LunarLander
# and 342 KiB for a BipedalWalker world, 1.4 MiB for an Atari emulator behind AtariWrapper with
# 4 frames stacked (RSS over 16 of them).
ENV_BYTES = 64 * 1024
ENV_BYTES_BY_ENTRY_POINT = {"gymnasium.envs.box2d": 512 * 1024, "ale_py": 2 * 1024**2}
# Episodes without a horizon of their own are cut at this many steps (harness/envs/lockstep.py).
DEFAULT_HORIZON = 10_000
# The reference computes a batch three ways (golden, float32, the card's dtype).
REFERENCE_CALLS = 3


@dataclass(frozen=True)
class Estimate:
    """Bytes a plan needs, by where they live."""

    driver: int  # every batch made on the driver, and the outputs of the unit it is judging
    object_store: int  # each call's copy of its inputs, and every output until it is gathered
    actors: int  # each actor's process, policies, largest forward's activations and environments

    @property
    def total(self) -> int:
        return self.driver + self.object_store + self.actors

    def describe(self) -> str:
        parts = {"driver": self.driver, "object store": self.object_store, "actors": self.actors}
        return f"{self.total / GIB:.1f} GiB (" + ", ".join(f"{k} {v / GIB:.1f}" for k, v in parts.items()) + ")"


def check_memory(estimate: Estimate, max_memory_gib: float | None) -> None:
    """Refuse a plan whose estimate exceeds `max_memory_gib`, or by default half of the memory
    this machine has available now."""
    if max_memory_gib is not None:
        bound, what = int(max_memory_gib * GIB), f"--max-memory {max_memory_gib:g} GiB"
    else:
        available = available_memory()
        bound, what = available // 2, f"half of the {available / GIB:.1f} GiB this machine has available"
    if estimate.total > bound:
        raise UsageError(
            f"the plan needs about {estimate.describe()}, more than {what}; lower --batch-sizes, --episodes, "
            "--cards or the policies, or raise --max-memory GIB if the machine truly holds it"
        )


def available_memory() -> int:
    """Bytes this machine can give a new process without swapping: the kernel's MemAvailable
    (free memory and the page cache it can drop), else the free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def estimate(plan: SweepPlan | BenchPlan, policies: dict[str, PolicyNet], n_cards: int) -> Estimate:
    """The memory of a sweep or a bench of `policies` on `n_cards` cards."""
    episodes = most_episodes(plan) if isinstance(plan, SweepPlan) else max(plan.common.batch_sizes)
    dtypes, actors = len(plan.common.dtypes), n_cards + (1 if isinstance(plan, SweepPlan) else 0)
    driver = object_store = weights = largest_unit = 0
    for policy in policies.values():
        if isinstance(plan, SweepPlan):
            sizes = [b.rows for b in planned_batches(plan, policy.info)]
        else:
            assert isinstance(plan, BenchPlan)
            sizes = list(plan.common.batch_sizes)
        rows = sum(sizes)
        inputs, outputs = rows * input_bytes_per_row(policy), rows * output_bytes_per_row(policy)
        driver += inputs + max(sizes) * output_bytes_per_row(policy) * (n_cards + REFERENCE_CALLS)
        object_store += dtypes * (inputs + outputs) * (n_cards + REFERENCE_CALLS)
        weights += (dtypes + 2) * weight_bytes(policy)
        # An actor runs one unit at a time: its largest forward, or its largest set of episodes.
        forward = max(sizes) * activation_bytes_per_row(policy)
        largest_unit = max(largest_unit, forward, episode_bytes(policy, episodes) if policy.info.env_id else 0)
    return Estimate(driver, object_store, actors * (ACTOR_BYTES + weights + largest_unit))


def most_episodes(plan: SweepPlan) -> int:
    """The largest episode unit: `--episodes`, or with auto its cap (no round is larger)."""
    return plan.auto_max_episodes if plan.episodes == AUTO_EPISODES else plan.episodes


def input_bytes_per_row(policy: PolicyNet) -> int:
    """One row of observations, in each input's dtype, and its float32 noise (gSDE's: a matrix)."""
    return sum(i.zeros(1).nbytes for i in policy.info.inputs) + 4 * math.prod(noise_shape(policy.info))


def output_bytes_per_row(policy: PolicyNet) -> int:
    """One row's head, action and sampled action, at most float64 each."""
    return 8 * 3 * policy.info.action_size


def weight_bytes(policy: PolicyNet) -> int:
    """The float32 policy's parameters and buffers; a cast copy in another dtype is no larger
    but the golden's float64, which counts twice."""
    tensors = [*policy.parameters(), *policy.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


@torch.inference_mode()
def activation_bytes_per_row(policy: PolicyNet) -> int:
    """What one row's forward holds at its peak, in float64: the observation (an integer one
    one-hot encoded, as wide as its classes), and a layer's input and output at once (an inference
    forward frees each activation once the next layer has it), sized from the largest layer output
    of one forward at batch 1, so any body is covered."""
    largest = 0

    def measure(_module: torch.nn.Module, _inputs: object, output: object) -> None:
        nonlocal largest
        if isinstance(output, torch.Tensor):
            largest = max(largest, output.numel())

    leaves = [m for m in policy.modules() if not any(True for _ in m.children())]
    hooks = [m.register_forward_hook(measure) for m in leaves]
    try:
        policy(*(torch.from_numpy(i.zeros(1)) for i in policy.info.inputs))
    finally:
        for hook in hooks:
            hook.remove()
    return 8 * (sum(i.width for i in policy.info.inputs) + 2 * largest)


def episode_bytes(policy: PolicyNet, episodes: int) -> int:
    """One episode unit on one actor: its lockstep environments and the step-by-step history of
    actions and noise kept until the episodes end."""
    env_id = policy.info.env_id
    horizon = (max_episode_steps(env_id) if env_id else None) or DEFAULT_HORIZON
    per_step = 8 + 2 * 4 * policy.info.action_size  # an int64 or float32 action, and its noise
    where = entry_point(env_id) if env_id else ""
    env = next((n for module, n in ENV_BYTES_BY_ENTRY_POINT.items() if where.startswith(module)), ENV_BYTES)
    return episodes * (env + horizon * per_step)
