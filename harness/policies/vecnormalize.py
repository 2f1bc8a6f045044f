"""VecNormalize statistics read from their pickle without running it, and SB3's observation
normalization as a torch module.

`VecNormalize.save` pickles the whole wrapper: its `RunningMeanStd`s, the observation and action
spaces, and the random generators the spaces hold. `pickle.load` would call whatever the file
names, so a user's file goes through `_StatsUnpickler` instead, where every global the file may
name (`ALLOWED`) becomes an inert stand-in that keeps the arguments and state it is given, and
every other global is refused before it is looked up. No SB3 class is instantiated (SB3 need
not even be installed), and no numpy code runs on the file's structure either: numpy's own
reconstructors trust the dtype state they are handed (a structured dtype whose state drops its
object flags takes raw bytes as object pointers), so arrays and scalars are kept as records and
only the few values used are rebuilt, by `_decode`, from plain numeric dtypes and bytes.
"""

from __future__ import annotations

import io
import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.errors import PolicyLoadError, first_line
from harness.policies.base import ObservationNormalizer
from harness.files import read_whole

# A CartPole file is 2 KB; image observations with 8 environments are a few megabytes.
MAX_STATS_BYTES = 64 * 1024 * 1024
# The dtype kinds statistics are rebuilt from: bool, signed, unsigned, float. No object, no fields.
NUMERIC_KINDS = "biuf"


class Inert:
    """Stands in for a pickled class or function: keeps the arguments and the state unpickling
    gives it, runs nothing. NEWOBJ builds it with `__new__` alone, hence the class defaults."""

    args: tuple[Any, ...] = ()
    state: Any = None

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


class VecNormalizeStandIn(Inert):
    """stable_baselines3's VecNormalize; its state is the wrapper's `__getstate__` dict."""


class RunningMeanStdStandIn(Inert):
    """stable_baselines3's RunningMeanStd; its state holds mean, var and count."""


class SpaceStandIn(Inert):
    """A gym or gymnasium space (the wrapper keeps its observation and action spaces)."""


class RandomStandIn(Inert):
    """A numpy random generator, bit generator or seed sequence that a space holds."""


class DtypeRecord(Inert):
    """numpy.dtype(spec, align, copy), then its state (3, byte order, None, ...)."""


class ArrayRecord(Inert):
    """_reconstruct(ndarray, (0,), b"b"), then its state (1, shape, dtype, fortran, bytes)."""


class BufferRecord(Inert):
    """Protocol 5's _frombuffer(bytes, dtype, shape, order)."""


class ScalarRecord(Inert):
    """A numpy scalar: scalar(dtype, bytes)."""


class OrderedDictStandIn(dict[Any, Any]):
    """collections.OrderedDict, which a Dict observation's last observations (`old_obs`) come
    in: a plain dict that takes the items unpickling sets, and runs nothing."""


SB3 = "stable_baselines3.common"
SPACES = (
    ("box", "Box"),
    ("discrete", "Discrete"),
    ("multi_discrete", "MultiDiscrete"),
    ("multi_binary", "MultiBinary"),
    ("tuple", "Tuple"),
    ("dict", "Dict"),
)
# What numpy names when it pickles a generator (numpy.random._pickle, numpy 1.17 on), and
# RandomState's constructor before that: old gym spaces were seeded with a RandomState.
RANDOM = (
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random", "__RandomState_ctor"),
    ("numpy.random._pcg64", "PCG64"),
    ("numpy.random._pcg64", "PCG64DXSM"),
    ("numpy.random._mt19937", "MT19937"),
    ("numpy.random._philox", "Philox"),
    ("numpy.random._sfc64", "SFC64"),
    ("numpy.random.bit_generator", "SeedSequence"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
)
# numpy.core before numpy 2, numpy._core since.
NUMPY_CORE = ("numpy.core", "numpy._core")

ALLOWED: dict[tuple[str, str], type[Inert] | type[OrderedDictStandIn]] = {
    (f"{SB3}.vec_env.vec_normalize", "VecNormalize"): VecNormalizeStandIn,
    (f"{SB3}.running_mean_std", "RunningMeanStd"): RunningMeanStdStandIn,
    **{(f"{gym}.spaces.{module}", name): SpaceStandIn for gym in ("gym", "gymnasium") for module, name in SPACES},
    **{global_: RandomStandIn for global_ in RANDOM},
    ("numpy", "dtype"): DtypeRecord,
    ("numpy", "ndarray"): Inert,  # only ever the first argument of _reconstruct
    **{(f"{core}.multiarray", "_reconstruct"): ArrayRecord for core in NUMPY_CORE},
    **{(f"{core}.numeric", "_frombuffer"): BufferRecord for core in NUMPY_CORE},  # protocol 5 (Python 3.14)
    **{(f"{core}.multiarray", "scalar"): ScalarRecord for core in NUMPY_CORE},
    ("collections", "OrderedDict"): OrderedDictStandIn,
}
"""Every global a VecNormalize file may name (protocols 3 to 5), and its stand-in."""


@dataclass(frozen=True, eq=False)
class Moments:
    """One RunningMeanStd's statistics, float64 in the observation's shape."""

    mean: np.ndarray
    var: np.ndarray


@dataclass(frozen=True, eq=False)
class VecNormalizeStats:
    """What SB3 normalizes observations with. `obs_rms` is as SB3 keeps it: one Moments for a
    Box observation, one per normalized key (`norm_obs_keys`) for a Dict; None where norm_obs
    is False (SB3 keeps no observation statistics then)."""

    path: Path
    content: bytes  # the file's bytes: with the zip's, they identify the policy
    norm_obs: bool
    epsilon: float
    clip_obs: float
    obs_rms: Moments | dict[str, Moments] | None

    def describe(self) -> str:
        keys = f", keys {', '.join(self.obs_rms)}" if isinstance(self.obs_rms, dict) else ""
        return f"clip {self.clip_obs:g}, epsilon {self.epsilon:g}{keys}"


class _StatsUnpickler(pickle.Unpickler):
    def __init__(self, path: Path, content: bytes) -> None:
        super().__init__(io.BytesIO(content))
        self.path = path

    def find_class(self, module: str, name: str) -> type[Inert] | type[OrderedDictStandIn]:
        found = ALLOWED.get((module, name))
        if found is None:
            shown = ascii(f"{module}.{name}"[:120])
            problem = f"pickles {shown}, which VecNormalize statistics never hold: refused, nothing run"
            raise PolicyLoadError(self.path, problem)
        return found


def read_vecnormalize(path: Path) -> VecNormalizeStats:
    """The statistics in a `VecNormalize.save` file, read without running it; PolicyLoadError
    (one line, naming the file) for anything else."""
    content = read_whole(path, MAX_STATS_BYTES, "VecNormalize statistics", PolicyLoadError)
    try:
        wrapper = _StatsUnpickler(path, content).load()
    except PolicyLoadError:
        raise
    except RecursionError:
        raise PolicyLoadError(path, "is a pickle nested too deeply to read") from None
    except Exception as exc:  # a damaged pickle raises many types; all mean "unusable"
        raise PolicyLoadError(path, f"is not a readable VecNormalize pickle ({first_line(exc)})") from None
    if not isinstance(wrapper, VecNormalizeStandIn) or not isinstance(wrapper.state, dict):
        raise PolicyLoadError(path, f"holds a {_kind(wrapper)}, not a pickled VecNormalize")
    state = wrapper.state
    norm_obs = _decode(path, "VecNormalize norm_obs", state.get("norm_obs"))
    if not isinstance(norm_obs, (bool, np.bool_)):
        raise PolicyLoadError(path, f"VecNormalize norm_obs is a {_kind(norm_obs)}, expected a bool")
    epsilon = _number(path, state, "epsilon", minimum=0.0)
    clip_obs = _number(path, state, "clip_obs", minimum=math.ulp(0.0))
    if not norm_obs:
        return VecNormalizeStats(path, content, False, epsilon, clip_obs, None)
    obs_rms = state.get("obs_rms")
    if isinstance(obs_rms, dict):  # a Dict observation space: statistics per normalized key
        if not all(isinstance(key, str) for key in obs_rms):
            raise PolicyLoadError(path, "VecNormalize obs_rms has keys that are not strings")
        per_key = {key: _moments(path, rms, f"obs_rms[{key!r}]") for key, rms in obs_rms.items()}
        return VecNormalizeStats(path, content, True, epsilon, clip_obs, per_key)
    return VecNormalizeStats(path, content, True, epsilon, clip_obs, _moments(path, obs_rms, "obs_rms"))


def _moments(path: Path, rms: Any, what: str) -> Moments:
    if not isinstance(rms, RunningMeanStdStandIn) or not isinstance(rms.state, dict):
        raise PolicyLoadError(path, f"VecNormalize {what} is a {_kind(rms)}, expected a RunningMeanStd")
    mean, var = (_float_array(path, rms.state, field, what) for field in ("mean", "var"))
    if mean.shape != var.shape:
        raise PolicyLoadError(path, f"{what} mean has shape {mean.shape} but var has {var.shape}")
    if np.any(var < 0):
        raise PolicyLoadError(path, f"{what} var has negative values")
    return Moments(mean, var)


def _kind(value: Any) -> str:
    """What a value from the file is, for a message: its stand-in's pickled name or its type."""
    return type(value).__name__.removesuffix("StandIn").removesuffix("Record")


def _number(path: Path, state: dict[str, Any], field: str, minimum: float) -> float:
    value = _decode(path, f"VecNormalize {field}", state.get(field))
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise PolicyLoadError(path, f"VecNormalize {field} is a {_kind(value)}, expected a number")
    if not value >= minimum:  # also refuses NaN
        raise PolicyLoadError(path, f"VecNormalize {field} is {float(value):g}, expected at least {minimum:g}")
    return float(value)


def _float_array(path: Path, state: dict[str, Any], field: str, what: str) -> np.ndarray:
    value = _decode(path, f"{what} {field}", state.get(field))
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        shown = f"{value.dtype} array" if isinstance(value, np.ndarray) else _kind(value)
        raise PolicyLoadError(path, f"{what} {field} is a {shown}, expected a float array")
    if not np.all(np.isfinite(value)):
        raise PolicyLoadError(path, f"{what} {field} has non-finite values")
    return value.astype(np.float64)


def _decode(path: Path, what: str, value: Any) -> Any:
    """A numpy array or scalar rebuilt from its record (plain values pass through); the record
    must hold a plain numeric dtype and exactly the bytes its shape needs."""
    if not isinstance(value, (ArrayRecord, BufferRecord, ScalarRecord)):
        return value
    try:
        if isinstance(value, ScalarRecord):
            dtype_record, data = value.args
            return _from_bytes(data, _dtype(dtype_record), ())[()]
        if isinstance(value, BufferRecord):
            data, dtype_record, shape, order = value.args
            return _from_bytes(data, _dtype(dtype_record), shape, order)
        version, shape, dtype_record, fortran, data = value.state
        if version != 1:
            raise ValueError(f"array state version {version}")
        return _from_bytes(data, _dtype(dtype_record), shape, "F" if fortran else "C")
    except (ValueError, TypeError) as exc:
        raise PolicyLoadError(path, f"{what} is not a plain numeric numpy value ({first_line(exc)})") from None


def _dtype(record: Any) -> np.dtype:
    if not isinstance(record, DtypeRecord) or not record.args or not isinstance(record.args[0], str):
        raise ValueError("no dtype")
    dtype = np.dtype(record.args[0][:16])
    if dtype.kind not in NUMERIC_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"dtype {dtype}")
    state = record.state
    if not isinstance(state, tuple) or len(state) < 2 or any(part is not None for part in state[2:5]):
        raise ValueError(f"dtype {dtype} with fields, a subarray or an unknown state")
    return dtype.newbyteorder(state[1]) if state[1] in ("<", ">") else dtype


def _from_bytes(data: Any, dtype: np.dtype, shape: Any, order: str = "C") -> np.ndarray:
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"data is a {type(data).__name__}, not bytes")
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError("shape is not a tuple of sizes")
    if len(data) != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{len(data)} bytes for shape {shape} of {dtype}")
    array = np.frombuffer(bytes(data), dtype).reshape(shape, order="F" if order == "F" else "C")
    return array.astype(dtype.newbyteorder("="))  # native byte order, and a copy of its own


class VecNormalizeObs(ObservationNormalizer):
    """SB3's VecNormalize: clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs).

    Not ML-Agents' form: `var` is a variance (not a sum over steps), epsilon sits inside the
    root, and the clip is the file's (10 by default, not 5). SB3 computes this in float64 numpy
    and hands the policy its float32 cast; here the statistics are float32 buffers, as the
    ObservationNormalizer rule wants on a card, and float64 in the golden. It sees the policy's
    float inputs flattened and concatenated; the values of a Dict's keys that VecNormalize does
    not normalize (outside norm_obs_keys) pass through as they are (`passthrough`).
    """

    running_mean: torch.Tensor
    running_var: torch.Tensor
    passthrough: torch.Tensor | None

    def __init__(
        self, mean: np.ndarray, var: np.ndarray, epsilon: float, clip_obs: float, passthrough: np.ndarray | None = None
    ) -> None:
        super().__init__()
        # The policy takes the observation flattened; normalization is elementwise, so flatten too.
        self.register_buffer("running_mean", torch.from_numpy(np.ascontiguousarray(mean).reshape(-1)).float())
        self.register_buffer("running_var", torch.from_numpy(np.ascontiguousarray(var).reshape(-1)).float())
        if passthrough is not None:
            self.register_buffer("passthrough", torch.from_numpy(np.ascontiguousarray(passthrough, dtype=bool).reshape(-1)))
        else:
            self.passthrough = None
        self.epsilon = epsilon
        self.clip = clip_obs

    def mean(self) -> torch.Tensor:
        return self.running_mean

    def std(self) -> torch.Tensor:
        return torch.sqrt(self.running_var + self.epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normalized = super().forward(x)
        return normalized if self.passthrough is None else torch.where(self.passthrough, x, normalized)
