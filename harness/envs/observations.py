"""What an environment's observations become for the policy: what SB3's VecEnv pipeline and its
preprocessing make of them, over the batch of lockstep slots.

On the vectorized observations SB3 stacks frames (VecFrameStack, through `StackedObservations`) and
turns images channels first (VecTransposeImage, which SB3 adds where an observation is an image
and not channels first); its policy then takes an image as it is, uint8, the values of a
Discrete, MultiDiscrete or MultiBinary as int64 (the policy encodes them as SB3's preprocess_obs
does: a Discrete's one-hot), and every other key flattened to floats. The stacking and transposing here are SB3's own classes,
imported only for an environment that needs them (frames stacked, or images): they need
stable-baselines3, which the `atari` extra installs. A Dict observation gives one array per key, in
the space's key order; any other observation one array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Space
from gymnasium.spaces.utils import flatdim, flatten
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from harness.envs.protocol import Obs
from harness.envs.spec import ATARI_EXTRA
from harness.errors import UsageError


@dataclass(frozen=True)
class View:
    """One array the environment gives the policy at each step, of one row: what `ObsInput`
    describes on the policy's side."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "uint8" for an image, "int64" for the values of an integer space
    classes: tuple[int, ...] = ()  # int64: each value's classes (a Discrete's n, a MultiDiscrete's nvec); () for MultiBinary

    def describe(self) -> str:
        return f"{self.name} {self.shape} {self.dtype}" + (f" of classes {list(self.classes)}" if self.classes else "")


class Observations:
    """The observations of `n_envs` slots of one environment as the policy's inputs, step after step."""

    def __init__(self, space: Space[Any], n_envs: int, frame_stack: int) -> None:
        parts = dict(space.spaces) if isinstance(space, Dict) else {"obs": space}
        nested = [key for key, part in parts.items() if isinstance(part, Dict) or not isinstance(part, Space)]
        if nested:
            raise UsageError(f"observation space {space} nests spaces in {nested[0]!r}, which SB3 does not take either")
        self.space, self.n_envs = space, n_envs
        self._batch: Any = create_empty_array(space, n_envs)
        self._stack: Any = None
        stacked = parts
        images: dict[str, bool] = dict.fromkeys(parts, False)
        transpose: dict[str, bool] = dict.fromkeys(parts, False)
        if frame_stack or any(_may_be_image(part) for part in parts.values()):
            sb3 = _sb3()
            if frame_stack:
                self._stack = sb3.StackedObservations(n_envs, frame_stack, space)
                out = self._stack.stacked_observation_space
                stacked = dict(out.spaces) if isinstance(out, Dict) else {"obs": out}
            images = {key: bool(sb3.is_image_space(part)) for key, part in stacked.items()}
            transpose = {key: images[key] and not sb3.is_image_space_channels_first(part) for key, part in stacked.items()}
            self._transpose_image = sb3.VecTransposeImage.transpose_image
        self._images, self._transposed = images, transpose
        self._integers = {key: _integers(part) for key, part in stacked.items()}
        self._batched = {key: batch_space(part, n_envs) for key, part in stacked.items()}
        self.views = tuple(self._view(key, part) for key, part in stacked.items())

    def reset(self, raw: list[Any]) -> Obs:
        """The inputs for each slot's first observation (`raw`, one per slot as its wrappers give it)."""
        batch = concatenate(self.space, raw, self._batch)
        if self._stack is not None:
            batch = self._stack.reset(batch)
        return self._inputs(batch)

    def step(self, raw: list[Any], restarted: np.ndarray, terminal: list[Any]) -> Obs:
        """The inputs after a step. `restarted` marks the slots whose wrappers ended an episode and
        were reset within the environment's (a lost life): SB3's VecEnv reset them too, and the
        frame stack starts again there; `terminal` holds their last observation before it."""
        batch = concatenate(self.space, raw, self._batch)
        if self._stack is not None:
            infos = [{"terminal_observation": last} if again else {} for again, last in zip(restarted, terminal, strict=True)]
            batch, _ = self._stack.update(batch, restarted, infos)
        return self._inputs(batch)

    def _inputs(self, batch: Any) -> Obs:
        parts = batch if isinstance(self.space, Dict) else {"obs": batch}
        return tuple(self._input(key, parts[key]) for key in self._batched)

    def _input(self, key: str, values: np.ndarray) -> np.ndarray:
        if self._transposed[key]:
            values = self._transpose_image(values)
        if self._images[key]:
            return np.array(values, dtype=np.uint8, order="C")  # a copy: the stack reuses its buffer
        if self._integers[key]:
            return np.array(values, dtype=np.int64, order="C").reshape(self.n_envs, -1)
        return np.asarray(flatten(self._batched[key], values), dtype=np.float32).reshape(self.n_envs, -1)

    def _view(self, key: str, part: Space[Any]) -> View:
        if self._images[key]:
            shape = tuple(int(n) for n in part.shape or ())
            if self._transposed[key]:
                shape = (shape[2], shape[0], shape[1])
            return View(key, shape, "uint8")
        if self._integers[key]:
            return _integer_view(key, part)
        return View(key, (flatdim(part),), "float32")


def _integer_view(key: str, space: Space[Any]) -> View:
    if isinstance(space, Discrete):
        return View(key, (1,), "int64", (int(space.n),))
    if isinstance(space, MultiDiscrete):
        return View(key, (len(space.nvec),), "int64", tuple(int(n) for n in space.nvec))
    return View(key, (math.prod(space.shape or ()),), "int64")


def _integers(space: Space[Any]) -> bool:
    """What a policy takes as integer values (SB3's preprocess_obs encodes them): a MultiBinary, a
    Discrete or a MultiDiscrete of one axis, counted from 0 as SB3 one-hot encodes them."""
    if isinstance(space, Discrete):
        return int(space.start) == 0
    if isinstance(space, MultiDiscrete):
        return len(space.shape) == 1 and not space.start.any()
    return isinstance(space, MultiBinary)


def _may_be_image(space: Space[Any]) -> bool:
    """What SB3 may take for an image (is_image_space: a uint8 Box of three dimensions, in 0..255):
    SB3 then decides, and only it."""
    return isinstance(space, Box) and space.dtype == np.uint8 and len(space.shape) == 3


class _Sb3:
    """SB3's pieces of its VecEnv pipeline that act on observations."""

    is_image_space: Any
    is_image_space_channels_first: Any
    StackedObservations: Any
    VecTransposeImage: Any

    def __init__(self) -> None:
        from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
        from stable_baselines3.common.vec_env import VecTransposeImage
        from stable_baselines3.common.vec_env.stacked_observations import StackedObservations

        self.is_image_space = is_image_space
        self.is_image_space_channels_first = is_image_space_channels_first
        self.StackedObservations = StackedObservations
        self.VecTransposeImage = VecTransposeImage


def _sb3() -> _Sb3:
    try:
        return _Sb3()
    except ImportError as exc:
        raise UsageError(
            f"stacked frames and image observations are made as SB3 makes them, which needs stable-baselines3 "
            f"({ATARI_EXTRA}): {exc}"
        ) from None
