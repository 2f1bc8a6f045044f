"""`harness bench`: its configuration, flags and checks. Light on purpose: `harness --help`
imports this module, so torch and Ray are imported only when the command runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from harness.config import split_csv, validate_shared
from harness.errors import UsageError


@dataclass
class BenchConfig:
    """What `harness bench` measures; every field is one flag."""

    policies: list[str] = field(default_factory=lambda: ["cartpole", "huggy-arch"])
    accelerator: str = "auto"
    cards: list[int] | None = None  # card counts to scale over; None: 1 and all the cluster has
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 256, 4096])
    dtypes: list[str] = field(default_factory=lambda: ["float32"])
    duration: float = 0.2  # seconds per measurement
    env: str = "vector"
    seed: int = 0
    threads: int = 1
    results: str = "results"
    run_id: str | None = None
    address: str | None = None
    progress: bool = True

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


DEFAULTS = BenchConfig()


def _csv(values: list[Any]) -> str:
    return ",".join(map(str, values))


def register(subparsers: argparse._SubParsersAction) -> None:
    # Values are checked by `config_from_args`, not argparse, so a bad one is a one-line error.
    p = subparsers.add_parser("bench", help="latency, throughput across cards, closed-loop CartPole decisions/s")
    p.add_argument("--policy", dest="policies", action="append", metavar="NAME", help=f"policy name or path; repeat for several (default: {' '.join(DEFAULTS.policies)})")
    p.add_argument("--accelerator", metavar="{auto,npu,cuda,cpu}", help="auto picks npu, then cuda, then simulated cpu cards (default: auto)")
    p.add_argument("--cards", metavar="K,K", help="comma-separated card counts to scale over, e.g. 1,2 (default: 1 and all the cluster has; 2 simulated on cpu)")
    p.add_argument("--batch-sizes", dest="batch_sizes", metavar="N,N", help=f"comma-separated batch sizes; also the closed-loop env counts (default: {_csv(DEFAULTS.batch_sizes)})")
    p.add_argument("--dtypes", metavar="DTYPE,DTYPE", help=f"comma-separated dtypes of the card forward (default: {_csv(DEFAULTS.dtypes)})")
    p.add_argument("--duration", metavar="S", help=f"seconds per measurement: latency budget, throughput window, closed-loop minimum (default: {DEFAULTS.duration})")
    p.add_argument("--env", metavar="{vector,seals}", help=f"closed-loop CartPole, for policies of seals/CartPole-v0: vector (numpy, bit-identical to seals) or seals (the real env) (default: {DEFAULTS.env})")
    p.add_argument("--seed", metavar="N", help=f"seed of the batches and the first closed-loop episode (default: {DEFAULTS.seed})")
    p.add_argument("--threads", metavar="N", help=f"torch threads in each card actor (default: {DEFAULTS.threads})")
    p.add_argument("--results", metavar="DIR", help=f"folder of the Parquet datasets (default: {DEFAULTS.results})")
    p.add_argument("--run-id", dest="run_id", metavar="ID", help="name of this run (default: time and random suffix)")
    p.add_argument("--address", metavar="ADDR", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=True, help="hide the progress bar")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from harness.bench import run_bench

    run_bench(config_from_args(args), command=" ".join(sys.argv))
    return 0


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    values: dict[str, Any] = {"progress": args.progress}
    csv_types = {"cards": int, "batch_sizes": int, "dtypes": str}
    scalar_types = {"duration": float, "seed": int, "threads": int}
    for f in dataclasses.fields(BenchConfig):
        raw = getattr(args, f.name, None)
        if raw is None or f.name == "progress":
            continue
        if f.name in csv_types:
            values[f.name] = split_csv(raw, csv_types[f.name])
        elif f.name in scalar_types:
            values[f.name] = _scalar(f"--{f.name}", raw, scalar_types[f.name])
        else:
            values[f.name] = raw
    return validate(BenchConfig(**values))


def _scalar(flag: str, raw: str, type_: type) -> Any:
    try:
        return type_(raw)
    except ValueError:
        raise UsageError(f"{flag} {raw!r} is not a{'n' if type_ is int else ''} {type_.__name__}") from None


def validate(config: BenchConfig) -> BenchConfig:
    """Reject bad values before Ray starts, with the bad value and a valid example."""
    from harness.vec_cartpole import ENV_KINDS

    validate_shared(config.policies, config.accelerator, config.dtypes, config.batch_sizes, config.threads)
    if config.cards is not None and (not config.cards or min(config.cards) < 1):
        raise UsageError(f"--cards {_csv(config.cards)!r}: card counts must be 1 or more, e.g. --cards 1,2")
    if not config.duration > 0:
        raise UsageError(f"--duration {config.duration}: must be more than 0 seconds, e.g. --duration 0.5")
    if config.env not in ENV_KINDS:
        raise UsageError(f"--env {config.env!r} is not one of {', '.join(ENV_KINDS)}")
    return config
