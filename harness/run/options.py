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
from typing import TYPE_CHECKING, Any, TypeVar

from harness.dtypes import CARD_DTYPES
from harness.errors import UsageError
from harness.files import read_bounded_text
from harness.store.paths import check_results_folder, check_run_id

if TYPE_CHECKING:
    from harness.judge.compare import Tolerance
    from harness.judge.golden import RatioLimits

DEFAULT_POLICIES = ("cartpole", "huggy-arch")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
EPISODE_BATCHINGS = ("lockstep", "single")
ACTION_KINDS = ("discrete", "continuous")
# Seeds feed numpy's and gymnasium's generators and the episodes' int64 seed arrays: a 32-bit
# range is what every one of them takes, and seed + episodes stays far inside int64.
MAX_SEED = 2**32 - 1
# A config file is a few hundred bytes; read no more than this (and only from a regular file).
MAX_CONFIG_BYTES = 1024 * 1024

Config = TypeVar("Config", bound="CommonOptions")


def option(flag: str, help: str, default: Any, kind: str = "value", type: type = str, metavar: str | None = None) -> Any:
    """A dataclass field that is also a command-line flag and a TOML key.

    kind: "value" (one value of `type`), "csv" (a comma-separated list of `type`), "append" (a
    repeatable flag collecting a list), "off" / "on" (a switch that sets the field to False /
    True), "table" (a TOML table of strings, no flag).
    """
    meta = {"flag": flag, "help": help, "kind": kind, "type": type, "metavar": metavar}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: list(default), metadata=meta)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


def redefault(base: type, name: str, default: Any) -> Any:
    """`base`'s option `name` with another default: one declaration, a per-command default."""
    meta = {f.name: f for f in dataclasses.fields(base)}[name].metadata
    return option(meta["flag"], meta["help"], default, meta["kind"], meta["type"], meta["metavar"])


@dataclass
class CommonOptions:
    """What `harness sweep` and `harness bench` both take."""

    policies: list[str] = option(
        "--policy",
        "policy name (cartpole, huggy-arch) or path (.zip, .onnx, .pt, hf://); repeat for several",
        DEFAULT_POLICIES,
        "append",
        metavar="NAME_OR_PATH",
    )
    accelerator: str = option(
        "--accelerator", "auto picks npu, then cuda, then simulated cpu cards", "auto", metavar="{auto,npu,cuda,cpu}"
    )
    cards: int | None = option(
        "--cards", "number of cards (default: all the cluster has; 2 simulated on cpu)", None, type=int, metavar="N"
    )
    dtypes: list[str] = option(
        "--dtypes", "comma-separated dtypes of the card forward", CARD_DTYPES, "csv", metavar="DTYPE,DTYPE"
    )
    batch_sizes: list[int] = option("--batch-sizes", "comma-separated batch sizes", [1, 8, 4096], "csv", int, metavar="N,N")
    seed: int = option("--seed", f"seed of every batch, noise draw and episode, 0 to {MAX_SEED}", 0, type=int, metavar="N")
    threads: int = option("--threads", "torch threads in each actor (bitwise results depend on it)", 1, type=int, metavar="N")
    results: str = option("--results", "folder of the Parquet datasets", "results", metavar="DIR")
    run_id: str | None = option("--run-id", "name of this run (default: time and random suffix)", None, metavar="ID")
    address: str | None = option(
        "--address", "Ray cluster to join (default: RAY_ADDRESS, else a local Ray)", None, metavar="ADDR"
    )
    progress: bool = option("--no-progress", "hide the progress bar", True, "off")
    max_memory_gib: float | None = option(
        "--max-memory",
        "refuse a plan whose estimated memory (inputs, outputs, activations, actors, environments) exceeds this many GiB "
        "(default: half of what this machine has available)",
        None,
        type=float,
        metavar="GIB",
    )
    precision: str = option(
        "--precision",
        "strict: TF32/HF32 and reduced-precision reductions off on every card; device-default: as the card comes",
        "strict",
        metavar="{strict,device-default}",
    )
    env: str | None = option(
        "--env",
        "gymnasium environment for the episodes of policies that name none (e.g. seals/CartPole-v0)",
        None,
        metavar="ENV_ID",
    )
    envs: dict[str, str] = option(
        "",
        "TOML only: a table of policy (as given to --policy) -> environment id, for policies one by one; it wins over "
        "what a policy's files say",
        {},
        "table",
    )
    action_kind: str | None = option(
        "--action-kind",
        "for an ONNX graph that cannot say: its head is discrete logits or continuous actions",
        None,
        metavar="{discrete,continuous}",
    )
    onnx_output: str | None = option(
        "--onnx-output",
        "for an ONNX graph with several float outputs and no ArgMax: the output that is the head",
        None,
        metavar="NAME",
    )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


@dataclass
class SweepConfig(CommonOptions):
    """`harness sweep`: validate policies on every card against each other and the CPU."""

    episodes: int = option(
        "--episodes",
        "seeded episodes per mode (deterministic, stochastic) and dtype, for every policy with an environment",
        4,
        type=int,
        metavar="N",
    )
    episode_batching: str = option(
        "--episode-batching",
        "lockstep: a unit's episodes step together, one batched forward per step; single: batch 1, as a deployed agent runs",
        "lockstep",
        metavar="{lockstep,single}",
    )
    tolerance: list[str] = option(
        "--tolerance",
        "DTYPE=ATOL,RTOL: the atol/rtol table for a dtype, which then gates every output; repeatable",
        [],
        "append",
        metavar="DTYPE=ATOL,RTOL",
    )
    ratio_limits: list[float] = option(
        "--ratio-limits",
        "the port rule's limits on error_ratio and max_ratio for >= 1000, >= 100 and fewer elements",
        [3.0, 5.0, 10.0],
        "csv",
        float,
        metavar="L,M,S",
    )
    require_batch_invariance: bool = option(
        "--require-batch-invariance",
        "fail the run when a card's rows computed alone differ from the same rows in a large batch",
        False,
        "on",
    )
    inject_fault: list[str] = option(
        "--inject-fault",
        "fault for negative tests, card<N>:KIND or all:KIND; KIND: perturb-weight, corrupt-weight, reduced-fp32, "
        "fp16-accumulate, mkl-avx2, crash-once, crash-always; repeatable",
        [],
        "append",
        metavar="SPEC",
    )
    placement: str = option(
        "--placement", "placement group strategy: " + ", ".join(PLACEMENT_STRATEGIES), "PACK", metavar="STRATEGY"
    )
    resume: str | None = option(
        "--resume", "run id of an interrupted sweep: run only its missing units", None, metavar="RUN_ID"
    )


@dataclass
class BenchConfig(CommonOptions):
    """`harness bench`: latency, throughput across cards, closed-loop decisions/s."""

    dtypes: list[str] = redefault(CommonOptions, "dtypes", ["float32"])
    batch_sizes: list[int] = redefault(CommonOptions, "batch_sizes", [1, 8, 256, 4096])
    card_counts: list[int] | None = option(
        "--card-counts",
        "comma-separated card counts to measure throughput at (default: 1 and --cards)",
        None,
        "csv",
        int,
        metavar="K,K",
    )
    duration: float = option(
        "--duration",
        "seconds per measurement: latency budget, throughput window, closed-loop minimum",
        0.2,
        type=float,
        metavar="S",
    )
    env_impl: str = option(
        "--env-impl",
        "closed-loop environments: auto (the numpy seals/CartPole-v0, bit-identical to seals, where it applies; "
        "gymnasium otherwise), numpy or gymnasium",
        "auto",
        metavar="{auto,numpy,gymnasium}",
    )


def add_arguments(parser: argparse.ArgumentParser, config_type: type[CommonOptions]) -> None:
    """A flag per field, its default in the help; unset flags stay out of the namespace (SUPPRESS),
    so the TOML file can fill them."""
    tables = [f.name for f in dataclasses.fields(config_type) if f.metadata["kind"] == "table"]
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"TOML file with any of the options below, by field name (flags win), and the tables {', '.join(tables)}",
    )
    for f in dataclasses.fields(config_type):
        meta = f.metadata
        if meta["kind"] == "table":
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "help": f"{meta['help']}{_default_text(meta['kind'], default)}",
            "default": argparse.SUPPRESS,
        }
        if meta["kind"] in ("off", "on"):
            kwargs["action"] = "store_false" if meta["kind"] == "off" else "store_true"
        else:
            kwargs["metavar"] = meta["metavar"]
            kwargs["action"] = "append" if meta["kind"] == "append" else "store"
        parser.add_argument(meta["flag"], **kwargs)


def _default_text(kind: str, default: Any) -> str:
    if kind in ("off", "on") or default is None:
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


def _from_flag(f: dataclasses.Field[Any], raw: Any) -> Any:
    kind, type_ = f.metadata["kind"], f.metadata["type"]
    if kind == "csv":
        return split_csv(raw, type_)
    if kind == "value" and type_ is not str:
        return _scalar(f.metadata["flag"], raw, type_)
    return raw


def read_toml(path: Path, config_type: type[CommonOptions]) -> dict[str, Any]:
    try:
        data = tomllib.loads(read_bounded_text(path, "config file", MAX_CONFIG_BYTES))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    fields = {f.name: f for f in dataclasses.fields(config_type)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UsageError(f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    return {name: _from_toml(path, fields[name], value) for name, value in data.items()}


def _from_toml(path: Path, f: dataclasses.Field[Any], value: Any) -> Any:
    """A TOML value of the field's type; a list where the flag takes a list (or a comma string)."""
    kind, type_ = f.metadata["kind"], f.metadata["type"]
    if kind in ("csv", "append"):
        if isinstance(value, str) and kind == "csv":
            return split_csv(value, type_)
        if isinstance(value, list) and all(_is_type(v, type_) for v in value):
            return [float(v) for v in value] if type_ is float else value
        raise UsageError(f"{path}: {f.name} must be a list of {type_.__name__}, got {value!r}")
    if kind == "table":
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return value
        raise UsageError(f'{path}: {f.name} must be a table of strings, e.g. [{f.name}] "model.zip" = "CartPole-v1"')
    if kind in ("off", "on"):
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
    if not 0 <= config.seed <= MAX_SEED:
        raise UsageError(f"--seed {config.seed}: must be from 0 to {MAX_SEED}")
    check_results_folder(Path(config.results))
    if config.run_id is not None:
        check_run_id(config.run_id)
    if config.max_memory_gib is not None and not config.max_memory_gib > 0:
        raise UsageError(f"--max-memory {config.max_memory_gib}: must be more than 0 GiB, e.g. --max-memory 8")
    from harness.devices import PRECISIONS

    if config.precision not in PRECISIONS:
        raise UsageError(f"--precision {config.precision!r} is not one of {', '.join(PRECISIONS)}")
    if config.action_kind is not None and config.action_kind not in ACTION_KINDS:
        raise UsageError(f"--action-kind {config.action_kind!r} is not one of {', '.join(ACTION_KINDS)}")
    unmapped = sorted(set(config.envs) - set(config.policies))
    if unmapped:
        raise UsageError(f"envs names {', '.join(unmapped)}, not among the policies ({', '.join(config.policies)})")
    if isinstance(config, SweepConfig):
        _validate_sweep(config)
    if isinstance(config, BenchConfig):
        _validate_bench(config)
    return config


def _validate_sweep(config: SweepConfig) -> None:
    from harness.inference.faults import parse_faults

    if config.episodes < 0:
        raise UsageError(f"--episodes {config.episodes}: must be 0 or more")
    if config.resume is not None:
        check_run_id(config.resume, "--resume")
    if config.placement not in PLACEMENT_STRATEGIES:
        raise UsageError(f"--placement {config.placement!r} is not one of {', '.join(PLACEMENT_STRATEGIES)}")
    if config.episode_batching not in EPISODE_BATCHINGS:
        raise UsageError(f"--episode-batching {config.episode_batching!r} is not one of {', '.join(EPISODE_BATCHINGS)}")
    parse_faults(config.inject_fault)
    parse_tolerances(config.tolerance)
    ratio_limits(config)


def _validate_bench(config: BenchConfig) -> None:
    from harness.envs.cartpole import IMPLS

    if config.card_counts is not None and (not config.card_counts or min(config.card_counts) < 1):
        raise UsageError(f"--card-counts {_csv(config.card_counts)!r}: card counts must be 1 or more, e.g. --card-counts 1,2")
    if config.cards is not None and config.card_counts and max(config.card_counts) > config.cards:
        raise UsageError(f"--card-counts {_csv(config.card_counts)!r}: more than --cards {config.cards}")
    if not config.duration > 0:
        raise UsageError(f"--duration {config.duration}: must be more than 0 seconds, e.g. --duration 0.5")
    if config.env_impl not in ("auto", *IMPLS):
        raise UsageError(f"--env-impl {config.env_impl!r} is not one of auto, {', '.join(IMPLS)}")


def parse_tolerances(specs: list[str]) -> dict[str, Tolerance]:
    """`--tolerance DTYPE=ATOL,RTOL`, repeatable: the user's tolerance table by dtype."""
    from harness.dtypes import REDUCED_FLOAT32
    from harness.judge.compare import TOLERANCES, Tolerance

    tables = {}
    for spec in specs:
        dtype, _, numbers = spec.partition("=")
        parts = numbers.split(",")
        try:
            if len(parts) != 2 or dtype not in (*TOLERANCES, *REDUCED_FLOAT32):
                raise ValueError
            atol, rtol = (float(p) for p in parts)
            tables[dtype] = Tolerance(atol, rtol, TOLERANCES[dtype.split("-")[0]].min_cos)
        except (ValueError, TypeError):
            known = ", ".join((*TOLERANCES, *REDUCED_FLOAT32))
            raise UsageError(
                f"--tolerance {spec!r}: expected DTYPE=ATOL,RTOL with DTYPE one of {known}, e.g. float16=0.05,0.002"
            ) from None
    return tables


def ratio_limits(config: SweepConfig) -> RatioLimits:
    from harness.judge.golden import RatioLimits

    try:
        return RatioLimits(*config.ratio_limits)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"--ratio-limits {_csv(config.ratio_limits)!r}: three limits, for >= 1000, >= 100 and fewer elements, "
            f"e.g. 3,5,10 ({exc})"
        ) from None
