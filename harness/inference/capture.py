"""The runner's half of "say where it broke": every layer's output for one forward, as numpy.

One forward with a hook on every leaf layer of a `PolicyNet` (`normalizer`, `body.i`, `head`),
outputs copied to the CPU. It runs inside a card's actor, on any torch device, and never
judges: `harness.judge.localize` walks two captures and names the first layer that parts.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from harness.policies.base import ObservationNormalizer, PolicyNet

# numpy has no bfloat16 of its own; float16 is widened with it so every layer of every card
# arrives as float32, the dtype the reference and the output checks use. Widening is exact.
_WIDENED = (torch.float16, torch.bfloat16)


def leaf_layers(policy: PolicyNet) -> dict[str, nn.Module]:
    """The modules hooked, by name: every module without children (`normalizer`, `features.cnn.0`, `body.i`, `head`)."""
    return {name: m for name, m in policy.named_modules() if name and next(m.children(), None) is None}


def layer_modules(policy: PolicyNet) -> dict[str, str]:
    """Short descriptions of the leaf layers, e.g. {"body.0": "Linear(4, 64)"}, for `modules=`."""
    return {name: _module_text(m) for name, m in leaf_layers(policy).items()}


def capture_activations(policy: PolicyNet, obs: tuple[torch.Tensor, ...]) -> dict[str, np.ndarray]:
    """Every leaf layer's output for one forward of `obs`, in execution order, as CPU numpy.

    The dict is filled as hooks fire, so its order is the order the layers ran in. Each output
    is copied at once: an in-place activation later in the forward would otherwise rewrite the
    array of the layer before it on a CPU device, where `.cpu().numpy()` shares memory.

    `obs` may carry a batch's step inputs after the observations: they are left out, so a
    recurrent policy's layers are captured on its zero-state forward (each row a first step; an
    LSTM's output, not its state) and a masked policy's before its masks.
    """
    names = {m: name for name, m in leaf_layers(policy).items()}
    acts: dict[str, np.ndarray] = {}

    def record(module: nn.Module, _inputs: tuple[torch.Tensor, ...], output: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
        acts[names[module]] = _to_numpy(output if isinstance(output, torch.Tensor) else output[0])

    handles = [m.register_forward_hook(record) for m in names]
    try:
        with torch.inference_mode():
            policy(*obs[: len(policy.info.inputs)])
    finally:
        for handle in handles:
            handle.remove()
    return acts


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    dtype = torch.float32 if t.dtype in _WIDENED else t.dtype
    return t.detach().to("cpu", dtype, copy=True).numpy()


def _module_text(m: nn.Module) -> str:
    if isinstance(m, nn.Linear):
        return f"Linear({m.in_features}, {m.out_features})"
    if isinstance(m, nn.Conv2d):
        return f"Conv2d({m.in_channels}, {m.out_channels}, {m.kernel_size[0]}, stride {m.stride[0]})"
    if isinstance(m, ObservationNormalizer):
        return f"{type(m).__name__}({m.mean().numel()})"
    return f"{type(m).__name__}()"
