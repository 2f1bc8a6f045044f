"""Options of `harness sweep` and `harness bench`: one dataclass per command, the options they
share declared once in `CommonOptions`, which both embed.

Each field's metadata carries its flag and one-line help, so the command line, the TOML file
(`--config FILE`), `jobs/sweep.py` and every `--help` (defaults included) come from one place, as
CleanRL's `Args` does. Precedence: the field's default, then the TOML file, then flags given on
the command line. Values are checked in `validate`, before Ray starts, with the bad value and a
valid example. Light on purpose: `harness --help` imports this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from harness.errors import UsageError

DEFAULT_POLICIES = ("cartpole", "huggy-arch")
DTYPE_ORDER = ("float32", "float16", "bfloat16")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

Config = TypeVar("Config", bound="CommonOptions")


def option(flag: str, help: str, default: Any, kind: str = "value", type: type = str, metavar: str | None = None) -> Any:
    """A dataclass field that is also a command-line flag and a TOML key.

    kind: "value" (one value of `type`), "csv" (a comma-separated list of `type`), "append" (a
    repeatable flag collecting a list), "off" (a switch that sets the field to False).
    """
    meta = {"flag": flag, "help": help, "kind": kind, "type": type, "metavar": metavar}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def redefault(base: type, name: str, default: Any) -> Any:
    """`base`'s option `name` with another default: one declaration, a per-command default."""
    meta = {f.name: f for f in dataclasses.fields(base)}[name].metadata
    return option(meta["flag"], meta["help"], default, meta["kind"], meta["type"], meta["metavar"])


@dataclass
class CommonOptions:
    """What `harness sweep` and `harness bench` both take."""

    policies: list[str] = option(
        "--policy", "policy name (cartpole, huggy-arch) or path (.zip, .onnx, .pt, hf://); repeat for several",
        DEFAULT_POLICIES, "append", metavar="NAME_OR_PATH",
    )
    accelerator: str = option("--accelerator", "auto picks npu, then cuda, then simulated cpu cards", "auto", metavar="{auto,npu,cuda,cpu}")
    cards: int | None = option("--cards", "number of cards (default: all the cluster has; 2 simulated on cpu)", None, type=int, metavar="N")
    dtypes: list[str] = option("--dtypes", "comma-separated dtypes of the card forward", DTYPE_ORDER, "csv", metavar="DTYPE,DTYPE")
    batch_sizes: list[int] = option("--batch-sizes", "comma-separated batch sizes", [1, 8, 4096], "csv", int, metavar="N,N")
    seed: int = option("--seed", "seed of every batch, noise draw and episode", 0, type=int, metavar="N")
    threads: int = option("--threads", "torch threads in each actor (bitwise results depend on it)", 1, type=int, metavar="N")
    results: str = option("--results", "folder of the Parquet datasets", "results", metavar="DIR")
    run_id: str | None = option("--run-id", "name of this run (default: time and random suffix)", None, metavar="ID")
    address: str | None = option("--address", "Ray cluster to join (default: RAY_ADDRESS, else a local Ray)", None, metavar="ADDR")
    progress: bool = option("--no-progress", "hide the progress bar", True, "off")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


@dataclass
class SweepConfig(CommonOptions):
    """`harness sweep`: validate policies on every card against each other and the CPU."""

    episodes: int = option("--episodes", "seeded CartPole episodes per mode (deterministic, stochastic) and dtype", 4, type=int, metavar="N")
    inject_fault: list[str] = option(
        "--inject-fault", "fault for negative tests: card<N>:perturb-weight, corrupt-weight, mkl-avx2, crash-once, crash-always; repeatable",
        [], "append", metavar="SPEC",
    )
    placement: str = option("--placement", "placement group strategy: " + ", ".join(PLACEMENT_STRATEGIES), "PACK", metavar="STRATEGY")
    resume: str | None = option("--resume", "run id of an interrupted sweep: run only its missing units", None, metavar="RUN_ID")


@dataclass
class BenchConfig(CommonOptions):
    """`harness bench`: latency, throughput across cards, closed-loop decisions/s."""

    dtypes: list[str] = redefault(CommonOptions, "dtypes", ["float32"])
    batch_sizes: list[int] = redefault(CommonOptions, "batch_sizes", [1, 8, 256, 4096])
    card_counts: list[int] | None = option(
        "--card-counts", "comma-separated card counts to measure throughput at (default: 1 and --cards)", None, "csv", int, metavar="K,K",
    )
    duration: float = option("--duration", "seconds per measurement: latency budget, throughput window, closed-loop minimum", 0.2, type=float, metavar="S")
    env_impl: str = option(
        "--env-impl", "closed-loop CartPole, for policies of seals/CartPole-v0: numpy (bit-identical to seals) or gymnasium (the real env)",
        "numpy", metavar="{numpy,gymnasium}",
    )


def add_arguments(parser: argparse.ArgumentParser, config_type: type[CommonOptions]) -> None:
    """A flag per field, its default in the help; unset flags stay out of the namespace (SUPPRESS),
    so the TOML file can fill them."""
    parser.add_argument("--config", metavar="FILE", help="TOML file with any of the options below, by field name (flags win)")
    for f in dataclasses.fields(config_type):
        meta = f.metadata
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kwargs: dict[str, Any] = {"dest": f.name, "help": f"{meta['help']}{_default_text(meta['kind'], default)}", "default": argparse.SUPPRESS}
        if meta["kind"] == "off":
            kwargs["action"] = "store_false"
        else:
            kwargs["metavar"] = meta["metavar"]
            kwargs["action"] = "append" if meta["kind"] == "append" else "store"
        parser.add_argument(meta["flag"], **kwargs)


def _default_text(kind: str, default: Any) -> str:
    if kind == "off" or default is None:
        return ""
    if kind in ("csv", "append"):
        shown = (",".join if kind == "csv" else " ".join)(map(str, default)) or "none"
    else:
        shown = str(default)
    return f" (default: {shown})"


def config_from_args(args: argparse.Namespace, config_type: type[Config]) -> Config:
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        values.update(read_toml(Path(args.config), config_type))
    for f in dataclasses.fields(config_type):
        if f.name in vars(args):
            values[f.name] = _from_flag(f, getattr(args, f.name))
    return validate(config_type(**values))


def _from_flag(f: dataclasses.Field, raw: Any) -> Any:
    kind, type_ = f.metadata["kind"], f.metadata["type"]
    if kind == "csv":
        return split_csv(raw, type_)
    if kind == "value" and type_ is not str:
        return _scalar(f.metadata["flag"], raw, type_)
    return raw


def read_toml(path: Path, config_type: type[CommonOptions]) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a folder, not a config file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    fields = {f.name: f for f in dataclasses.fields(config_type)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UsageError(f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    return {name: _from_toml(path, fields[name], value) for name, value in data.items()}


def _from_toml(path: Path, f: dataclasses.Field, value: Any) -> Any:
    """A TOML value of the field's type; a list where the flag takes a list (or a comma string)."""
    kind, type_ = f.metadata["kind"], f.metadata["type"]
    if kind in ("csv", "append"):
        if isinstance(value, str) and kind == "csv":
            return split_csv(value, type_)
        if isinstance(value, list) and all(_is_type(v, type_) for v in value):
            return value
        raise UsageError(f"{path}: {f.name} must be a list of {type_.__name__}, got {value!r}")
    if kind == "off":
        type_ = bool
    if not _is_type(value, type_):
        raise UsageError(f"{path}: {f.name} must be a {type_.__name__}, got {value!r}")
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


def _scalar(flag: str, raw: str, type_: type) -> Any:
    try:
        return type_(raw)
    except ValueError:
        raise UsageError(f"{flag} {raw!r} is not a{'n' if type_ is int else ''} {type_.__name__}") from None


def _csv(values: list[Any]) -> str:
    return ",".join(map(str, values))


def validate(config: Config) -> Config:
    """Reject bad values up front, with the bad value and a valid example."""
    from harness.devices import ACCELERATORS
    from harness.policies.base import DTYPES

    if not config.policies:
        raise UsageError("no policy given; e.g. --policy cartpole")
    if config.accelerator not in ACCELERATORS:
        raise UsageError(f"--accelerator {config.accelerator!r} is not one of {', '.join(ACCELERATORS)}")
    if config.cards is not None and config.cards < 1:
        raise UsageError(f"--cards {config.cards}: need at least 1")
    bad = [d for d in config.dtypes if d not in DTYPES]
    if bad or not config.dtypes:
        raise UsageError(f"--dtypes {_csv(config.dtypes)!r}: unknown {bad}; e.g. --dtypes float32,bfloat16")
    if not config.batch_sizes or min(config.batch_sizes) < 1:
        raise UsageError(f"--batch-sizes {_csv(config.batch_sizes)!r}: sizes must be 1 or more, e.g. 1,8,4096")
    if config.threads < 1:
        raise UsageError(f"--threads {config.threads}: need at least 1")
    results = Path(config.results)
    if results.exists() and not results.is_dir():
        raise UsageError(f"--results {results}: is a file; it must be a folder (it is made if missing)")
    if isinstance(config, SweepConfig):
        _validate_sweep(config)
    if isinstance(config, BenchConfig):
        _validate_bench(config)
    return config


def _validate_sweep(config: SweepConfig) -> None:
    from harness.inference.faults import parse_faults

    if config.episodes < 0:
        raise UsageError(f"--episodes {config.episodes}: must be 0 or more")
    if config.placement not in PLACEMENT_STRATEGIES:
        raise UsageError(f"--placement {config.placement!r} is not one of {', '.join(PLACEMENT_STRATEGIES)}")
    parse_faults(config.inject_fault)


def _validate_bench(config: BenchConfig) -> None:
    from harness.envs.cartpole import IMPLS

    if config.card_counts is not None and (not config.card_counts or min(config.card_counts) < 1):
        raise UsageError(f"--card-counts {_csv(config.card_counts)!r}: card counts must be 1 or more, e.g. --card-counts 1,2")
    if config.cards is not None and config.card_counts and max(config.card_counts) > config.cards:
        raise UsageError(f"--card-counts {_csv(config.card_counts)!r}: more than --cards {config.cards}")
    if not config.duration > 0:
        raise UsageError(f"--duration {config.duration}: must be more than 0 seconds, e.g. --duration 0.5")
    if config.env_impl not in IMPLS:
        raise UsageError(f"--env-impl {config.env_impl!r} is not one of {', '.join(IMPLS)}")
