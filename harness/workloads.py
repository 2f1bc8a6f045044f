"""Fixed inputs: observation batches and sampling noise, made on the CPU from a seed.

Batch k of a sweep is always the same bytes (as Polygraphy's data loader makes iteration k the
same data), every card and the reference get exactly those bytes, and each batch is named by
the sha256 of its bytes so any result row can be traced to what went in.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from harness.policies.base import NORMALIZER_CLAMP, PolicyInfo

DISTRIBUTIONS = ("normal", "uniform", "edge")
# Observation bounds that are infinite, or float32-max as gymnasium writes "unbounded" (CartPole
# velocities), are drawn from this range instead.
UNBOUNDED_RANGE = 1.0
UNBOUNDED_ABOVE = 1.0e30
# "Far beyond the clamp": this many normalizer standard deviations from the mean.
FAR_SIGMAS = 1.0e4


@dataclass(frozen=True)
class ObsBatch:
    """One fixed batch: observations (one array per policy input) and the noise to sample with."""

    distribution: str
    seed: int
    obs: tuple[np.ndarray, ...]  # float32, each (size, obs_sizes[i])
    noise: np.ndarray  # float32 (size, action_size): Gumbel for discrete, N(0, 1) for continuous
    sha256: str

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
    """Observations for `info`'s inputs. `clamp_bounds` (mean -/+ `clamp` std of the normalizer)
    lets `edge` put values exactly on the clamp and far beyond it; without it `edge` uses the
    observation bounds, read as if they were 5 std out."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; known: {', '.join(DISTRIBUTIONS)}")
    rng = np.random.default_rng([seed, size, DISTRIBUTIONS.index(distribution)])
    width = info.obs_size
    if distribution == "normal":
        flat = rng.standard_normal((size, width), dtype=np.float32)
    elif distribution == "uniform":
        low, high = _finite_bounds(info)
        flat = rng.uniform(low, high, (size, width)).astype(np.float32)
    else:
        flat = _edge_rows(info, size, clamp_bounds, clamp, rng)
    split = np.cumsum(info.obs_sizes)[:-1]
    obs = tuple(np.ascontiguousarray(part) for part in np.split(flat, split, axis=1))
    noise = make_noise(info, size, rng)
    return ObsBatch(distribution, seed, obs, noise, batch_sha256(obs, noise))


def make_noise(info: PolicyInfo, size: int, rng: np.random.Generator) -> np.ndarray:
    """Sampling noise made on the CPU: cards have no reproducible RNG, so all draw from this."""
    if info.action_kind == "discrete":
        u = rng.uniform(np.finfo(np.float64).tiny, 1.0, (size, info.action_size))
        return (-np.log(-np.log(u))).astype(np.float32)  # Gumbel(0, 1), for Gumbel-max sampling
    return rng.standard_normal((size, info.action_size), dtype=np.float32)


def episode_noise(info: PolicyInfo, episode_seed: int, steps: int) -> np.ndarray:
    """Per-step noise for a stochastic episode: (steps, action_size), the same on every card."""
    return make_noise(info, steps, np.random.default_rng([episode_seed, 0x5EED]))


def batch_sha256(obs: tuple[np.ndarray, ...], noise: np.ndarray) -> str:
    digest = hashlib.sha256()
    for array in (*obs, noise):
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _finite_bounds(info: PolicyInfo) -> tuple[np.ndarray, np.ndarray]:
    width = info.obs_size
    low = np.asarray(info.obs_low if info.obs_low is not None else [-np.inf] * width, dtype=np.float64)
    high = np.asarray(info.obs_high if info.obs_high is not None else [np.inf] * width, dtype=np.float64)
    low = np.where(np.abs(low) < UNBOUNDED_ABOVE, low, -UNBOUNDED_RANGE)
    high = np.where(np.abs(high) < UNBOUNDED_ABOVE, high, UNBOUNDED_RANGE)
    return low, high


def _edge_rows(
    info: PolicyInfo,
    size: int,
    clamp_bounds: tuple[np.ndarray, np.ndarray] | None,
    clamp: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Zeros, the clamp (or space) bounds, values far beyond them, and a random mix of those."""
    if clamp_bounds is not None:
        low, high = (np.asarray(b, dtype=np.float64) for b in clamp_bounds)
    else:
        low, high = _finite_bounds(info)
    centre, half = (low + high) / 2, (high - low) / 2
    far = FAR_SIGMAS * half / clamp
    rows = np.stack([np.zeros_like(low), low, high, centre - far, centre + far])
    mixed = rows[rng.integers(0, len(rows), (max(size - len(rows), 0), low.size)), np.arange(low.size)]
    return np.concatenate([rows, mixed])[:size].astype(np.float32)


def poisson_arrivals(rate_qps: float, n: int, seed: int) -> np.ndarray:
    """Arrival times (seconds from the start, float64, increasing) of `n` requests arriving as a
        Poisson process of `rate_qps` per second: independent exponential gaps, as MLPerf LoadGen's
        Server scenario issues queries. One seed gives one schedule at every rate, scaled by 1 / rate
    (common random numbers): trials of a rate search differ in their rate, not in their luck."""
    rng = np.random.default_rng([seed, 0xA881FE])
    return np.cumsum(rng.exponential(1.0 / rate_qps, n))
