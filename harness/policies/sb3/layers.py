"""What every SB3 family is built from: the state dict's tensors, each taken once by name and
shape; Linear chains as SB3's `create_mlp` lays them out; the features extractors SB3 ships
(FlattenExtractor, NatureCNN, CombinedExtractor), rebuilt with SB3's own child names.

Shapes are checked against what the file declares before a module is built, so nothing read
from the JSON ever allocates more than the (bounded) state dict already holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from harness.errors import PolicyLoadError
from harness.policies.base import BatchNorm, ObsInput
from harness.policies.sb3.archive import ACTIVATIONS
from harness.policies.sb3.spaces import BoxSpace, DictSpace, IntegerSpace, ObservationSpace

# NatureCNN's three convolutions: (out channels, kernel, stride), padding 0 (torch_layers.py).
NATURE_CNN = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
FLATTEN = "stable_baselines3.common.torch_layers.FlattenExtractor"
NATURE = "stable_baselines3.common.torch_layers.NatureCNN"
COMBINED = "stable_baselines3.common.torch_layers.CombinedExtractor"


class Weights:
    """policy.pth's tensors as a family reads them: each taken once, by name, its shape checked.
    Whatever no part of the policy takes, and no critic or target network holds, is refused
    (`check_all_taken`), so a layer this loader does not know is never silently dropped."""

    def __init__(self, path: Path, state: dict[str, torch.Tensor]) -> None:
        self.path = path
        self.state = state
        self.taken: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.state

    def take(self, key: str, shape: tuple[int, ...], why: str = "") -> torch.Tensor:
        got = self.state.get(key)
        if got is None or tuple(got.shape) != shape:
            what = "missing" if got is None else f"shape {tuple(got.shape)}"
            raise PolicyLoadError(self.path, f"policy.pth {key} is {what}, but {why or 'the policy'} expects {shape}")
        self.taken.add(key)
        return got.float()

    def shape(self, key: str) -> tuple[int, ...] | None:
        got = self.state.get(key)
        return None if got is None else tuple(got.shape)

    def indices(self, prefix: str) -> list[int]:
        """The Sequential indices under `prefix` that hold a 2-D weight, in order."""
        found = {k[len(prefix) :].split(".")[0] for k in self.state if k.startswith(prefix) and k.endswith(".weight")}
        return sorted(int(i) for i in found if i.isdigit() and self.state[f"{prefix}{i}.weight"].dim() == 2)

    def check_all_taken(self, ignored: Iterable[str], family: str) -> None:
        left = sorted(k for k in self.state if k not in self.taken and not k.startswith(tuple(ignored)))
        if left:
            problem = f"policy.pth has {left[0]} ({len(left)} such), which no part of {family} holds: not supported"
            raise PolicyLoadError(self.path, problem)


def linear(weights: Weights, prefix: str, n_in: int, n_out: int | None = None, why: str = "") -> nn.Linear:
    """The Linear at `prefix` (`prefix.weight`, and `prefix.bias` where it has one), taking n_in."""
    shape = weights.shape(f"{prefix}.weight")
    out = n_out if n_out is not None else (shape[0] if shape is not None and len(shape) == 2 else 0)
    weight = weights.take(f"{prefix}.weight", (out, n_in), why)
    bias = weights.take(f"{prefix}.bias", (out,), why) if weights.has(f"{prefix}.bias") else None
    layer = nn.Linear(n_in, out, bias=bias is not None)
    layer.load_state_dict({"weight": weight} | ({"bias": bias} if bias is not None else {}))
    return layer


def linear_chain(weights: Weights, prefix: str, n_in: int, why: str = "") -> list[nn.Linear]:
    """The Linear layers of an SB3 `create_mlp` Sequential at `prefix`: at indices 0, 2, 4, ...,
    an activation (no weights) after each but the last. Other layouts (normalization or dropout
    modules between them) are refused."""
    found = weights.indices(prefix)
    if found != list(range(0, 2 * len(found), 2)):
        problem = f"policy.pth {prefix}* has Linear layers at {found}, not an SB3 MLP's 0, 2, 4, ..."
        raise PolicyLoadError(weights.path, problem)
    layers = []
    for i in found:
        layers.append(linear(weights, f"{prefix}{i}", n_in, why=why))
        n_in = layers[-1].out_features
    return layers


def batch_norm(weights: Weights, prefix: str, size: int, eps: float) -> BatchNorm:
    """sb3-contrib's BatchRenorm at `prefix` in eval mode: its running statistics and its affine
    (`steps`, a training counter, is taken and left)."""
    why = f"a batch renormalization of {size} features"
    weights.take(f"{prefix}.steps", (), why)
    mean, var = (weights.take(f"{prefix}.{name}", (size,), why) for name in ("ra_mean", "ra_var"))
    scale, bias = (weights.take(f"{prefix}.{name}", (size,), why) for name in ("scale", "bias"))
    return BatchNorm(mean, var, eps, scale, bias)


def renormalized_chain(
    weights: Weights, prefix: str, n_in: int, activation: str, eps: float
) -> tuple[nn.Sequential, list[int]]:
    """CrossQ's actor MLP at `prefix`, as create_mlp lays it out with a BatchRenorm before each
    Linear and CrossQ appends one after the last activation: norm 0, Linear 1, activation 2,
    norm 3, ..., norm 3n. Returns the Sequential and its hidden sizes."""
    found = weights.indices(prefix)
    norms = sorted(
        int(k[len(prefix) :].split(".")[0]) for k in weights.state if k.startswith(prefix) and k.endswith(".ra_mean")
    )
    n = len(found)
    if found != [3 * k + 1 for k in range(n)] or norms != [3 * k for k in range(n + 1 if n else 0)]:
        problem = f"policy.pth {prefix}* has Linear layers at {found} and batch norms at {norms}, not CrossQ's layout"
        raise PolicyLoadError(weights.path, problem)
    modules: list[nn.Module] = []
    hidden: list[int] = []
    for k in range(n):
        modules.append(batch_norm(weights, f"{prefix}{3 * k}", n_in, eps))
        layer = linear(weights, f"{prefix}{3 * k + 1}", n_in, why=f"{prefix} on {n_in} features")
        modules += [layer, ACTIVATIONS[activation]()]
        n_in = layer.out_features
        hidden.append(n_in)
    if n:
        modules.append(batch_norm(weights, f"{prefix}{3 * n}", n_in, eps))
    return nn.Sequential(*modules), hidden


def mlp_of(layers: list[nn.Linear], activation: str) -> nn.Sequential:
    """`layers`, each followed by `activation`, laid out as `base.mlp` lays out a body (Linear at
    body.0, body.2, ...), with the weights they hold."""
    return nn.Sequential(*(module for layer in layers for module in (layer, ACTIVATIONS[activation]())))


class NatureCnn(nn.Module):
    """SB3's NatureCNN with its child names (`cnn.0` ... `cnn.6`, `linear.0`, `linear.1`)."""

    def __init__(self, convs: list[nn.Conv2d], out: nn.Linear) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for conv in convs:
            layers += [conv, nn.ReLU()]
        self.cnn = nn.Sequential(*layers, nn.Flatten())
        self.linear = nn.Sequential(out, nn.ReLU())
        self.features_dim = out.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(self.cnn(x))
        return out


class Combined(nn.Module):
    """SB3's CombinedExtractor: each key of a dict observation through its own extractor
    (NatureCNN for an image, Flatten for a vector or an encoded integer key), concatenated in the
    space's key order."""

    def __init__(self, extractors: dict[str, nn.Module]) -> None:
        super().__init__()
        self.extractors = nn.ModuleDict(extractors)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return torch.cat([extract(x) for extract, x in zip(self.extractors.values(), inputs, strict=True)], dim=1)


@dataclass(frozen=True)
class Features:
    """What turns the observation into the vector the body takes."""

    module: nn.Module | None  # None: the observation is one vector already (FlattenExtractor)
    inputs: tuple[ObsInput, ...]
    size: int  # the features' width: what the body takes
    normalize_images: bool
    detail: str  # e.g. "NatureCNN 3x84x84"; "" for a flattened vector


def features(weights: Weights, prefix: str, extractor: str, space: ObservationSpace, normalize_images: bool) -> Features:
    """The features extractor at `prefix` ("features_extractor.", "actor.features_extractor.") of
    the class `extractor`, for the observation `space`."""
    build = EXTRACTORS.get(extractor)
    if build is None:
        known = ", ".join(name.rsplit(".", 1)[1] for name in EXTRACTORS)
        raise PolicyLoadError(weights.path, f"features extractor {extractor} is not supported (only SB3's {known})")
    return build(weights, prefix, space, normalize_images)


def _flatten(weights: Weights, prefix: str, space: ObservationSpace, normalize_images: bool) -> Features:
    if isinstance(space, IntegerSpace):
        return Features(None, (_integer_input("obs", space),), space.width, False, space.describe())
    box = _box(weights, space, "FlattenExtractor")
    if _is_image(box):
        problem = "image observations (uint8, 3 dimensions) under FlattenExtractor are not supported: use CnnPolicy"
        raise PolicyLoadError(weights.path, problem)
    return Features(None, (ObsInput("obs", (box.size,), "float32", box.low, box.high),), box.size, False, "")


def _nature(weights: Weights, prefix: str, space: ObservationSpace, normalize_images: bool) -> Features:
    box = _box(weights, space, "NatureCNN")
    cnn = _nature_cnn(weights, prefix, "obs", box, normalize_images)
    return Features(cnn, (_image_input("obs", box),), cnn.features_dim, normalize_images, f"NatureCNN {_shape(box)}")


def _combined(weights: Weights, prefix: str, space: ObservationSpace, normalize_images: bool) -> Features:
    """A NatureCNN for each key SB3 took for an image (policy.pth holds its convolutions), a
    Flatten for each other key."""
    if not isinstance(space, DictSpace):
        raise PolicyLoadError(weights.path, "CombinedExtractor needs a Dict observation space")
    extractors: dict[str, nn.Module] = {}
    inputs, parts, size = [], [], 0
    for key, sub in space.spaces:
        at = f"{prefix}extractors.{key}."
        if isinstance(sub, IntegerSpace):
            extractors[key], width = nn.Flatten(), sub.width
            inputs.append(_integer_input(key, sub))
            parts.append(f"{key} {sub.describe()}")
        elif weights.has(f"{at}cnn.0.weight"):
            cnn = _nature_cnn(weights, at, key, sub, normalize_images)
            extractors[key], width = cnn, cnn.features_dim
            inputs.append(_image_input(key, sub))
            parts.append(f"{key} NatureCNN {_shape(sub)}")
        elif sub.dtype == "uint8":
            raise PolicyLoadError(weights.path, f"Dict observation key {key!r} is uint8 but no image: not supported")
        else:
            extractors[key], width = nn.Flatten(), sub.size
            inputs.append(ObsInput(key, sub.shape, "float32", sub.low, sub.high))
            parts.append(f"{key} {_shape(sub)}")
        size += width
    return Features(Combined(extractors), tuple(inputs), size, normalize_images, "Combined: " + ", ".join(parts))


EXTRACTORS: dict[str, Callable[[Weights, str, ObservationSpace, bool], Features]] = {
    FLATTEN: _flatten,
    NATURE: _nature,
    COMBINED: _combined,
}
"""SB3's features extractors, by class; any other is refused by name."""


def _box(weights: Weights, space: ObservationSpace, extractor: str) -> BoxSpace:
    if isinstance(space, DictSpace):
        raise PolicyLoadError(weights.path, f"a Dict observation needs MultiInputPolicy (CombinedExtractor), not {extractor}")
    if isinstance(space, IntegerSpace):
        raise PolicyLoadError(weights.path, f"{extractor} takes an image Box, not a {space.kind} observation")
    return space


def _integer_input(name: str, space: IntegerSpace) -> ObsInput:
    """Integer values as the environment gives them, int64 in their range (`ObsInput.value_range`):
    the policy encodes them (`encode_integers`)."""
    return ObsInput(name, (space.size,), "int64", classes=space.classes)


def _is_image(space: BoxSpace) -> bool:
    return space.dtype == "uint8" and len(space.shape) == 3


def _shape(space: BoxSpace) -> str:
    return "x".join(map(str, space.shape))


def _image_input(name: str, space: BoxSpace) -> ObsInput:
    """An image as the policy sees it, channels first (after VecTransposeImage): uint8 within
    0-255 as SB3 requires of what it scales (its bounds, summarized in data, go without saying),
    or floats already normalized."""
    if space.dtype == "uint8":
        return ObsInput(name, space.shape, "uint8")
    return ObsInput(name, space.shape, "float32", space.low, space.high)


def _nature_cnn(weights: Weights, prefix: str, name: str, space: BoxSpace, normalize_images: bool) -> NatureCnn:
    path = weights.path
    if len(space.shape) != 3:
        raise PolicyLoadError(path, f"NatureCNN takes a 3-dimensional image, but {name} has shape {space.shape}")
    if normalize_images and space.dtype != "uint8":
        raise PolicyLoadError(path, f"{name} is {space.dtype} with normalize_images set: SB3 scales only uint8 images")
    channels, height, width = space.shape
    convs = []
    for index, (out, kernel, stride) in zip((0, 2, 4), NATURE_CNN, strict=True):
        why = f"NatureCNN on {name} {_shape(space)}"
        weight = weights.take(f"{prefix}cnn.{index}.weight", (out, channels, kernel, kernel), why)
        bias = weights.take(f"{prefix}cnn.{index}.bias", (out,), why)
        conv = nn.Conv2d(channels, out, kernel, stride)
        conv.load_state_dict({"weight": weight, "bias": bias})
        convs.append(conv)
        channels, height, width = out, (height - kernel) // stride + 1, (width - kernel) // stride + 1
        if height < 1 or width < 1:
            raise PolicyLoadError(path, f"{name} {_shape(space)} is too small for NatureCNN's convolutions")
    flat = channels * height * width
    out_layer = linear(weights, f"{prefix}linear.0", flat, why=f"NatureCNN on {name} {_shape(space)} ({flat} values)")
    return NatureCnn(convs, out_layer)
