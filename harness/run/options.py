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
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from harness.devices.registry import AUTO, auto_help, choices
from harness.devices.precision import PRECISIONS
from harness.dtypes import CARD_DTYPES
from harness.errors import UsageError
from harness.files import read_text
from harness.store.paths import check_results_folder, check_run_id

if TYPE_CHECKING:
    from harness.inference.fault_specs import Fault
    from harness.judge.compare import Tolerance
    from harness.judge.golden import RatioLimits
    from harness.judge.returns import Margin
    from harness.policies.base import ActionKind

DEFAULT_POLICIES = ("cartpole", "huggy-arch")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
EPISODE_BATCHINGS = ("lockstep", "single")
AUTO_EPISODES: Literal["auto"] = "auto"
"""`--episodes auto`: rounds of episodes until every closed-loop verdict is conclusive."""
ACTION_KINDS = ("discrete", "continuous")
# Seeds feed numpy's and gymnasium's generators and the episodes' int64 seed arrays: a 32-bit
# range is what every one of them takes, and seed + episodes stays far inside int64.
MAX_SEED = 2**32 - 1
# A config file is a few hundred bytes; read no more than this (and only from a regular file).
MAX_CONFIG_BYTES = 1024 * 1024

Config = TypeVar("Config", bound="CommonOptions")


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
            _parsed(self, value)
            return
        values = value if isinstance(value, list) else [value]
        if self.nonempty and not values:
            raise UsageError(f"{self.flag}: give at least one value")
        allowed = self.allowed()
        for v in values:
            if allowed is not None and v not in allowed:
                raise UsageError(f"{self.flag} {v!r} is not one of {', '.join(allowed)}")
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


def _env_impls() -> tuple[str, ...]:
    from harness.envs import IMPLS

    return ("auto", *IMPLS)


def episode_count(value: Any) -> int | Literal["auto"]:
    """`--episodes`: a count (0 or more) or `auto`."""
    if value == AUTO_EPISODES:
        return AUTO_EPISODES
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("expected a count of episodes (0 or more) or auto, e.g. 24")
    try:
        count = int(value)
    except ValueError:
        raise ValueError("expected a count of episodes (0 or more) or auto, e.g. 24") from None
    if count < 0:
        raise ValueError("must be at least 0, or auto")
    return count


def return_margin(value: Any) -> str:
    """`--return-margin`: checked here, read by the judge (harness.judge.returns.Margin)."""
    from harness.judge.returns import Margin

    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ValueError("expected a return (10) or a fraction of the spread (0.5std)")
    Margin.parse(str(value))
    return str(value)


@dataclass
class CommonOptions:
    """What `harness sweep` and `harness bench` both take."""

    policies: list[str] = option(
        "--policy",
        "policy name (cartpole, huggy-arch) or path (.zip, .onnx, .pt, hf://); repeat for several",
        DEFAULT_POLICIES,
        "append",
        metavar="NAME_OR_PATH",
        nonempty=True,
    )
    accelerator: str = option("--accelerator", auto_help(), AUTO, choices=choices)
    cards: int | None = option(
        "--cards",
        "number of cards (default: all the cluster has; 2 simulated cards on a private local Ray)",
        None,
        type=int,
        metavar="N",
        at_least=1,
    )
    dtypes: list[str] = option(
        "--dtypes", "comma-separated dtypes of the card forward", CARD_DTYPES, "csv", choices=CARD_DTYPES, nonempty=True
    )
    batch_sizes: list[int] = option(
        "--batch-sizes", "comma-separated batch sizes", [1, 8, 4096], "csv", int, metavar="N,N", at_least=1, nonempty=True
    )
    seed: int = option(
        "--seed", "seed of every batch, noise draw and episode", 0, type=int, metavar="N", at_least=0, at_most=MAX_SEED
    )
    threads: int = option(
        "--threads", "torch threads in each actor (bitwise results depend on it)", 1, type=int, metavar="N", at_least=1
    )
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
        above=0,
    )
    precision: str = option(
        "--precision",
        "strict: TF32/HF32 and reduced-precision reductions off on every card; device-default: as the card comes",
        "strict",
        choices=PRECISIONS,
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
    action_kind: ActionKind | None = option(
        "--action-kind",
        "for an ONNX graph that cannot say: its head is discrete logits or continuous actions",
        None,
        choices=ACTION_KINDS,
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

    episodes: int | Literal["auto"] = option(
        "--episodes",
        "seeded episodes per mode (deterministic, stochastic) and dtype, for every policy with an environment; auto: "
        "rounds of episodes until every closed-loop verdict is conclusive or a cap is reached (--auto-max-episodes, "
        "--auto-max-seconds)",
        4,
        metavar="N|auto",
        parse=episode_count,
    )
    return_margin: str = option(
        "--return-margin",
        "how much lost return matters to a closed-loop verdict: a fraction of the environment's per-episode spread "
        "(0.5std), or a return (10)",
        "0.5std",
        metavar="Fstd|RETURN",
        parse=return_margin,
    )
    require_conclusive: bool = option(
        "--require-conclusive",
        "fail the run when a closed-loop verdict is INCONCLUSIVE (its episodes cannot tell whether the card loses "
        "more return than the margin); without it they are reported, never passed, and do not gate",
        False,
        "on",
    )
    auto_max_episodes: int = option(
        "--auto-max-episodes",
        "with --episodes auto: play at most this many episodes per mode",
        1000,
        type=int,
        metavar="N",
        at_least=1,
    )
    auto_max_seconds: float = option(
        "--auto-max-seconds",
        "with --episodes auto: start no further round of episodes after this many seconds of them",
        600.0,
        type=float,
        metavar="S",
        above=0,
    )
    episode_batching: str = option(
        "--episode-batching",
        "lockstep: a unit's episodes step together, one batched forward per step; single: batch 1, as a deployed agent runs",
        "lockstep",
        choices=EPISODE_BATCHINGS,
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
    require_published_return: bool = option(
        "--require-published-return",
        "fail the run when the CPU float32's returns fall short of the published score by more than the margin "
        "(where the policy's files state one: a model card's mean_reward, results.json)",
        False,
        "on",
    )
    inject_fault: list[str] = option(
        "--inject-fault",
        "fault for negative tests, card<N>:KIND or all:KIND; KIND: ulp-noise (an honest card), perturb-weight, "
        "corrupt-weight, reduced-fp32, fp16-accumulate, action-bias[=SIZE], noisy-sampler[=SIZE], ignore-masks, mkl-avx2, "
        "crash-once, crash-always, hang-once, hang; repeatable",
        [],
        "append",
        metavar="SPEC",
    )
    hang_timeout: float = option(
        "--hang-timeout",
        "seconds an actor may take over a unit before it counts as hung, if also 10x what another actor took over "
        "it; a hung actor is killed and restarted once, hung again ends the run as incomplete (exit 3)",
        60.0,
        type=float,
        metavar="S",
        above=0,
    )
    placement: str = option("--placement", "placement group strategy", "PACK", choices=PLACEMENT_STRATEGIES)
    resume: str | None = option(
        "--resume", "run id of an interrupted sweep: run only its missing units", None, metavar="RUN_ID"
    )

    # The options that are specs, as the typed values the run uses: parsed once (by `validate`,
    # which refuses a bad one), never again where they are used.
    @cached_property
    def faults(self) -> list[Fault]:
        from harness.inference.fault_specs import parse_faults

        return parse_faults(self.inject_fault)

    @cached_property
    def tolerances(self) -> dict[str, Tolerance]:
        return parse_tolerances(self.tolerance)

    @cached_property
    def limits(self) -> RatioLimits:
        return ratio_limits(self)

    @cached_property
    def margin(self) -> Margin:
        from harness.judge.returns import Margin

        return Margin.parse(self.return_margin)


@dataclass
class BenchConfig(CommonOptions):
    """`harness bench`: latency, throughput across cards, closed-loop decisions/s, the server scenario."""

    dtypes: list[str] = redefault(CommonOptions, "dtypes", ["float32"])
    batch_sizes: list[int] = redefault(CommonOptions, "batch_sizes", [1, 8, 256, 4096])
    card_counts: list[int] | None = option(
        "--card-counts",
        "comma-separated card counts to measure throughput at (default: 1 and --cards)",
        None,
        "csv",
        int,
        metavar="K,K",
        at_least=1,
        nonempty=True,
    )
    windows: int = option(
        "--windows",
        "windows per measurement: each row's figure is their median, with a 95% interval from their order statistics "
        "(at least 6 for one)",
        12,
        type=int,
        metavar="N",
        at_least=1,
    )
    window: float = option(
        "--window",
        "seconds per window (a window also holds at least --min-iterations calls)",
        0.15,
        type=float,
        metavar="S",
        above=0,
    )
    min_iterations: int = option(
        "--min-iterations", "calls per window at least, however long they take", 10, type=int, metavar="N", at_least=1
    )
    max_spread: float = option(
        "--max-spread",
        "a row is invalid when its 95% interval spans more than this fraction of its figure (the windows disagree)",
        0.25,
        type=float,
        metavar="F",
        above=0,
    )
    duration: float | None = option(
        "--duration",
        "a quick look instead: one window of S seconds per measurement (and per server trial); rows say so and are "
        "never valid",
        None,
        type=float,
        metavar="S",
        above=0,
    )
    latency_bound_ms: float = option(
        "--latency-bound-ms",
        "server scenario: the p99 latency that the highest sustained request rate must stay under",
        20.0,
        type=float,
        metavar="MS",
        above=0,
    )
    min_queries: int = option(
        "--min-queries",
        "server scenario: requests per trial at least (368 is the fewest whose p99 has a 95% interval)",
        400,
        type=int,
        metavar="N",
        at_least=1,
    )
    inject_fault: list[str] = option(
        "--inject-fault",
        "fault in the timed path only, card<N>:KIND or all:KIND; KIND: perturb-weight, corrupt-weight, reduced-fp32, "
        "fp16-accumulate, ulp-noise, action-bias[=SIZE], noisy-sampler[=SIZE], ignore-masks; the audit against the "
        "sweep's path must then fail; repeatable",
        [],
        "append",
        metavar="SPEC",
    )
    env_impl: str = option(
        "--env-impl",
        "closed-loop environments: auto (the numpy seals/CartPole-v0, bit-identical to seals, where it applies; "
        "gymnasium otherwise), numpy or gymnasium",
        "auto",
        choices=_env_impls,
    )

    @cached_property
    def faults(self) -> list[Fault]:
        """`--inject-fault`, parsed once (by `validate`, which refuses a bad one)."""
        from harness.inference.fault_specs import parse_faults

        return parse_faults(self.inject_fault)


def add_arguments(parser: argparse.ArgumentParser, config_type: type[CommonOptions]) -> None:
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


def config_from_args(args: argparse.Namespace, config_type: type[Config]) -> Config:
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        values.update(read_toml(Path(args.config), config_type))
    for f in dataclasses.fields(config_type):
        if f.name in vars(args):
            values[f.name] = _from_flag(f, getattr(args, f.name))
    return validate(config_type(**values))


def _from_flag(f: dataclasses.Field[Any], raw: Any) -> Any:
    meta = meta_of(f)
    if meta.parse is not None:
        return _parsed(meta, raw)
    if meta.kind == "csv":
        return split_csv(raw, meta.type)
    if meta.kind == "value" and meta.type is not str:
        return _scalar(meta.flag, raw, meta.type)
    return raw


def read_toml(path: Path, config_type: type[CommonOptions]) -> dict[str, Any]:
    try:
        data = tomllib.loads(read_text(path, MAX_CONFIG_BYTES, "a config file"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    fields = {f.name: f for f in dataclasses.fields(config_type)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UsageError(f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    return {name: _from_toml(path, fields[name], value) for name, value in data.items()}


def _from_toml(path: Path, f: dataclasses.Field[Any], value: Any) -> Any:
    """A TOML value of the field's type; a list where the flag takes a list (or a comma string)."""
    kind, type_ = meta_of(f).kind, meta_of(f).type
    parse = meta_of(f).parse
    if parse is not None:
        try:
            return parse(value)
        except ValueError as exc:
            raise UsageError(f"{path}: {f.name} {value!r}: {exc}") from None
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


def _parsed(meta: Meta, raw: Any) -> Any:
    assert meta.parse is not None
    try:
        return meta.parse(raw)
    except ValueError as exc:
        raise UsageError(f"{meta.flag} {raw!r}: {exc}") from None


def _scalar(flag: str, raw: str, type_: type) -> Any:
    try:
        return type_(raw)
    except ValueError:
        raise UsageError(f"{flag} {raw!r} is not a{'n' if type_ is int else ''} {type_.__name__}") from None


def _csv(values: list[Any]) -> str:
    return ",".join(map(str, values))


def validate(config: Config) -> Config:
    """Reject bad values up front, with the bad value and what it may be: first each option by
    its own choices and bounds, then what options say about each other."""
    for f in dataclasses.fields(config):
        meta_of(f).check(getattr(config, f.name))
    check_results_folder(Path(config.results))
    if config.run_id is not None:
        check_run_id(config.run_id)
    unmapped = sorted(set(config.envs) - set(config.policies))
    if unmapped:
        raise UsageError(f"envs names {', '.join(unmapped)}, not among the policies ({', '.join(config.policies)})")
    if isinstance(config, SweepConfig):
        _validate_sweep(config)
    if isinstance(config, BenchConfig):
        _validate_bench(config)
    return config


def _validate_sweep(config: SweepConfig) -> None:
    from harness.inference.fault_specs import refuse_absent_cards, refuse_absent_dtypes

    if config.resume is not None:
        check_run_id(config.resume, "--resume")
    refuse_absent_cards(config.faults, config.cards, f"--cards {config.cards}")
    refuse_absent_dtypes(config.faults, config.dtypes)
    config.tolerances  # noqa: B018 (parsed here, so that a bad one is refused before Ray starts)
    config.limits  # noqa: B018


def _validate_bench(config: BenchConfig) -> None:
    from harness.inference.fault_specs import MODEL_KINDS, refuse_absent_cards, refuse_absent_dtypes

    if config.cards is not None and config.card_counts and max(config.card_counts) > config.cards:
        raise UsageError(f"--card-counts {_csv(config.card_counts)!r}: more than --cards {config.cards}")
    refuse_absent_cards(config.faults, config.cards, f"--cards {config.cards}")
    refuse_absent_dtypes(config.faults, config.dtypes)
    for fault in config.faults:
        if fault.kind not in MODEL_KINDS:
            raise UsageError(
                f"--inject-fault {fault}: a bench injects only into its timed path: {', '.join(MODEL_KINDS)}, "
                "e.g. card0:perturb-weight"
            )


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
