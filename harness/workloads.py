"""Fixed inputs: observation batches and sampling noise, made on the CPU from a seed.

Batch k of a sweep is always the same bytes (as Polygraphy's data loader makes iteration k the
same data), every card and the reference get exactly those bytes, and each batch is named by
the sha256 of its bytes so any result row can be traced to what went in.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import assert_never

import numpy as np

from harness.policies.base import (
    ACTION_MASK,
    EPISODE_START,
    NORMALIZER_CLAMP,
    ObsInput,
    PolicyInfo,
    SamplingKind,
    branch_starts,
)

DISTRIBUTIONS = ("normal", "uniform", "edge")
# Observation bounds that are infinite, or float32-max as gymnasium writes "unbounded" (CartPole
# velocities), are drawn from this range instead.
UNBOUNDED_RANGE = 1.0
UNBOUNDED_ABOVE = 1.0e30
# "Far beyond the clamp": this many normalizer standard deviations from the mean.
FAR_SIGMAS = 1.0e4
# Epsilon-greedy noise: the score added to a row's random action, beyond any Q-value a policy
# computes, so argmax(q + noise) takes it; finite, so the judge's margins stay numbers.
EXPLORE = 1.0e30


@dataclass(frozen=True)
class ObsBatch:
    """One fixed batch: observations (one array per policy input) and the noise to sample with."""

    distribution: str
    seed: int
    obs: tuple[np.ndarray, ...]  # one per input of the policy, each (size, *shape) in its dtype, then its step inputs
    noise: np.ndarray  # float32 (size, *noise_shape(info)): see make_noise
    sha256: str
    step_inputs: tuple[str, ...] = ()  # the names of the arrays after the observations in `obs`

    def step_input(self, name: str) -> np.ndarray | None:
        """The batch's step input `name` (`PolicyInfo.step_inputs`); None where it feeds none."""
        if name not in self.step_inputs:
            return None
        return self.obs[len(self.obs) - len(self.step_inputs) + self.step_inputs.index(name)]

    @property
    def size(self) -> int:
        return int(self.obs[0].shape[0])

    @property
    def name(self) -> str:
        return f"{self.distribution}-b{self.size}-s{self.seed}"


def make_batch(
    info: PolicyInfo,
    distribution: str,
    size: int,
    seed: int,
    clamp_bounds: tuple[np.ndarray, np.ndarray] | None = None,
    clamp: float = NORMALIZER_CLAMP,
) -> ObsBatch:
    """Observations for `info`'s inputs, each in its shape and dtype. The float inputs are drawn
    together, as one row of their concatenated values (what a normalizer sees), then the uint8
    (images) and int64 ones (Discrete, MultiDiscrete, MultiBinary values) in input order, each
    value of the space, inside its bounds; then the noise. `clamp_bounds` (mean -/+ `clamp` std of
    the normalizer) lets `edge` put values exactly on the clamp and far beyond it; without it
    `edge` uses the observation bounds, read as if they were 5 std out."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; known: {', '.join(DISTRIBUTIONS)}")
    rng = np.random.default_rng([seed, size, DISTRIBUTIONS.index(distribution)])
    floats = [i for i in info.inputs if i.dtype == "float32"]
    width = sum(i.size for i in floats)
    if distribution == "normal":
        flat = rng.standard_normal((size, width), dtype=np.float32)
    elif distribution == "uniform":
        low, high = _finite_bounds(floats)
        flat = rng.uniform(low, high, (size, width)).astype(np.float32)
    else:
        flat = _edge_rows(floats, size, clamp_bounds, clamp, rng)
    parts = iter(np.split(flat, np.cumsum([i.size for i in floats])[:-1], axis=1))
    drawn = {i.name: next(parts).reshape(size, *i.shape) for i in floats}
    drawn |= {i.name: _integer_rows(i, size, distribution, rng) for i in info.inputs if i.dtype != "float32"}
    obs = tuple(np.ascontiguousarray(drawn[i.name]) for i in info.inputs)
    noise = make_noise(info, size, rng)
    obs += tuple(_step_input(info, name, size, rng) for name in info.step_inputs)
    return ObsBatch(distribution, seed, obs, noise, batch_sha256(obs, noise), info.step_inputs)


def _step_input(info: PolicyInfo, name: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """A batch's episode starts or action masks (`PolicyInfo.step_inputs`), drawn after the noise
    so that a policy without them gets the bytes it always got."""
    if name == EPISODE_START:
        return episode_starts(size)
    if name == ACTION_MASK:
        return action_masks(info.branch_sizes, size, rng)
    raise ValueError(f"unknown step input {name!r}")


def episode_starts(size: int) -> np.ndarray:
    """Where a recurrent policy's batch (one sequence) starts an episode: at its first row and at
    the start of its last eighth (its last row, in a batch of 2 to 15 rows), so that a reset in
    mid-sequence is checked wherever a batch has rows for one, and nowhere else: the state's error
    is seen over the longest stretch the batch holds. A batch of one row is one first step."""
    starts = np.zeros(size, dtype=bool)
    starts[0] = True
    if size > 1:
        starts[size - max(size // 8, 1)] = True
    return starts


def action_masks(branches: tuple[int, ...], size: int, rng: np.random.Generator) -> np.ndarray:
    """Each row's legal actions, (size, sum(branches)), the branches' columns side by side: each
    action legal with probability one half, and in each branch one drawn action always legal,
    as an environment always leaves one (one branch: a discrete policy's masks)."""
    masks = rng.uniform(0.0, 1.0, (size, sum(branches))) < 0.5
    for first, n_actions in zip(branch_starts(branches), branches, strict=True):
        masks[np.arange(size), first + rng.integers(0, n_actions, size)] = True
    return masks


def noise_shape(info: PolicyInfo) -> tuple[int, ...]:
    """One row's noise: a value per action, or gSDE's exploration matrix (latent, actions)."""
    if info.sampling.kind is SamplingKind.STATE_DEPENDENT:
        return (info.sampling.latent_size, info.action_size)
    return (info.action_size,)


def make_noise(info: PolicyInfo, size: int, rng: np.random.Generator) -> np.ndarray:
    """Sampling noise made on the CPU: cards have no reproducible RNG, so all draw from this.

    The head's distribution: Gumbel(0, 1) per discrete action, of every branch (Gumbel-max sampling), N(0, 1) per
    continuous one. Epsilon-greedy: 0, or EXPLORE on a uniform random action in a row drawn with
    probability epsilon (each row decides alone; SB3's predict draws once per batch). gSDE: an
    N(0, 1) exploration matrix per row, which the policy scales by its std. Deterministic: zeros.
    """
    kind = info.sampling.kind
    match kind:
        case SamplingKind.DISTRIBUTION if info.action_kind in ("discrete", "multi_discrete"):
            u = rng.uniform(np.finfo(np.float64).tiny, 1.0, (size, info.action_size))
            return (-np.log(-np.log(u))).astype(np.float32)
        case SamplingKind.DISTRIBUTION | SamplingKind.STATE_DEPENDENT:
            return rng.standard_normal((size, *noise_shape(info)), dtype=np.float32)
        case SamplingKind.EPSILON_GREEDY:
            explore = rng.uniform(0.0, 1.0, size) < info.sampling.epsilon
            actions = rng.integers(0, info.action_size, size)
            noise = np.zeros((size, info.action_size), dtype=np.float32)
            noise[np.flatnonzero(explore), actions[explore]] = EXPLORE
            return noise
        case SamplingKind.DETERMINISTIC:
            return np.zeros((size, info.action_size), dtype=np.float32)
        case _:
            assert_never(kind)


def episode_noise(info: PolicyInfo, episode_seed: int, steps: int) -> np.ndarray:
    """Per-step noise for a stochastic episode, the same on every card: (steps, *noise shape), or
    (1, *noise shape) for gSDE, whose exploration matrix is held for the whole episode."""
    held = info.sampling.kind is SamplingKind.STATE_DEPENDENT
    return make_noise(info, 1 if held else steps, np.random.default_rng([episode_seed, 0x5EED]))


def batch_sha256(obs: tuple[np.ndarray, ...], noise: np.ndarray) -> str:
    digest = hashlib.sha256()
    for array in (*obs, noise):
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _bounds(inputs: list[ObsInput]) -> tuple[np.ndarray, np.ndarray]:
    """The inputs' bounds, concatenated; infinite where an input has none."""
    low = [np.asarray(i.low if i.low is not None else [-np.inf] * i.size, dtype=np.float64) for i in inputs]
    high = [np.asarray(i.high if i.high is not None else [np.inf] * i.size, dtype=np.float64) for i in inputs]
    return np.concatenate(low or [np.zeros(0)]), np.concatenate(high or [np.zeros(0)])


def _finite_bounds(inputs: list[ObsInput]) -> tuple[np.ndarray, np.ndarray]:
    low, high = _bounds(inputs)
    low = np.where(np.abs(low) < UNBOUNDED_ABOVE, low, -UNBOUNDED_RANGE)
    high = np.where(np.abs(high) < UNBOUNDED_ABOVE, high, UNBOUNDED_RANGE)
    return low, high


def _edge_rows(
    inputs: list[ObsInput],
    size: int,
    clamp_bounds: tuple[np.ndarray, np.ndarray] | None,
    clamp: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Zeros, the clamp (or space) bounds, values far beyond them, and a random mix of those."""
    if clamp_bounds is not None:
        low, high = (np.asarray(b, dtype=np.float64) for b in clamp_bounds)
    else:
        low, high = _finite_bounds(inputs)
    centre, half = (low + high) / 2, (high - low) / 2
    far = FAR_SIGMAS * half / clamp
    rows = np.stack([np.zeros_like(low), low, high, centre - far, centre + far])
    mixed = rows[rng.integers(0, len(rows), (max(size - len(rows), 0), low.size)), np.arange(low.size)]
    return np.concatenate([rows, mixed])[:size].astype(np.float32)


def _integer_rows(inp: ObsInput, size: int, distribution: str, rng: np.random.Generator) -> np.ndarray:
    """An image's or an integer input's rows, inside its bounds (an image's 0 to 255 where it has
    none): any value of the range for `normal` and `uniform`; for `edge` the two bounds, then a
    mix of them."""
    if inp.dtype == "int64":
        low, high = inp.value_range()
    else:
        low, high = _bounds([inp])
        low = np.clip(np.where(np.isfinite(low), low, 0), 0, 255).astype(np.int64)
        high = np.clip(np.where(np.isfinite(high), high, 255), 0, 255).astype(np.int64)
    if distribution == "edge":
        rows = np.stack([low, high])
        flat = rows[rng.integers(0, 2, (size, low.size)), np.arange(low.size)]
        flat[: min(size, 2)] = rows[: min(size, 2)]
    else:
        flat = rng.integers(low, high + 1, (size, low.size))
    return flat.astype(inp.dtype).reshape(size, *inp.shape)


def poisson_arrivals(rate_qps: float, n: int, seed: int) -> np.ndarray:
    """Arrival times (seconds from the start, float64, increasing) of `n` requests arriving as a
    Poisson process of `rate_qps` per second: independent exponential gaps, as MLPerf LoadGen's
    Server scenario issues queries. One seed gives one schedule at every rate, scaled by 1 / rate
    (common random numbers): trials of a rate search differ in their rate, not in their luck."""
    rng = np.random.default_rng([seed, 0xA881FE])
    return np.cumsum(rng.exponential(1.0 / rate_qps, n))
