"""huggy-arch: the Huggy architecture with seeded synthetic weights, labelled synthetic.

The real Huggy port (Unity ML-Agents PPO, 59 obs -> 3 x Linear(512)+SiLU -> 21 continuous
actions) is what the harness must handle, but its weights are not ours to ship. The shapes and,
above all, the normalizer statistics are what make it hard for a card: variance sums about 1e5
and 2,000,050 normalization steps overflow float16. Those are reproduced here; the numbers are not.
"""

from __future__ import annotations

import hashlib

import torch

from harness.policies.base import PolicyNet
from harness.policies.mlagents import BODY, HEAD, PROCESSORS, weights_from_state_dict

OBS_SIZE = 59
HIDDEN = (512, 512, 512)
ACTION_SIZE = 21
NORMALIZATION_STEPS = 2_000_050  # Huggy's checkpoint count, Huggy-2000050.pt
SEED = 20_231_105


def huggy_state_dict() -> dict[str, torch.Tensor]:
    """A synthetic ML-Agents `Policy` state dict in the Huggy key format, the same on every call."""
    gen = torch.Generator().manual_seed(SEED)

    def uniform(shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
        return torch.rand(shape, generator=gen) * (high - low) + low

    # Variance sums near 1e5, many above float16's 65504, as in the real checkpoint. The exp is
    # taken in float64 and rounded once to float32: float32's exp differs by an ULP between MKL's
    # code paths (an actor under MKL_CBWR=AVX2 on an AVX-512 host, another CPU of the cluster),
    # and the driver refuses an actor that built other bytes than its own.
    spread = torch.exp(uniform((OBS_SIZE,), -0.5, 0.5).double())
    state = {
        f"{PROCESSORS}.0.normalizer.running_mean": torch.randn(OBS_SIZE, generator=gen) * 0.5,
        f"{PROCESSORS}.0.normalizer.running_variance": (1e5 * spread).float(),
        f"{PROCESSORS}.0.normalizer.normalization_steps": torch.tensor(NORMALIZATION_STEPS),
    }
    sizes = [OBS_SIZE, *HIDDEN, ACTION_SIZE]
    names = [f"{BODY}.{2 * i}" for i in range(len(HIDDEN))] + [f"{HEAD}.mu"]
    for name, n_in, n_out in zip(names, sizes[:-1], sizes[1:], strict=True):
        bound = n_in**-0.5  # the scale of PyTorch's default Linear init
        state[f"{name}.weight"] = uniform((n_out, n_in), -bound, bound)
        state[f"{name}.bias"] = uniform((n_out,), -bound, bound)
    state[f"{HEAD}.log_sigma"] = uniform((1, ACTION_SIZE), -0.5, 0.0)
    return state


def huggy_arch() -> PolicyNet:
    state = huggy_state_dict()
    recipe = hashlib.sha256()
    for key, tensor in state.items():
        recipe.update(key.encode())
        recipe.update(tensor.numpy().tobytes())
    weights = weights_from_state_dict(state)
    return weights.to_policy(
        name="huggy-arch",
        source="synthetic",
        sha256=recipe.hexdigest(),
        detail=f"SYNTHETIC weights (seed {SEED}) in the Huggy architecture: 59 obs, {weights.describe()}, 21 actions",
        synthetic=True,
    )
