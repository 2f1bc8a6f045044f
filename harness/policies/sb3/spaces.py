"""The observation and action spaces an SB3 save describes in `data`'s readable fields.

SB3 writes each space pickled, with its fields beside it as text: a Box's dtype, shape and
bounds (numpy's repr, summarized with "..." past a thousand values), a Discrete's `n` and
`start`, a MultiDiscrete's `nvec`, a MultiBinary's `n`, a Dict's subspaces as the repr of its
dict (`{'key': Box(low, high, shape, dtype), 'k': Discrete(3), ...}`, `OrderedDict([...])` in old
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

# The observation spaces of integers (SB3's preprocess_obs makes them floats), and what is read in all.
INTEGER_SPACES = ("Discrete", "MultiDiscrete", "MultiBinary")
SUPPORTED_OBSERVATIONS = "a Box, Discrete, MultiDiscrete or MultiBinary, or a Dict of those"
# SB3's preprocess_obs one-hot encodes a value v as class v, whatever the space's start.
ONE_HOT_FROM_0 = "SB3's preprocess_obs one-hot encodes from 0, ignoring start"
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
class IntegerSpace:
    """Discrete, MultiDiscrete or MultiBinary: integer values, which SB3's `preprocess_obs` makes
    floats for the network: each Discrete value one-hot over its classes (a MultiDiscrete's one
    per axis, side by side), MultiBinary's zeros and ones as they are."""

    kind: str  # "Discrete", "MultiDiscrete" or "MultiBinary"
    size: int  # values in one observation: 1, the axes, or the MultiBinary's (flattened)
    classes: tuple[int, ...]  # each value's classes, one-hot encoded; () for MultiBinary

    @property
    def width(self) -> int:
        """What the network takes of it: the one-hot widths, or the binary values."""
        return sum(self.classes) if self.classes else self.size

    def describe(self) -> str:
        if self.kind == "Discrete":
            return f"Discrete({self.classes[0]}) one-hot"
        if self.kind == "MultiDiscrete":
            return f"MultiDiscrete({list(self.classes)}) one-hot"
        return f"MultiBinary({self.size})"


@dataclass(frozen=True)
class DictSpace:
    spaces: tuple[tuple[str, BoxSpace | IntegerSpace], ...]  # in the space's own order, which the policy's extractors follow


ObservationSpace = BoxSpace | IntegerSpace | DictSpace


@dataclass(frozen=True)
class ActionSpace:
    kind: ActionKind
    size: int  # discrete actions (all branches'), or continuous dimensions
    low: tuple[float, ...] | None  # Box only
    high: tuple[float, ...] | None
    branches: tuple[int, ...] = ()  # MultiDiscrete only: its nvec


def observation_space(path: Path, data: dict[str, Any]) -> ObservationSpace:
    space = data.get("observation_space")
    kind = _type(space)
    if kind == "Box":
        assert isinstance(space, dict)
        return _box(path, space, "observation space")
    if kind == "Dict":
        assert isinstance(space, dict)
        return _dict(path, space)
    if kind in INTEGER_SPACES:
        assert isinstance(space, dict)
        return _integer_fields(path, kind, space)
    what = shown(space.get(":type:") if isinstance(space, dict) else space)
    raise PolicyLoadError(path, f"observation space {what} is not supported ({SUPPORTED_OBSERVATIONS})")


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
        return _multi_discrete_actions(path, space)
    what = shown(space.get(":type:") if isinstance(space, dict) and space.get(":type:") else space)
    raise PolicyLoadError(path, f"action space {what} is not supported (only Discrete, MultiDiscrete and Box)")


def _multi_discrete_actions(path: Path, space: dict[str, Any]) -> ActionSpace:
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


def _integer_fields(path: Path, kind: str, space: dict[str, Any]) -> IntegerSpace:
    """A Discrete, MultiDiscrete or MultiBinary from its fields in data (2.x writes `n` and
    `start` as text and `_shape`, 1.x numbers and `shape`)."""
    shape = space.get("_shape", space.get("shape"))
    if kind == "Discrete":
        return _discrete(path, "observation space", space.get("n"), space.get("start", "0"))
    if kind == "MultiDiscrete":
        return _multi_discrete(path, "observation space", space.get("nvec"), space.get("start", "0"), shape)
    return _multi_binary(path, "observation space", shape)


def _discrete(path: Path, what: str, n: Any, start: Any) -> IntegerSpace:
    try:
        classes, first = int(str(n)), int(str(start))
    except ValueError:
        raise PolicyLoadError(path, f"{what} Discrete has no readable n ({shown(n)}) and start ({shown(start)})") from None
    if classes < 1:
        raise PolicyLoadError(path, f"{what} Discrete({classes}) has no values")
    if first:
        problem = f"{what} Discrete({classes}, start={first}) is not read ({ONE_HOT_FROM_0})"
        raise PolicyLoadError(path, problem)
    return IntegerSpace("Discrete", 1, (classes,))


def _multi_discrete(path: Path, what: str, nvec: Any, start: Any, shape: Any) -> IntegerSpace:
    """One axis of values, each one-hot over its own classes (SB3 builds no policy for an nvec of more axes)."""
    size = shape[0] if isinstance(shape, list | tuple) and len(shape) == 1 and isinstance(shape[0], int) else 0
    classes, first = bounds(nvec, size), bounds(start, size)
    if size < 1 or classes is None or not all(n >= 1 and n == int(n) for n in classes):
        problem = f"{what} MultiDiscrete of shape {shown(shape)} and nvec {shown(nvec)} is not read (one axis)"
        raise PolicyLoadError(path, problem)
    if first is None or any(first):
        problem = f"{what} MultiDiscrete starts at {shown(start)}, not 0: not read ({ONE_HOT_FROM_0})"
        raise PolicyLoadError(path, problem)
    return IntegerSpace("MultiDiscrete", size, tuple(int(n) for n in classes))


def _multi_binary(path: Path, what: str, shape: Any) -> IntegerSpace:
    if not isinstance(shape, list | tuple) or not shape or not all(isinstance(n, int) and n >= 1 for n in shape):
        raise PolicyLoadError(path, f"{what} MultiBinary has no readable shape ({shown(shape)})")
    return IntegerSpace("MultiBinary", math.prod(shape), ())


def _dict(path: Path, space: dict[str, Any]) -> DictSpace:
    text = space.get("spaces")
    if not isinstance(text, str):
        raise PolicyLoadError(path, "Dict observation space has no readable spaces in data")
    found: list[tuple[str, BoxSpace | IntegerSpace]] = []
    for match in SUBSPACE.finditer(text):
        key, kind = match.group(2), match.group(3)
        if kind != "Box" and kind not in INTEGER_SPACES:
            raise PolicyLoadError(path, f"Dict observation key {key!r} is a {kind}: not supported ({SUPPORTED_OBSERVATIONS})")
        args = _call_args(text, match.end())
        found.append((key, _box_repr(path, key, text, args) if kind == "Box" else _integer_repr(path, key, kind, args)))
    if not found:
        raise PolicyLoadError(path, f"cannot read the Dict observation space's keys from {shown(text)}")
    return DictSpace(tuple(found))


def _call_args(text: str, start: int) -> list[str]:
    """The arguments of the call whose "(" ends just before `start`, each as written."""
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
    return args


def _box_repr(path: Path, key: str, text: str, args: list[str]) -> BoxSpace:
    """A `Box(low, high, shape, dtype)` repr's arguments."""
    if len(args) != 4:
        raise PolicyLoadError(path, f"cannot read Dict observation key {key!r}'s Box from {shown(text)}")
    low, high, shape_text, dtype = args
    shape = _literal(shape_text)
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise PolicyLoadError(path, f"Dict observation key {key!r} has no readable shape ({shown(shape_text)})")
    size = math.prod(shape)
    return BoxSpace(shape, dtype, bounds(low, size), bounds(high, size))


def _integer_repr(path: Path, key: str, kind: str, args: list[str]) -> IntegerSpace:
    """`Discrete(3)`, `Discrete(3, start=1)`, `MultiDiscrete([2 5])` (numpy's repr of nvec, then
    `start=[...]` where it is not 0), `MultiBinary(3)` or `MultiBinary((2, 3))`: their arguments."""
    what = f"Dict observation key {key!r}"
    first = args[0] if args else ""
    start = next((a.split("=", 1)[1] for a in args[1:] if a.replace(" ", "").startswith("start=")), "0")
    if kind == "Discrete":
        return _discrete(path, what, first, start)
    if kind == "MultiDiscrete":
        shape = [len(first.strip("[]").split())] if first.count("[") == 1 else None  # nvec of one axis only
        return _multi_discrete(path, what, first, start, shape)
    shape = _literal(first.replace(" ", ",") if first.startswith("[") else first)
    return _multi_binary(path, what, list(shape) if isinstance(shape, tuple | list) else [shape])


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
