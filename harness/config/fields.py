"""Options as pydantic fields: `option` declares a model field that is at once a command-line flag,
a TOML key and a line of help (its `Flag`), with its bounds (`ge`, `gt`, `le`, `min_length`),
choices and parser; and what reads them into the model: the flags of an argparse parser, a TOML
file, Python keyword arguments. pydantic validates the values whichever way they came; a
`ValidationError` becomes the one line a command prints (`config_from`). The options themselves
are declared in harness/config/options.py. Light on purpose: `harness --help` imports this module.
"""

from __future__ import annotations

import argparse
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from annotated_types import Ge, Gt, Le
from pydantic import AfterValidator, BaseModel, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticCustomError

from harness.errors import UsageError
from harness.files import read_text

# A config file is a few hundred bytes; read no more than this (and only from a regular file).
MAX_CONFIG_BYTES = 1024 * 1024

Model = TypeVar("Model", bound=BaseModel)

Choices = tuple[str, ...] | Callable[[], tuple[str, ...]]
"""The values an option takes: a tuple, or a function returning one where the names are read
when asked (the accelerators a registry holds then) or belong to a module too heavy for
`harness --help` to import."""

Kind = Literal["value", "csv", "append", "off", "on", "table"]
"""How a flag gives its field's value: "value" (one value), "csv" (a comma-separated list),
"append" (a repeatable flag collecting a list), "off" / "on" (a switch that sets the field to
False / True), "table" (a TOML table of strings, no flag)."""


@dataclass(frozen=True)
class Flag:
    """What makes a model field an option: its flag and how the flag's text becomes the value
    pydantic validates (`kind`; `type`, the scalar each value of it is: str, int or float)."""

    flag: str
    kind: Kind = "value"
    type: type = str
    metavar: str | None = None
    choices: Choices | None = None

    def allowed(self) -> tuple[str, ...] | None:
        return self.choices() if callable(self.choices) else self.choices

    def shown_metavar(self) -> str | None:
        allowed = self.allowed()
        if self.metavar is not None or not allowed:
            return self.metavar
        return "{" + ",".join(allowed) + "}" + (",..." if self.kind == "csv" else "")

    def name(self) -> str | None:
        """The flag as a Python name (`--max-memory`: max_memory); None for a switch, whose flag
        says the opposite of its field (`--no-progress` sets progress False), or a table."""
        return self.flag.removeprefix("--").replace("-", "_") if self.flag and self.kind not in ("off", "on") else None


def option(
    flag: str,
    help: str,
    default: Any,
    kind: Kind = "value",
    type: type = str,
    *,
    metavar: str | None = None,
    choices: Choices | None = None,
    **constraints: Any,
) -> Any:
    """A model field that is also a command-line flag and a TOML key; `constraints` are pydantic's
    (`ge`, `gt`, `le`, `min_length`). A number is finite (pydantic lets inf and nan through a
    bound, and no option means either); a value of `choices` is one of them."""
    if type is float and kind == "value":
        constraints["allow_inf_nan"] = False
    info = _field(default, help, **constraints)
    meta = Flag(flag, kind, type, metavar, choices)
    info.metadata.append(meta)
    if choices is not None:
        info.metadata.append(AfterValidator(lambda value: _one_of(meta, value)))
    return info


def _one_of(meta: Flag, value: Any) -> Any:
    allowed = meta.allowed() or ()
    for v in value if isinstance(value, list) else [value]:
        if v is not None and v not in allowed:
            raise PydanticCustomError("choice", "{value} is not one of {allowed}", {"value": v, "allowed": ", ".join(allowed)})
    return value


def redefault(base: type[BaseModel], name: str, default: Any) -> Any:
    """`base`'s option `name` with another default: one declaration, a per-command default."""
    info = base.model_fields[name]
    again = _field(default, info.description)
    again.metadata = list(info.metadata)  # the bounds, the flag, the check of its choices
    return again


def _field(default: Any, help: str | None, **constraints: Any) -> FieldInfo:
    """A pydantic field of `default`; a list or a table made afresh for each config."""
    if isinstance(default, (list, tuple)):
        return cast(FieldInfo, Field(default_factory=lambda: list(default), description=help, **constraints))
    if isinstance(default, dict):
        return cast(FieldInfo, Field(default_factory=lambda: dict(default), description=help, **constraints))
    return cast(FieldInfo, Field(default, description=help, **constraints))


def flag_of(info: FieldInfo) -> Flag:
    [meta] = [m for m in info.metadata if isinstance(m, Flag)]
    return meta


def fields(model: type[BaseModel]) -> dict[str, tuple[FieldInfo, Flag]]:
    """A model's options by field name: the field and its flag."""
    return {name: (info, flag_of(info)) for name, info in model.model_fields.items()}


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """A flag per field, its default in the help; unset flags stay out of the namespace (SUPPRESS),
    so the TOML file can fill them."""
    options = fields(model)
    tables = [name for name, (_, meta) in options.items() if meta.kind == "table"]
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"TOML file with any of the options below, by field name (flags win), and the tables {', '.join(tables)}",
    )
    for name, (info, meta) in options.items():
        if meta.kind == "table":
            continue
        kwargs: dict[str, Any] = {
            "dest": name,
            # argparse formats help with %
            "help": f"{info.description}{_default_text(info, meta)}".replace("%", "%%"),
            "default": argparse.SUPPRESS,
        }
        if meta.kind in ("off", "on"):
            kwargs["action"] = "store_false" if meta.kind == "off" else "store_true"
        else:
            kwargs["metavar"] = meta.shown_metavar()
            kwargs["action"] = "append" if meta.kind == "append" else "store"
        parser.add_argument(meta.flag, **kwargs)


def _default_text(info: FieldInfo, meta: Flag) -> str:
    """The default, and the range of a bounded number, as the help text ends."""
    default = info.get_default(call_default_factory=True)
    if meta.kind in ("off", "on") or default is None:
        return ""
    if meta.kind in ("csv", "append"):
        shown = (",".join if meta.kind == "csv" else " ".join)(map(str, default)) or "none"
    else:
        shown = str(default)
    if _range_text(info) and meta.kind == "value":
        shown += f"; {_range_text(info)}"
    return f" (default: {shown})"


def _range_text(info: FieldInfo) -> str:
    """`LOW to HIGH` for a number bounded on both sides, else an empty string."""
    low = next((m.ge if isinstance(m, Ge) else m.gt for m in info.metadata if isinstance(m, (Ge, Gt))), None)
    high = next((m.le for m in info.metadata if isinstance(m, Le)), None)
    return f"{low} to {high}" if low is not None and high is not None else ""


@dataclass
class Given:
    """The values a run was given, by field name, and where each came from: "" for a flag, else
    the file or the function that gave it (what an error names)."""

    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)

    def update(self, values: Mapping[str, Any], source: str) -> None:
        self.values.update(values)
        self.sources.update(dict.fromkeys(values, source))


def given_by_args(args: argparse.Namespace, model: type[BaseModel]) -> Given:
    """What the TOML file (`--config`) and the flags given set, flags winning."""
    given = Given({})
    if getattr(args, "config", None):
        given.update(read_toml(Path(args.config), model), args.config)
    for name, (_, meta) in fields(model).items():
        if name in vars(args):
            given.update({name: _from_flag(meta, getattr(args, name))}, "")
    return given


def _from_flag(meta: Flag, raw: Any) -> Any:
    """The flag's text as the values pydantic validates: a list for a csv flag, a number for a
    number's (a switch and a repeatable flag come as argparse made them)."""
    if meta.kind == "csv":
        return split_csv(raw, meta.type)
    if meta.kind == "value" and meta.type is not str:
        try:
            return meta.type(raw)
        except ValueError:
            raise UsageError(f"{meta.flag} {raw!r} is not a{'n' if meta.type is int else ''} {meta.type.__name__}") from None
    return raw


def split_csv(raw: str, type_: type) -> list[Any]:
    try:
        return [type_(part.strip()) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{raw!r} is not a comma-separated list of {type_.__name__}") from None


def read_toml(path: Path, model: type[BaseModel]) -> dict[str, Any]:
    """The values a TOML file sets, as TOML gives them (a csv option's comma string split)."""
    try:
        data = tomllib.loads(read_text(path, MAX_CONFIG_BYTES, "a config file"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    options = fields(model)
    unknown = sorted(set(data) - set(options))
    if unknown:
        raise UsageError(f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(options))}")
    return {name: _from_value(options[name][1], value) for name, value in data.items()}


def given_by_mapping(model: type[BaseModel], given: Mapping[str, Any], where: str) -> Given:
    """What Python keyword arguments (`where`: the function they were given to) set, each by its
    field's name or its flag's (`policy` for `--policy`), as a TOML file would give them; an
    unknown name is refused with the names there are."""
    options = fields(model)
    names: dict[str, str] = {flag: name for name, (_, meta) in options.items() if (flag := meta.name())}
    names.update({name: name for name in options})
    values: dict[str, Any] = {}
    for name, value in given.items():
        if name not in names:
            raise UsageError(f"{where}: unknown option {name}; known: {', '.join(sorted(names))}")
        field_name = names[name]
        if field_name in values:
            raise UsageError(f"{where}: {field_name} given twice (as {name} and by another name)")
        meta = options[field_name][1]
        if isinstance(value, (str, Path)) and meta.kind == "append":
            value = [value]
        if isinstance(value, (list, tuple)):  # paths as the strings a flag gives
            value = [str(v) if isinstance(v, Path) else v for v in value]
        elif isinstance(value, Path):
            value = str(value)
        values[field_name] = _from_value(meta, value)
    result = Given({})
    result.update(values, where)
    return result


def _from_value(meta: Flag, value: Any) -> Any:
    """A csv option's comma string as its list, as its flag would give it."""
    return split_csv(value, meta.type) if meta.kind == "csv" and isinstance(value, str) else value


def config_from(model: type[Model], given: Given) -> Model:
    """`model` made from the values given; a UsageError in one line for the first value that
    does not validate, naming its flag (or its key, and where it came from) and what it may be."""
    try:
        return model(**given.values)
    except ValidationError as exc:
        raise UsageError(_one_line(model, exc.errors()[0], given)) from None


def _one_line(model: type[BaseModel], error: ErrorDetails, given: Given) -> str:
    name = str(error["loc"][0])
    info = model.model_fields[name]
    meta = flag_of(info)
    value = error["input"]
    source = given.sources.get(name, "")
    where = meta.flag if source == "" and meta.flag else f"{source}: {name}" if source else name
    kind = error["type"]
    if kind == "value_error":  # a parser's: what the value takes
        shown = ",".join(map(str, value)) if isinstance(value, list) else value
        return f"{where} {shown!r}: {error.get('ctx', {}).get('error')}"
    if kind in ("choice", "literal_error"):  # ours (a list's value, or choices read when asked), or a Literal's
        shown = error.get("ctx", {}).get("value", value)
        return f"{meta.flag} {shown!r} is not one of {', '.join(meta.allowed() or ())}"
    bounds = {"greater_than_equal": "at least {ge}", "greater_than": "more than {gt}", "less_than_equal": "at most {le}"}
    if kind in bounds:
        shown_range = f" (from {_range_text(info)})" if _range_text(info) else ""
        # pydantic gives a float field's bound as a float: 0, not 0.0, as the option declares it
        ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in error.get("ctx", {}).items()}
        return f"{meta.flag} {value}: must be {bounds[kind].format(**ctx)}{shown_range}"
    if kind == "finite_number":
        return f"{meta.flag} {value}: must be a finite number"
    if kind == "too_short":
        return f"{meta.flag}: give at least one value"
    return f"{where} must be {_expected(name, meta)}, got {given.values.get(name, value)!r}"


def _expected(name: str, meta: Flag) -> str:
    """What a value of the wrong type should have been, in words (a table's with an example)."""
    if meta.kind == "table":
        return f'a table of strings, e.g. [{name}] "model.zip" = "CartPole-v1"'
    if meta.kind in ("csv", "append"):
        return f"a list of {meta.type.__name__}"
    if meta.kind in ("off", "on"):
        return "a bool (true or false)"
    return f"{'an' if meta.type is int else 'a'} {meta.type.__name__}"


def finite_number(text: str) -> float:
    """An argparse type for the flags declared outside the models (`harness query`, `report`): a
    finite number, as every declared one is (inf, nan and 1e999 refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number")
    return value
