"""The observation and action spaces an SB3 save describes in `data`'s readable fields.

SB3 writes each space pickled, with its fields beside it as text: a Box's dtype, shape and
bounds (numpy's repr, summarized with "..." past a thousand values), a Dict's subspaces as the
repr of its dict (`{'key': Box(low, high, shape, dtype), ...}`, `OrderedDict([...])` in old
gym). Those fields are what is read here; the pickles never are.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import PolicyLoadError
from harness.policies.base import ActionKind
from harness.policies.sb3.archive import shown

# A Dict subspace in its repr: a quoted key, then ":" (a dict) or "," (OrderedDict's pairs), the class.
SUBSPACE = re.compile(r"""(['"])((?:(?!\1).)*)\1\s*[:,]\s*([A-Za-z]+)\(""")


@dataclass(frozen=True)
class BoxSpace:
    shape: tuple[int, ...]
    dtype: str  # numpy's name: "float32", "uint8", ...
    low: tuple[float, ...] | None  # flattened; None where the file summarizes or omits them
    high: tuple[float, ...] | None

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class DictSpace:
    spaces: tuple[tuple[str, BoxSpace], ...]  # in the space's own order, which the policy's extractors follow


@dataclass(frozen=True)
class ActionSpace:
    kind: ActionKind
    size: int  # discrete actions (all branches'), or continuous dimensions
    low: tuple[float, ...] | None  # Box only
    high: tuple[float, ...] | None
    branches: tuple[int, ...] = ()  # MultiDiscrete only: its nvec


def observation_space(path: Path, data: dict[str, Any]) -> BoxSpace | DictSpace:
    space = data.get("observation_space")
    kind = _type(space)
    if kind == "Box":
        assert isinstance(space, dict)
        return _box(path, space, "observation space")
    if kind == "Dict":
        assert isinstance(space, dict)
        return _dict(path, space)
    what = shown(space.get(":type:") if isinstance(space, dict) else space)
    raise PolicyLoadError(path, f"observation space {what} is not supported (a Box, or a Dict of Boxes)")


def action_space(path: Path, data: dict[str, Any]) -> ActionSpace:
    space = data.get("action_space")
    kind = _type(space)
    if kind == "Discrete":
        assert isinstance(space, dict)
        try:
            return ActionSpace("discrete", int(space["n"]), None, None)
        except (KeyError, TypeError, ValueError):
            raise PolicyLoadError(path, "Discrete action space has no readable n in data") from None
    if kind == "Box":
        assert isinstance(space, dict)
        box = _box(path, space, "Box action space")
        return ActionSpace("continuous", box.size, box.low, box.high)
    if kind == "MultiDiscrete":
        assert isinstance(space, dict)
        return _multi_discrete(path, space)
    what = shown(space.get(":type:") if isinstance(space, dict) and space.get(":type:") else space)
    raise PolicyLoadError(path, f"action space {what} is not supported (only Discrete, MultiDiscrete and Box)")


def _multi_discrete(path: Path, space: dict[str, Any]) -> ActionSpace:
    """A MultiDiscrete of one axis, two branches or more, each starting at 0: SB3's
    MultiCategoricalDistribution, whose action_net gives the branches' logits side by side."""
    shape = space.get("_shape", space.get("shape"))
    size = shape[0] if isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) else 0
    nvec, start = bounds(space.get("nvec"), size), bounds(space.get("start", "0"), size)
    if size < 2 or nvec is None or not all(n >= 1 and n == int(n) for n in nvec):
        raise PolicyLoadError(
            path, f"MultiDiscrete action space of shape {shown(shape)} is not read (one axis of two branches or more)"
        )
    if start is not None and any(start):
        raise PolicyLoadError(path, f"MultiDiscrete action space starts at {list(start)}, not at 0: not read")
    branches = tuple(int(n) for n in nvec)
    return ActionSpace("multi_discrete", sum(branches), None, None, branches)


def _type(space: Any) -> str | None:
    """The space's class name from its `:type:` ("<class 'gymnasium.spaces.box.Box'>")."""
    if not isinstance(space, dict):
        return None
    found = re.search(r"\.([A-Za-z]+)'>$", str(space.get(":type:", "")))
    return found.group(1) if found else None


def _box(path: Path, space: dict[str, Any], what: str) -> BoxSpace:
    shape = space.get("_shape", space.get("shape"))  # 2.x writes _shape, 1.x shape
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise PolicyLoadError(path, f"{what} has no readable shape in data")
    size = math.prod(shape)
    dtype = str(space.get("dtype", "float32"))
    return BoxSpace(tuple(shape), dtype, bounds(space.get("low"), size), bounds(space.get("high"), size))


def bounds(value: Any, size: int) -> tuple[float, ...] | None:
    """Parse numpy's repr ('[-4.8 -inf 0.4]'), a scalar repr (a Box of equal bounds), or a JSON
    list; None when summarized or absent."""
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
    if len(numbers) == 1 and size != 1:
        return numbers * size
    return numbers if len(numbers) == size else None


def _dict(path: Path, space: dict[str, Any]) -> DictSpace:
    text = space.get("spaces")
    if not isinstance(text, str):
        raise PolicyLoadError(path, "Dict observation space has no readable spaces in data")
    found: list[tuple[str, BoxSpace]] = []
    for match in SUBSPACE.finditer(text):
        key, kind = match.group(2), match.group(3)
        if kind != "Box":
            raise PolicyLoadError(path, f"Dict observation key {key!r} is a {kind}: only Box keys are supported")
        found.append((key, _box_repr(path, key, text, match.end())))
    if not found:
        raise PolicyLoadError(path, f"cannot read the Dict observation space's keys from {shown(text)}")
    return DictSpace(tuple(found))


def _box_repr(path: Path, key: str, text: str, start: int) -> BoxSpace:
    """A `Box(low, high, shape, dtype)` repr whose arguments begin at `start`."""
    args, depth, begin = [], 0, start
    for at in range(start, len(text)):
        char = text[at]
        if char in "([":
            depth += 1
        elif char in ")]" and depth:
            depth -= 1
        elif char == ")" or (char == "," and depth == 0):
            args.append(text[begin:at].strip())
            begin = at + 1
            if char == ")":
                break
    if len(args) != 4:
        raise PolicyLoadError(path, f"cannot read Dict observation key {key!r}'s Box from {shown(text)}")
    low, high, shape_text, dtype = args
    try:
        shape = ast.literal_eval(shape_text)
    except (ValueError, SyntaxError):
        shape = None
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise PolicyLoadError(path, f"Dict observation key {key!r} has no readable shape ({shown(shape_text)})")
    size = math.prod(shape)
    return BoxSpace(shape, dtype, bounds(low, size), bounds(high, size))
