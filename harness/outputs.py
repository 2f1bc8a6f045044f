"""What runners hand back across the Ray boundary: numpy arrays and plain records, no torch.

The card and reference actors produce these; the judge reads them. Neither needs the other's
insides, only this shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")

Outputs = dict[str, np.ndarray]
"""One batch's outputs by name: the head (`logits` or `mu`), `action`, `stochastic_action`; a
recurrent policy's state after each step (`STATE_OUTPUTS`)."""

STATE_OUTPUTS = ("state_h", "state_c")
"""A recurrent policy's (h, c) after each step of its batch (one sequence): (rows, layers, hidden), float32."""


@dataclass(frozen=True)
class EpisodeOutput:
    episode_seed: int
    stochastic: bool
    # As stepped: int64 (length,) discrete or (length, branches) multi-discrete; (length, action_size)
    # continuous, in the Box's dtype.
    actions: np.ndarray
    episode_return: float
    length: int
    # How the policy saw the episode: "single" (its own forward at batch 1) or "lockstep" (one
    # forward per step over all the unit's episodes, `batch_size` rows). Batch-variant cards
    # may choose other actions at another size, so only equal batchings are compared.
    batching: str = "single"
    batch_size: int = 1
    # A masked policy's actions (each branch's, multi-discrete) that its environment's action_masks()
    # did not allow at that step.
    illegal: int = 0

    @property
    def actions_sha256(self) -> str:
        """Of dtype, shape and bytes: integer and float sequences of the same bytes never collide."""
        digest = hashlib.sha256(f"{self.actions.dtype.str}{self.actions.shape}".encode())
        digest.update(np.ascontiguousarray(self.actions).tobytes())
        return digest.hexdigest()


@dataclass(frozen=True)
class Produced(Generic[T]):
    """An actor's result and where it was computed. Ray may restart an actor on another node (its
    own died); the driver tells the two cards apart by this, never by which actor handle it asked."""

    device: str  # the device's label on its node: `npu3`, `sim-cpu0`, `cpu`
    node_id: str  # Ray's node id
    value: T


@dataclass(frozen=True)
class Busy:
    """What an actor spent computing the work it was sent, time waiting for work not counted: the
    wall seconds inside its calls, and the CPU seconds of the thread that ran them. Where cores are
    oversubscribed the wall also counts the wait for a core, which the CPU seconds do not."""

    wall_s: float
    cpu_s: float
