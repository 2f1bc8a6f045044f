"""What runners hand back across the Ray boundary: numpy arrays and plain records, no torch.

The card and reference actors produce these; the judge reads them. Neither needs the other's
insides, only this shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

Outputs = dict[str, np.ndarray]
"""One batch's outputs by name: the head (`logits` or `mu`), `action`, `stochastic_action`."""


@dataclass(frozen=True)
class EpisodeOutput:
    episode_seed: int
    stochastic: bool
    actions: np.ndarray  # int64 (length,)
    episode_return: float
    length: int

    @property
    def actions_sha256(self) -> str:
        return hashlib.sha256(self.actions.astype(np.int64).tobytes()).hexdigest()
