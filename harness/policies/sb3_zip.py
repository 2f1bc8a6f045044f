"""Stable-Baselines3 zip (any 1.x or 2.x save) -> `PolicyNet`, without unpickling anything.

An SB3 save is a zip of `data` (JSON; objects that JSON cannot hold are cloudpickled into
`:serialized:` base64, with their readable fields written beside them), `policy.pth` (a torch
state dict) and provenance members. A user-supplied zip may carry a pickle that runs code when
loaded, so this loader never unpickles: it reads the readable JSON fields, finds class names in
the pickled bytes with a regex, and reads `policy.pth` with `weights_only=True`.

Supported: actor-critic MLP policies (PPO, A2C: `ActorCriticPolicy`) with a Box observation and
a Discrete or Box action. The actor path is features (flatten) -> shared layers (SB3 1.x) ->
policy layers -> `action_net`; it becomes `body` (built by `mlp()`) and `head`.

The files beside the zip (`policy_files`) say what the zip does not: the environment (the RL
Zoo's args.yml, a Hugging Face model card) and the VecNormalize statistics the policy was
trained behind, which become its `normalizer` (`vecnormalize`).
"""

from __future__ import annotations

import ast
import base64
import binascii
import io
import json
import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.errors import PolicyLoadError, first_line
from harness.files import read_whole, sha256_of
from harness.policies.base import ActionKind, ObsInput, PolicyInfo, PolicyNet, mlp
from harness.policies.loader import Peek, PolicyFormat, PolicySpec, check_zip_directory
from harness.policies.policy_files import PLAIN, find_env, find_vecnormalize
from harness.policies.vecnormalize import VecNormalizeObs, VecNormalizeStats, read_vecnormalize

# The largest member we will inflate; real policies are kilobytes to a few megabytes.
MAX_MEMBER_BYTES = 64 * 1024 * 1024
# The zip is read once, into memory, so that the bytes hashed are the bytes parsed. Beside the
# members we read it may hold the optimizer's state (twice the weights) and provenance.
MAX_ZIP_BYTES = 4 * MAX_MEMBER_BYTES
# Deflate rarely beats 20:1 on JSON or weights; a zip bomb runs at about 1000:1.
MAX_RATIO = 100
RATIO_CHECK_ABOVE = 1024 * 1024

ACTIVATIONS: dict[str, type[nn.Module]] = {
    cls.__name__: cls
    for cls in (
        nn.Tanh,
        nn.ReLU,
        nn.ELU,
        nn.LeakyReLU,
        nn.SiLU,
        nn.GELU,
        nn.Sigmoid,
        nn.Softplus,
        nn.Mish,
        nn.SELU,
        nn.CELU,
        nn.ReLU6,
        nn.Hardswish,
        nn.Hardtanh,
        nn.Identity,
    )
}
# SB3's ActorCriticPolicy defaults (1.x and 2.x alike) when policy_kwargs leave them out.
DEFAULT_ACTIVATION = "Tanh"
DEFAULT_PI = [64, 64]

# A torch.nn class, as written in a readable field ("<class 'torch.nn.modules.activation.ReLU'>")
# or inside a pickle: protocol <= 3 GLOBAL ("module\nName"), protocol 4+ SHORT_BINUNICODE
# strings joined by MEMOIZE ("module\x94\x8c<len>Name").
TORCH_NN_CLASS = re.compile(rb"torch\.nn\.modules\.[a-z_]+(?:\.|\n|\x94\x8c.)([A-Za-z0-9_]+)", re.DOTALL)
POLICY_CLASS = re.compile(rb"([A-Za-z0-9_]*Policy)\b")

# State-dict prefixes of the actor path, and of the critic (which we ignore).
SHARED = "mlp_extractor.shared_net."
PI = "mlp_extractor.policy_net."
CRITIC = ("mlp_extractor.value_net.", "value_net.", "vf_features_extractor.")


@dataclass(frozen=True)
class Arch:
    """Hidden layer sizes of the actor path as the JSON declares them."""

    shared: list[int]  # SB3 1.x layers shared by actor and critic
    pi: list[int]

    @property
    def hidden(self) -> list[int]:
        return self.shared + self.pi

    def describe(self) -> str:
        return (f"shared {self.shared}, " if self.shared else "") + f"pi {self.pi}"


@dataclass(frozen=True)
class Archive:
    content: bytes  # the whole zip
    data: str
    policy_pth: bytes
    version: str


class Sb3Zip(PolicyFormat):
    name = "sb3-zip"
    suffixes = (".zip",)
    what = "a zip with data and policy.pth (a Stable-Baselines3 save)"

    @classmethod
    def claims(cls, peek: Peek) -> bool:
        return peek.zip_members is not None and {"data", "policy.pth"} <= peek.zip_members

    @classmethod
    def load(cls, path: Path, spec: PolicySpec) -> PolicyNet:
        return load_sb3_zip(path, env_files=not spec.env_overrides)


def load_sb3_zip(path: Path, name: str | None = None, env_files: bool = True) -> PolicyNet:
    """Rebuild the actor of an SB3 save as a float32 `PolicyNet`; PolicyLoadError if unusable.
    `env_files=False`: the caller knows the environment, and the files beside the zip are not
    read for one (the VecNormalize statistics still are: they are part of the policy)."""
    path = Path(path)
    archive = _read_archive(path)
    data = _parse_data(path, archive.data)
    kwargs = data.get("policy_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise PolicyLoadError(path, f"data: policy_kwargs is {type(kwargs).__name__}, expected an object")
    _check_policy_class(path, data, kwargs)
    state = _load_state_dict(path, archive.policy_pth)
    activation = _activation(path, kwargs)
    obs_size, obs_low, obs_high = _observation(path, data.get("observation_space"))
    action_kind, action_size = _action(path, data.get("action_space"))
    arch = _arch(path, kwargs, has_shared=any(k.startswith(SHARED) for k in state))

    sizes = [obs_size, *arch.hidden, action_size]
    layers = _actor_layers(path, state, sizes, arch)
    body = mlp(sizes[:-1], ACTIVATIONS[activation])
    head = nn.Linear(sizes[-2], sizes[-1])
    for target, layer in zip([*(m for m in body if isinstance(m, nn.Linear)), head], layers, strict=True):
        _load_linear(target, state, layer)
    log_sigma = _log_sigma(path, state, action_kind, action_size)
    env = find_env(path) if env_files else None
    stats_path = find_vecnormalize(path)
    stats = read_vecnormalize(stats_path) if stats_path is not None else None
    normalizer = _normalizer(path, stats, obs_size)
    # Other statistics make another policy, so the identity covers the statistics applied: the
    # zip's bytes, then theirs (`cat` the two files into sha256sum to check it).
    applied = stats.content if stats is not None and normalizer is not None else b""
    info = PolicyInfo(
        name=name if name is not None else str(path),
        source="sb3-zip",
        action_kind=action_kind,
        inputs=(ObsInput("obs", (obs_size,), low=obs_low, high=obs_high),),
        action_size=action_size,
        sha256=sha256_of(archive.content, applied),
        env_id=env.env_id if env is not None else None,
        env_source=env.source if env is not None else "",
        detail=f"SB3 {archive.version}, {activation}, {arch.describe()}{_stats_detail(stats)}",
        obs_normalization=_obs_normalization(path, stats),
        env_setup=env.setup if env is not None else PLAIN,
        published=env.published if env is not None else None,
    )
    return PolicyNet(info, body, head, normalizer=normalizer, log_sigma=log_sigma, action_clip=None)


def _normalizer(path: Path, stats: VecNormalizeStats | None, obs_size: int) -> VecNormalizeObs | None:
    """SB3's normalization where the statistics say norm_obs, after checking they fit the policy."""
    if stats is None or stats.mean is None or stats.var is None:
        return None
    if stats.mean.size != obs_size:
        problem = f"normalizes {stats.mean.size} observation values, but {path.name} takes {obs_size}"
        raise PolicyLoadError(stats.path, problem)
    return VecNormalizeObs(stats.mean, stats.var, stats.epsilon, stats.clip_obs)


def _obs_normalization(path: Path, stats: VecNormalizeStats | None) -> str:
    if stats is None:
        return ""
    where = stats.path.relative_to(path.parent)
    if not stats.norm_obs:
        return f"none: VecNormalize in {where} has norm_obs False, so observations go in as they are"
    return f"VecNormalize from {where}: {stats.describe()}"


def _stats_detail(stats: VecNormalizeStats | None) -> str:
    if stats is None:
        return ""
    return f", VecNormalize {stats.describe()}" if stats.norm_obs else ", VecNormalize without norm_obs (not applied)"


def _shown(value: Any, limit: int = 100) -> str:
    """A value from the file, made safe for a one-line error message."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_archive(path: Path) -> Archive:
    content = read_whole(path, MAX_ZIP_BYTES, "a policy zip", PolicyLoadError)
    check_zip_directory(path, io.BytesIO(content))
    try:
        zf = zipfile.ZipFile(io.BytesIO(content))
    except zipfile.BadZipFile:
        raise PolicyLoadError(path, "not a zip file (expected a Stable-Baselines3 save)") from None
    with zf:
        names = set(zf.namelist())
        missing = [m for m in ("data", "policy.pth") if m not in names]
        if missing:
            raise PolicyLoadError(path, f"zip has no {' or '.join(missing)}: not a Stable-Baselines3 save")
        data = _read_member(path, zf, "data")
        policy_pth = _read_member(path, zf, "policy.pth")
        version = _sb3_version(path, zf, names)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyLoadError(path, "data is not UTF-8 JSON text") from None
    return Archive(content, text, policy_pth, version)


def _read_member(path: Path, zf: zipfile.ZipFile, member: str) -> bytes:
    """Inflate one member, refusing oversized or bomb-like ones before and while reading."""
    info = zf.getinfo(member)
    if info.file_size > MAX_MEMBER_BYTES:
        limit = f"over the {MAX_MEMBER_BYTES} limit"
        raise PolicyLoadError(path, f"{member} is {info.file_size} bytes uncompressed, {limit}")
    ratio = info.file_size / max(info.compress_size, 1)
    if info.file_size > RATIO_CHECK_ABOVE and ratio > MAX_RATIO:
        raise PolicyLoadError(path, f"{member} inflates {ratio:.0f}:1, which looks like a zip bomb")
    try:
        with zf.open(info) as f:
            # The header sizes are the file's word; read one byte past the limit to catch a lie.
            content = f.read(MAX_MEMBER_BYTES + 1)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as exc:
        raise PolicyLoadError(path, f"cannot read {member}: {exc}") from None
    if len(content) > MAX_MEMBER_BYTES:
        raise PolicyLoadError(path, f"{member} inflates past the {MAX_MEMBER_BYTES} byte limit")
    return content


def _sb3_version(path: Path, zf: zipfile.ZipFile, names: set[str]) -> str:
    if "_stable_baselines3_version" in names:
        text = _read_member(path, zf, "_stable_baselines3_version").decode("utf-8", "replace").strip()
        if text:
            return text
    if "system_info.txt" in names:
        text = _read_member(path, zf, "system_info.txt").decode("utf-8", "replace")
        found = re.search(r"Stable-Baselines3:\s*(\S+)", text)
        if found:
            return found.group(1)
    return "version unknown"


def _parse_data(path: Path, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyLoadError(path, f"data is not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise PolicyLoadError(path, "data is JSON nested too deeply to read") from None
    if not isinstance(data, dict):
        raise PolicyLoadError(path, "data is JSON but not an object")
    return data


def _pickled_bytes(path: Path, field: dict[str, Any]) -> bytes:
    """The `:serialized:` payload as bytes, to search, never to unpickle."""
    encoded = field.get(":serialized:")
    if not isinstance(encoded, str):
        return b""
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise PolicyLoadError(path, "data holds a :serialized: field that is not base64") from None


def _check_policy_class(path: Path, data: dict[str, Any], kwargs: dict[str, Any]) -> None:
    policy_class = data.get("policy_class")
    blob = _pickled_bytes(path, policy_class) if isinstance(policy_class, dict) else b""
    found = POLICY_CLASS.search(blob)
    name = found.group(1).decode() if found else None
    if name is not None and name not in ("ActorCriticPolicy", "MlpPolicy"):
        raise PolicyLoadError(path, f"policy class {name} is not an MLP actor-critic policy (ActorCriticPolicy)")
    extractor = kwargs.get("features_extractor_class")
    if extractor is not None and "FlattenExtractor" not in str(extractor):
        raise PolicyLoadError(path, f"features extractor {_shown(extractor)} is not an MLP policy's FlattenExtractor")


def _load_state_dict(path: Path, raw: bytes) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for bad or unsafe files; all mean "unusable"
        raise PolicyLoadError(path, f"policy.pth is not a plain torch state dict ({first_line(exc)})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PolicyLoadError(path, "policy.pth is not a state dict of tensors")
    if "action_net.weight" not in state:
        raise PolicyLoadError(path, "policy.pth has no action_net: not an actor-critic policy (PPO, A2C)")
    known = (SHARED, PI, "action_net.", *CRITIC)
    other = sorted(k for k in state if k != "log_std" and not k.startswith(known))
    if other:
        raise PolicyLoadError(path, f"not an MLP policy: policy.pth has {other[0]} ({len(other)} such parameters)")
    return state


def _activation(path: Path, kwargs: dict[str, Any]) -> str:
    readable = kwargs.get("activation_fn")
    if readable is not None:
        text = str(readable).encode()
    else:
        blob = _pickled_bytes(path, kwargs)
        at = blob.find(b"activation_fn")
        if at < 0:
            return DEFAULT_ACTIVATION
        text = blob[at:]
    found = TORCH_NN_CLASS.search(text)
    if found is None:
        shown = _shown(readable) if readable is not None else "a pickled class"
        known = ", ".join(ACTIVATIONS)
        raise PolicyLoadError(path, f"unknown activation {shown}: not a torch.nn class; known: {known}")
    name = found.group(1).decode()
    if name not in ACTIVATIONS:
        raise PolicyLoadError(path, f"unknown activation {name}; known: {', '.join(ACTIVATIONS)}")
    return name


def _arch(path: Path, kwargs: dict[str, Any], has_shared: bool) -> Arch:
    """Parse net_arch: 2.x dict(pi=, vf=); 1.x [shared ints..., dict(pi=, vf=)]; or a list of ints.

    A plain list of ints means shared layers in SB3 1.x and actor layers in 2.x; the network is
    the same, only the state-dict names differ, so `has_shared` (from policy.pth) picks the name.
    """
    if "net_arch" in kwargs:
        net_arch = kwargs["net_arch"]
    elif b"net_arch" in _pickled_bytes(path, kwargs):
        raise PolicyLoadError(path, "data holds net_arch only inside a pickle, which this loader never runs")
    else:
        return Arch(shared=[], pi=list(DEFAULT_PI))
    if isinstance(net_arch, str):  # not JSON-serializable when saved: SB3 wrote str(net_arch)
        try:
            net_arch = ast.literal_eval(net_arch)
        except (ValueError, SyntaxError, RecursionError):
            raise PolicyLoadError(path, f"cannot read net_arch {_shown(net_arch)}") from None
    if isinstance(net_arch, dict):
        return Arch(shared=[], pi=_sizes(path, net_arch.get("pi", [])))
    if not isinstance(net_arch, (list, tuple)):
        raise PolicyLoadError(path, f"cannot read net_arch {_shown(net_arch)}")
    ints = [layer for layer in net_arch if not isinstance(layer, dict)]
    dicts = [layer for layer in net_arch if isinstance(layer, dict)]
    if len(dicts) > 1 or (dicts and net_arch[-1] is not dicts[0]):
        raise PolicyLoadError(path, f"cannot read net_arch {_shown(net_arch)}: at most one dict, and it must come last")
    pi = _sizes(path, dicts[0].get("pi", [])) if dicts else []
    if dicts or has_shared:
        return Arch(shared=_sizes(path, ints), pi=pi)
    return Arch(shared=[], pi=_sizes(path, ints))


def _sizes(path: Path, layers: Any) -> list[int]:
    if not isinstance(layers, (list, tuple)) or not all(isinstance(n, int) and n > 0 for n in layers):
        raise PolicyLoadError(path, f"net_arch layer sizes {_shown(layers)} are not positive integers")
    return list(layers)


def _shape(space: dict[str, Any]) -> list[int] | None:
    shape = space.get("_shape", space.get("shape"))  # 2.x writes _shape, 1.x shape
    if isinstance(shape, list) and all(isinstance(n, int) for n in shape):
        return shape
    return None


def _observation(path: Path, space: Any) -> tuple[int, tuple[float, ...] | None, tuple[float, ...] | None]:
    if not isinstance(space, dict) or "Box" not in str(space.get(":type:", "")):
        kind = space.get(":type:") if isinstance(space, dict) else space
        raise PolicyLoadError(path, f"observation space {_shown(kind)} is not supported (only Box)")
    shape = _shape(space)
    if shape is None:
        raise PolicyLoadError(path, "observation space has no readable shape in data")
    size = math.prod(shape)
    return size, _bounds(space.get("low"), size), _bounds(space.get("high"), size)


def _bounds(value: Any, size: int) -> tuple[float, ...] | None:
    """Parse numpy's repr ('[-4.8 -inf 0.4]') or a JSON list; None when summarized or absent."""
    if isinstance(value, list):
        tokens = [str(v) for v in value]
    elif isinstance(value, str) and "..." not in value:
        tokens = value.replace("[", " ").replace("]", " ").replace(",", " ").split()
    else:
        return None
    try:
        numbers = tuple(float(t) for t in tokens)
    except ValueError:
        return None
    return numbers if len(numbers) == size else None


def _action(path: Path, space: Any) -> tuple[ActionKind, int]:
    kind = str(space.get(":type:", "")) if isinstance(space, dict) else ""
    if re.search(r"\.Discrete'", kind):
        try:
            return "discrete", int(space["n"])
        except (KeyError, TypeError, ValueError):
            raise PolicyLoadError(path, "Discrete action space has no readable n in data") from None
    if re.search(r"\.Box'", kind):
        shape = _shape(space)
        if shape is None:
            raise PolicyLoadError(path, "Box action space has no readable shape in data")
        return "continuous", math.prod(shape)
    raise PolicyLoadError(path, f"action space {_shown(kind or space)} is not supported (only Discrete and Box)")


def _linear_keys(state: dict[str, torch.Tensor], prefix: str) -> list[str]:
    """`prefix<i>` of each Linear in a Sequential, in layer order (indices sort numerically)."""
    weights = [k for k in state if k.startswith(prefix) and k.endswith(".weight")]
    indices = sorted(int(k[len(prefix) :].split(".")[0]) for k in weights)
    return [f"{prefix}{i}" for i in indices]


def _actor_layers(path: Path, state: dict[str, torch.Tensor], sizes: list[int], arch: Arch) -> list[str]:
    """State-dict prefixes of the actor's Linear layers, each shape checked against `sizes`.

    Checked before any module is built, so sizes read from the JSON never allocate more than
    the (bounded) state dict already holds.
    """
    layers = _linear_keys(state, SHARED) + _linear_keys(state, PI) + ["action_net"]
    if len(layers) != len(sizes) - 1:
        raise PolicyLoadError(
            path,
            f"policy.pth has {len(layers) - 1} hidden layers on the actor path but data's net_arch "
            f"({arch.describe()}) declares {len(sizes) - 2}",
        )
    for layer, n_in, n_out in zip(layers, sizes[:-1], sizes[1:], strict=True):
        for key, expected in ((f"{layer}.weight", (n_out, n_in)), (f"{layer}.bias", (n_out,))):
            got = state.get(key)
            if got is None or tuple(got.shape) != expected:
                shown = "missing" if got is None else f"shape {tuple(got.shape)}"
                raise PolicyLoadError(
                    path,
                    f"policy.pth {key} is {shown}, but data ({arch.describe()}, its observation and "
                    f"action spaces) expects {expected}",
                )
    return layers


def _load_linear(target: nn.Linear, state: dict[str, torch.Tensor], layer: str) -> None:
    with torch.no_grad():
        target.weight.copy_(state[f"{layer}.weight"].float())
        target.bias.copy_(state[f"{layer}.bias"].float())


def _log_sigma(path: Path, state: dict[str, torch.Tensor], kind: ActionKind, size: int) -> torch.Tensor | None:
    if kind == "discrete":
        return None
    log_std = state.get("log_std")
    if log_std is None or log_std.shape != (size,):
        shown = "missing" if log_std is None else f"shape {tuple(log_std.shape)}"
        problem = f"policy.pth log_std is {shown}, expected ({size},) (gSDE policies are not supported)"
        raise PolicyLoadError(path, problem)
    return log_std.float()
