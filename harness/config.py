"""The sweep configuration: one dataclass behind `harness sweep`, `--config FILE` and jobs/sweep.py.

Each field's metadata carries its flag and one-line help, so the command line, its defaults and
its documentation come from one place (CleanRL's `Args`). Precedence: defaults, then the TOML
file, then flags given on the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError

DEFAULT_POLICIES = ("cartpole", "huggy-arch")
DEFAULT_DTYPES = ("float32", "float16", "bfloat16")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _opt(flag: str, help: str, kind: str = "value", **extra: Any) -> dict[str, Any]:
    return {"flag": flag, "help": help, "kind": kind, **extra}


@dataclass
class SweepConfig:
    policies: list[str] = field(
        default_factory=lambda: list(DEFAULT_POLICIES),
        metadata=_opt("--policy", "policy name (cartpole, huggy-arch) or path (.zip, .onnx, .pt, hf://); repeat for several", "append"),
    )
    accelerator: str = field(default="auto", metadata=_opt("--accelerator", "auto picks npu, then cuda, then simulated cpu cards"))
    cards: int | None = field(default=None, metadata=_opt("--cards", "number of cards (default: all the cluster has; 2 simulated on cpu)", type=int))
    dtypes: list[str] = field(default_factory=lambda: list(DEFAULT_DTYPES), metadata=_opt("--dtypes", "comma-separated dtypes for the card forward", "csv"))
    episodes: int = field(default=4, metadata=_opt("--episodes", "seeded CartPole episodes per mode (deterministic, stochastic) and dtype", type=int))
    batch_sizes: list[int] = field(
        default_factory=lambda: [1, 8, 4096],
        metadata=_opt("--batch-sizes", "comma-separated sizes of the normal-distribution batches", "csv", type=int),
    )
    seed: int = field(default=0, metadata=_opt("--seed", "seed of every batch, noise draw and episode", type=int))
    threads: int = field(default=1, metadata=_opt("--threads", "torch threads in each actor (bitwise results depend on it)", type=int))
    results: str = field(default="results", metadata=_opt("--results", "folder of the Parquet datasets"))
    run_id: str | None = field(default=None, metadata=_opt("--run-id", "name of this run (default: time and random suffix)"))
    address: str | None = field(default=None, metadata=_opt("--address", "Ray cluster to join (default: RAY_ADDRESS, else a local Ray)"))
    inject_fault: list[str] = field(
        default_factory=list,
        metadata=_opt("--inject-fault", "fault for negative tests: card<N>:perturb-weight, corrupt-weight, mkl-avx2, crash-once, crash-always; repeatable", "append"),
    )
    placement: str = field(default="PACK", metadata=_opt("--placement", "placement group strategy: " + ", ".join(PLACEMENT_STRATEGIES)))
    resume: str | None = field(default=None, metadata=_opt("--resume", "run id of an interrupted sweep: run only its missing units"))
    progress: bool = field(default=True, metadata=_opt("--no-progress", "hide the progress bar", "store_false"))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags for every SweepConfig field; unset flags stay out of the namespace (SUPPRESS)."""
    parser.add_argument("--config", metavar="FILE", help="TOML file with any of the fields below (flags win)")
    for f in dataclasses.fields(SweepConfig):
        meta = f.metadata
        kwargs: dict[str, Any] = {"dest": f.name, "help": meta["help"], "default": argparse.SUPPRESS}
        if meta["kind"] == "append":
            kwargs["action"] = "append"
        elif meta["kind"] == "store_false":
            kwargs["action"] = "store_false"
        elif meta["kind"] == "value" and "type" in meta:
            kwargs["type"] = meta["type"]
        parser.add_argument(meta["flag"], **kwargs)


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        values.update(_read_toml(Path(args.config)))
    for f in dataclasses.fields(SweepConfig):
        if f.name in vars(args):
            raw = getattr(args, f.name)
            values[f.name] = split_csv(raw, f.metadata.get("type", str)) if f.metadata["kind"] == "csv" else raw
    return validate(SweepConfig(**values))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such config file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    known = {f.name for f in dataclasses.fields(SweepConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return data


def split_csv(raw: str, type_: type) -> list[Any]:
    try:
        return [type_(part.strip()) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{raw!r} is not a comma-separated list of {type_.__name__}") from None


def validate_shared(policies: list[str], accelerator: str, dtypes: list[str], batch_sizes: list[int], threads: int) -> None:
    """The options `harness sweep` and `harness bench` have in common, checked one way for both."""
    from harness.devices import ACCELERATORS
    from harness.policies.base import DTYPES

    if not policies:
        raise UsageError("no policy given; e.g. --policy cartpole")
    if accelerator not in ACCELERATORS:
        raise UsageError(f"--accelerator {accelerator!r} is not one of {', '.join(ACCELERATORS)}")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise UsageError(f"--dtypes {','.join(dtypes)!r}: unknown {bad}; e.g. --dtypes float32,bfloat16")
    if not batch_sizes or min(batch_sizes) < 1:
        raise UsageError(f"--batch-sizes {','.join(map(str, batch_sizes))!r}: sizes must be 1 or more, e.g. 1,8,4096")
    if threads < 1:
        raise UsageError(f"--threads {threads}: need at least 1")


def validate(config: SweepConfig) -> SweepConfig:
    """Reject bad values up front, with the bad value and a valid example."""
    validate_shared(config.policies, config.accelerator, config.dtypes, config.batch_sizes, config.threads)
    if config.cards is not None and config.cards < 1:
        raise UsageError(f"--cards {config.cards}: need at least 1")
    if config.episodes < 0:
        raise UsageError(f"--episodes {config.episodes}: must be 0 or more")
    if config.placement not in PLACEMENT_STRATEGIES:
        raise UsageError(f"--placement {config.placement!r} is not one of {', '.join(PLACEMENT_STRATEGIES)}")
    from harness.faults import parse_faults

    parse_faults(config.inject_fault)
    return config
