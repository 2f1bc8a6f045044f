"""Declared options: a dataclass field that is at once a command-line flag, a TOML key and a
line of help (`option`, `Meta`), and what reads them: the flags of an argparse parser, a TOML file,
and the values they give, in the field's type. The options themselves, and what their values mean,
are declared in harness/config/options.py. Light on purpose: `harness --help` imports this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.files import read_text

# A config file is a few hundred bytes; read no more than this (and only from a regular file).
MAX_CONFIG_BYTES = 1024 * 1024

Choices = tuple[str, ...] | Callable[[], tuple[str, ...]]
"""The values an option takes: a tuple, or a function returning one where the names are read
when asked (the accelerators a registry holds then) or belong to a module too heavy for
`harness --help` to import."""


@dataclass(frozen=True)
class Meta:
    """What makes a config field an option: its flag, help, how it is parsed (`kind`, `type`)
    and what values it takes. The command line, the TOML file, `--help` and the checks of
    `validate` all read it, so a choice or a bound is written once.

    kind: "value" (one value of `type`), "csv" (a comma-separated list of `type`), "append" (a
    repeatable flag collecting a list), "off" / "on" (a switch that sets the field to False /
    True), "table" (a TOML table of strings, no flag). Bounds apply to each number of a list.
    """

    flag: str
    help: str
    kind: str = "value"
    type: type = str
    metavar: str | None = None
    choices: Choices | None = None
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    nonempty: bool = False
    parse: Callable[[Any], Any] | None = None
    """A value of a type of its own (`--episodes 24` or `auto`): turns the flag's text or the TOML
    value into the field's value; ValueError with what it takes. Bounds are its business."""

    def allowed(self) -> tuple[str, ...] | None:
        return self.choices() if callable(self.choices) else self.choices

    def shown_metavar(self) -> str | None:
        allowed = self.allowed()
        if self.metavar is not None or not allowed:
            return self.metavar
        return "{" + ",".join(allowed) + "}" + (",..." if self.kind == "csv" else "")

    def check(self, value: Any) -> None:
        """UsageError naming the flag, the value and what it may be, for a value outside the
        choices or the bounds; None (an unset optional value) is always fine."""
        if value is None:
            return
        if self.parse is not None:
            parsed(self, value)
            return
        values = value if isinstance(value, list) else [value]
        if self.nonempty and not values:
            raise UsageError(f"{self.flag}: give at least one value")
        allowed = self.allowed()
        for v in values:
            if allowed is not None and v not in allowed:
                raise UsageError(f"{self.flag} {v!r} is not one of {', '.join(allowed)}")
            # A bound alone lets inf through (and nan past `at_least`); no option means either.
            if isinstance(v, float) and not math.isfinite(v):
                raise UsageError(f"{self.flag} {v}: must be a finite number{self._range()}")
            if self.at_least is not None and v < self.at_least:
                raise UsageError(f"{self.flag} {v}: must be at least {self.at_least}{self._range()}")
            if self.above is not None and not v > self.above:
                raise UsageError(f"{self.flag} {v}: must be more than {self.above}{self._range()}")
            if self.at_most is not None and v > self.at_most:
                raise UsageError(f"{self.flag} {v}: must be at most {self.at_most}{self._range()}")

    def range_text(self) -> str:
        """`LOW to HIGH` for a number bounded on both sides, else an empty string."""
        low = self.at_least if self.at_least is not None else self.above
        return f"{low} to {self.at_most}" if low is not None and self.at_most is not None else ""

    def _range(self) -> str:
        return f" (from {self.range_text()})" if self.range_text() else ""


def option(flag: str, help: str, default: Any, kind: str = "value", type: type = str, **meta: Any) -> Any:
    """A dataclass field that is also a command-line flag and a TOML key (see `Meta`)."""
    metadata = {"option": Meta(flag, help, kind, type, **meta)}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: list(default), metadata=metadata)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def meta_of(f: dataclasses.Field[Any]) -> Meta:
    meta: Meta = f.metadata["option"]
    return meta


def redefault(base: type, name: str, default: Any) -> Any:
    """`base`'s option `name` with another default: one declaration, a per-command default."""
    meta = meta_of({f.name: f for f in dataclasses.fields(base)}[name])
    return option(
        **{k: getattr(meta, k) for k in ("flag", "help", "kind", "type")},
        default=default,
        **{k: getattr(meta, k) for k in ("metavar", "choices", "at_least", "above", "at_most", "nonempty", "parse")},
    )


def add_arguments(parser: argparse.ArgumentParser, config_type: type[Any]) -> None:
    """A flag per field, its default in the help; unset flags stay out of the namespace (SUPPRESS),
    so the TOML file can fill them."""
    tables = [f.name for f in dataclasses.fields(config_type) if meta_of(f).kind == "table"]
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"TOML file with any of the options below, by field name (flags win), and the tables {', '.join(tables)}",
    )
    for f in dataclasses.fields(config_type):
        meta = meta_of(f)
        if meta.kind == "table":
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "help": f"{meta.help}{_default_text(meta, default)}".replace("%", "%%"),  # argparse formats help with %
            "default": argparse.SUPPRESS,
        }
        if meta.kind in ("off", "on"):
            kwargs["action"] = "store_false" if meta.kind == "off" else "store_true"
        else:
            kwargs["metavar"] = meta.shown_metavar()
            kwargs["action"] = "append" if meta.kind == "append" else "store"
        parser.add_argument(meta.flag, **kwargs)


def _default_text(meta: Meta, default: Any) -> str:
    """The default, and the range of a bounded number, as the help text ends."""
    if meta.kind in ("off", "on") or default is None:
        return ""
    if meta.kind in ("csv", "append"):
        shown = (",".join if meta.kind == "csv" else " ".join)(map(str, default)) or "none"
    else:
        shown = str(default)
    if meta.range_text() and meta.kind == "value":
        shown += f"; {meta.range_text()}"
    return f" (default: {shown})"


def values_from_args(args: argparse.Namespace, config_type: type[Any]) -> dict[str, Any]:
    """The values of `config_type`'s fields that the TOML file (`--config`) and the flags given
    set, flags winning: what the dataclass is made from."""
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        values.update(read_toml(Path(args.config), config_type))
    for f in dataclasses.fields(config_type):
        if f.name in vars(args):
            values[f.name] = _from_flag(f, getattr(args, f.name))
    return values


def _from_flag(f: dataclasses.Field[Any], raw: Any) -> Any:
    meta = meta_of(f)
    if meta.parse is not None:
        return parsed(meta, raw)
    if meta.kind == "csv":
        return split_csv(raw, meta.type)
    if meta.kind == "value" and meta.type is not str:
        return _scalar(meta.flag, raw, meta.type)
    return raw


def read_toml(path: Path, config_type: type[Any]) -> dict[str, Any]:
    try:
        data = tomllib.loads(read_text(path, MAX_CONFIG_BYTES, "a config file"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    fields = {f.name: f for f in dataclasses.fields(config_type)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UsageError(f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    return {name: _from_value(str(path), fields[name], value) for name, value in data.items()}


def values_from_mapping(config_type: type[Any], given: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The values of `config_type`'s fields that Python keyword arguments (`where`: the function
    they were given to) set, each by its field's name or its flag's (`policy` for `--policy`),
    as a TOML file would give them; an unknown name is refused with the names there are."""
    fields = {f.name: f for f in dataclasses.fields(config_type)}
    names: dict[str, str] = {flag: f.name for f in fields.values() if (flag := flag_name(f))}
    names.update({name: name for name in fields})
    values: dict[str, Any] = {}
    for name, value in given.items():
        if name not in names:
            raise UsageError(f"{where}: unknown option {name}; known: {', '.join(sorted(names))}")
        field_name = names[name]
        if field_name in values:
            raise UsageError(f"{where}: {field_name} given twice (as {name} and by another name)")
        f = fields[field_name]
        if isinstance(value, (str, Path)) and meta_of(f).kind == "append":
            value = [value]
        if isinstance(value, (list, tuple)):  # paths as the strings a flag gives
            value = [str(v) if isinstance(v, Path) else v for v in value]
        values[field_name] = _from_value(where, f, value)
    return values


def flag_name(f: dataclasses.Field[Any]) -> str | None:
    """A value option's flag as a Python name (`--max-memory`: max_memory); None for a switch,
    whose flag says the opposite of its field (`--no-progress` sets progress False), or a table."""
    meta = meta_of(f)
    return meta.flag.removeprefix("--").replace("-", "_") if meta.flag and meta.kind not in ("off", "on") else None


def _from_value(where: str, f: dataclasses.Field[Any], value: Any) -> Any:
    """A value of the field's type, as TOML or Python gives it; a list where the flag takes a
    list (or a comma string)."""
    kind, type_ = meta_of(f).kind, meta_of(f).type
    parse = meta_of(f).parse
    if parse is not None:
        try:
            return parse(value)
        except ValueError as exc:
            raise UsageError(f"{where}: {f.name} {value!r}: {exc}") from None
    if kind in ("csv", "append"):
        if isinstance(value, str) and kind == "csv":
            return split_csv(value, type_)
        if isinstance(value, list) and all(_is_type(v, type_) for v in value):
            return [float(v) for v in value] if type_ is float else value
        raise UsageError(f"{where}: {f.name} must be a list of {type_.__name__}, got {value!r}")
    if kind == "table":
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return value
        raise UsageError(f'{where}: {f.name} must be a table of strings, e.g. [{f.name}] "model.zip" = "CartPole-v1"')
    if kind in ("off", "on"):
        type_ = bool
    if isinstance(value, Path) and type_ is str:
        value = str(value)
    if not _is_type(value, type_):
        raise UsageError(f"{where}: {f.name} must be {'an' if type_ is int else 'a'} {type_.__name__}, got {value!r}")
    return float(value) if type_ is float else value


def _is_type(value: Any, type_: type) -> bool:
    if type_ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, type_)


def split_csv(raw: str, type_: type) -> list[Any]:
    try:
        return [type_(part.strip()) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{raw!r} is not a comma-separated list of {type_.__name__}") from None


def parsed(meta: Meta, raw: Any) -> Any:
    assert meta.parse is not None
    try:
        return meta.parse(raw)
    except ValueError as exc:
        raise UsageError(f"{meta.flag} {raw!r}: {exc}") from None


def finite_number(text: str) -> float:
    """An argparse type for the flags declared outside these dataclasses: a finite number, as
    `Meta.check` holds every declared one to (inf, nan and 1e999 refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number")
    return value


def _scalar(flag: str, raw: str, type_: type) -> Any:
    try:
        return type_(raw)
    except ValueError:
        raise UsageError(f"{flag} {raw!r} is not a{'n' if type_ is int else ''} {type_.__name__}") from None
