"""The zip of an SB3 save and the readable fields of its `data`, never unpickled.

An SB3 save is a zip of `data` (JSON; objects that JSON cannot hold are cloudpickled into
`:serialized:` base64, with their readable fields written beside them), `policy.pth` (a torch
state dict) and provenance members. A user-supplied zip may carry a pickle that runs code when
loaded, so nothing here unpickles: readable fields are read as JSON, class names are found in
the pickled bytes with a regex, and `policy.pth` is read with `weights_only=True`.
"""

from __future__ import annotations

import ast
import base64
import binascii
import io
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.errors import PolicyLoadError, first_line
from harness.files import json_value, read_whole
from harness.policies.loader import check_zip_directory

# The largest member we will inflate; real policies are kilobytes to a few megabytes.
MAX_MEMBER_BYTES = 64 * 1024 * 1024
# The zip is read once, into memory, so that the bytes hashed are the bytes parsed. Beside the
# members we read it may hold the optimizer's state (twice the weights) and provenance.
MAX_ZIP_BYTES = 4 * MAX_MEMBER_BYTES
# Deflate rarely beats 20:1 on JSON or weights; a zip bomb runs at about 1000:1.
MAX_RATIO = 100
RATIO_CHECK_ABOVE = 1024 * 1024

# The activations a policy may name: torch.nn's elementwise ones, as SB3 builds them (the class,
# called without arguments, so each with its defaults). Others are refused by name: PReLU holds
# weights, GLU halves its input, Softmax and its kin mix the features, Threshold needs arguments.
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
        nn.RReLU,
        nn.Hardswish,
        nn.Hardsigmoid,
        nn.Hardtanh,
        nn.Hardshrink,
        nn.Softshrink,
        nn.Softsign,
        nn.Tanhshrink,
        nn.LogSigmoid,
        nn.Identity,
    )
}

# A torch.nn class as a readable field writes it, and nothing else: a functools.partial of one
# ("functools.partial(<class '...LeakyReLU'>, negative_slope=0.2)") is another activation.
TORCH_NN_CLASS = re.compile(r"<class 'torch\.nn\.modules\.[a-z_]+\.([A-Za-z0-9_]+)'>")
# The class right after the key `activation_fn` in a pickle, by reference: protocol <= 3 GLOBAL
# ("ctorch.nn.modules.x\nName\n"), protocol 4+ SHORT_BINUNICODE strings then STACK_GLOBAL
# ("\x8c.torch.nn.modules.x\x94\x8c.Name\x94\x93"). Anything between the key and the class (a
# partial, a memo reference to a module named before) is not read.
PICKLED_ACTIVATION = re.compile(
    rb"activation_fn(?:\x94|q.)(?:ctorch\.nn\.modules\.[a-z_]+\n([A-Za-z0-9_]+)\n"
    rb"|\x8c.torch\.nn\.modules\.[a-z_]+\x94\x8c.([A-Za-z0-9_]+)\x94\x93)",
    re.DOTALL,
)
# A class pickled by reference, its module then its name, in either protocol's form.
PICKLED_CLASS = rb"%s(?:\n|\x94?\x8c.)([A-Za-z_][A-Za-z0-9_]*)"
# A readable method's repr names its class: "<function DQNPolicy.__init__ at 0x7f...>".
METHOD_OF = re.compile(r"<function ([A-Za-z_][A-Za-z0-9_]*)\.")


@dataclass(frozen=True)
class Archive:
    content: bytes  # the whole zip
    data: str
    policy_pth: bytes
    version: str


@dataclass(frozen=True)
class PolicyClass:
    """The class the save names for its policy: `name` in `module`."""

    module: str
    name: str

    def describe(self) -> str:
        return f"{self.name} ({self.module})"


def shown(value: Any, limit: int = 100) -> str:
    """A value from the file, made safe for a one-line error message."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_archive(path: Path) -> Archive:
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


def parse_data(path: Path, text: str) -> dict[str, Any]:
    try:
        data = json_value(text)
    except json.JSONDecodeError as exc:
        raise PolicyLoadError(path, f"data is not JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:
        raise PolicyLoadError(path, f"data: {exc}") from None
    if not isinstance(data, dict):
        raise PolicyLoadError(path, "data is JSON but not an object")
    return data


def policy_kwargs(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    kwargs = data.get("policy_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise PolicyLoadError(path, f"data: policy_kwargs is {type(kwargs).__name__}, expected an object")
    return kwargs


def trained_steps(data: dict[str, Any]) -> int | None:
    """The steps the save was trained for as it was asked (`learn(total_timesteps)`, which SB3
    saves as `_total_timesteps`); None where the data does not say."""
    steps = data.get("_total_timesteps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def pickled_bytes(path: Path, field: dict[str, Any]) -> bytes:
    """The `:serialized:` payload as bytes, to search, never to unpickle."""
    encoded = field.get(":serialized:")
    if not isinstance(encoded, str):
        return b""
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise PolicyLoadError(path, "data holds a :serialized: field that is not base64") from None


def policy_class(path: Path, data: dict[str, Any]) -> PolicyClass:
    """The policy class, read from `data`'s readable `__module__` and the class name its pickle
    holds by reference (else the name its readable methods carry)."""
    field = data.get("policy_class")
    module = field.get("__module__") if isinstance(field, dict) else None
    if not isinstance(field, dict) or not isinstance(module, str) or not module:
        raise PolicyLoadError(path, "data names no readable policy class (policy_class.__module__)")
    found = re.search(PICKLED_CLASS % re.escape(module.encode()), pickled_bytes(path, field), re.DOTALL)
    if found:
        return PolicyClass(module, found.group(1).decode())
    methods = (METHOD_OF.match(v) for v in field.values() if isinstance(v, str))
    named = next((m.group(1) for m in methods if m), None)
    if named is None:
        raise PolicyLoadError(path, f"data's policy class in {shown(module)} has no readable name")
    return PolicyClass(module, named)


def load_state_dict(path: Path, raw: bytes) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for bad or unsafe files; all mean "unusable"
        raise PolicyLoadError(path, f"policy.pth is not a plain torch state dict ({first_line(exc)})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PolicyLoadError(path, "policy.pth is not a state dict of tensors")
    return state


def readable(path: Path, kwargs: dict[str, Any], name: str) -> Any:
    """policy_kwargs[name] where data holds it readably; None where absent. Present only inside
    the pickle is refused: this loader never runs it, and guessing a default would be wrong."""
    if name in kwargs:
        return kwargs[name]
    if _pickled_string(name).search(pickled_bytes(path, kwargs)):
        raise PolicyLoadError(path, f"data holds {name} only inside a pickle, which this loader never runs")
    return None


def _pickled_string(text: str) -> re.Pattern[bytes]:
    """`text` as a pickle writes a string, its length before it (SHORT_BINUNICODE, BINUNICODE,
    SHORT_BINSTRING), so that one key is not found inside a longer one (batch_norm in batch_norm_eps)."""
    raw = text.encode()
    size = len(raw)
    forms = (b"\x8c" + bytes([size]), b"X" + size.to_bytes(4, "little"), b"U" + bytes([size]))
    return re.compile(b"(?:" + b"|".join(re.escape(form) for form in forms) + b")" + re.escape(raw), re.DOTALL)


def flag(path: Path, kwargs: dict[str, Any], name: str, default: bool) -> bool:
    value = readable(path, kwargs, name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise PolicyLoadError(path, f"data: policy_kwargs {name} is {shown(value)}, expected true or false")
    return value


def number(path: Path, kwargs: dict[str, Any], name: str, default: float) -> float:
    value = readable(path, kwargs, name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyLoadError(path, f"data: policy_kwargs {name} is {shown(value)}, expected a number")
    return float(value)


def net_arch(path: Path, kwargs: dict[str, Any]) -> Any:
    """policy_kwargs' net_arch as written (a list, a dict, or the str SB3 wrote for one that
    JSON could not hold, parsed as a literal); None where absent."""
    value = readable(path, kwargs, "net_arch")
    if isinstance(value, str):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError, RecursionError):
            raise PolicyLoadError(path, f"cannot read net_arch {shown(value)}") from None
    return value


def layer_sizes(path: Path, layers: Any) -> list[int]:
    if not isinstance(layers, (list, tuple)) or not all(isinstance(n, int) and n > 0 for n in layers):
        raise PolicyLoadError(path, f"net_arch layer sizes {shown(layers)} are not positive integers")
    return list(layers)


def activation(path: Path, kwargs: dict[str, Any], default: str) -> str:
    """The activation's torch.nn class name, from the readable field or the pickled bytes; the
    family's default where the save names none."""
    known = ", ".join(ACTIVATIONS)
    readable_fn = kwargs.get("activation_fn")
    if readable_fn is not None:
        found = TORCH_NN_CLASS.fullmatch(str(readable_fn).strip())
        if found is None:
            raise PolicyLoadError(path, f"unknown activation {shown(readable_fn)}: not a torch.nn class; known: {known}")
        name = found.group(1)
    else:
        blob = pickled_bytes(path, kwargs)
        if b"activation_fn" not in blob:
            return default
        pickled = PICKLED_ACTIVATION.search(blob)
        if pickled is None:
            raise PolicyLoadError(path, f"data's activation_fn is pickled in a form this loader cannot read; known: {known}")
        name = (pickled.group(1) or pickled.group(2)).decode()
    if name not in ACTIVATIONS:
        raise PolicyLoadError(path, f"unknown activation {name}; known: {known}")
    return name


def extractor_class(path: Path, kwargs: dict[str, Any]) -> str | None:
    """The features extractor class policy_kwargs names, as "module.Name"; None where it names none."""
    value = readable(path, kwargs, "features_extractor_class")
    if value is None:
        return None
    found = re.fullmatch(r"<class '([A-Za-z0-9_.]+)'>", str(value).strip())
    return found.group(1) if found else shown(value)
