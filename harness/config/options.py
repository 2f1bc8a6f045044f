"""Options of `harness sweep` and `harness bench`: one pydantic model per command, the options
they share declared once in `CommonOptions`, which both extend.

Each field is declared with `option` (harness/config/fields.py): its flag, its one-line help, its
bounds and choices, and where the value is a spec, the parser that makes the typed value the run
uses (a `Fault`, a `Tolerance`, the `RatioLimits`, a `Margin`, a precision plan). So the command
line, the TOML file (`--config FILE`), `jobs/sweep.py`, `harness.sweep(**options)`, every `--help`
(defaults included) and the config a run records (`to_json`, what `--resume` reads back) come
from one place. Precedence: the field's default, then the TOML file, then flags given on the
command line. A validated config is what the run reads (harness/config/command_plan.py names it
its plan); `validate` checks what options say about each other, before Ray starts. Light on
purpose: `harness --help` imports this module, and the judge's types (numpy) only where a spec is
parsed.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, PrivateAttr

from harness.config.fields import config_from, given_by_args, option, redefault
from harness.config.precision_plan import KeptFloat32
from harness.devices.precision import PRECISIONS, Precision
from harness.devices.registry import AUTO, auto_help, choices
from harness.dtypes import CARD_DTYPES
from harness.errors import UsageError
from harness.inference.fault_specs import Fault, Strikes, kinds_help, parse_faults
from harness.store.paths import check_output_file, check_results_folder, check_run_id

if TYPE_CHECKING:
    from harness.judge.compare import Tolerance
    from harness.judge.golden import RatioLimits
    from harness.judge.returns import Margin
else:
    # The judge's types import numpy, too heavy for `harness --help`: pydantic sees Any for them,
    # and their fields' parsers, which import them, make them.
    Tolerance = Margin = RatioLimits = Any

DEFAULT_POLICIES = ("cartpole", "huggy-arch")
Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
PLACEMENT_STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
EpisodeBatching = Literal["lockstep", "single"]
EPISODE_BATCHINGS: tuple[EpisodeBatching, ...] = get_args(EpisodeBatching)
PublishedReturn = Literal["gate", "finding"]
PUBLISHED_RETURNS: tuple[PublishedReturn, ...] = get_args(PublishedReturn)
AUTO_EPISODES: Literal["auto"] = "auto"
"""`--episodes auto`: rounds of episodes until every closed-loop verdict is conclusive."""
ActionKindOption = Literal["discrete", "continuous"]
ACTION_KINDS: tuple[ActionKindOption, ...] = get_args(ActionKindOption)
# Seeds feed numpy's and gymnasium's generators and the episodes' int64 seed arrays: a 32-bit
# range is what every one of them takes, and seed + episodes stays far inside int64.
MAX_SEED = 2**32 - 1

Config = TypeVar("Config", bound="CommonOptions")


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


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _margin(value: Any) -> Margin:
    """`--return-margin`: a fraction of the spread (0.5std) or a return (10)."""
    from harness.judge.returns import Margin

    if isinstance(value, Margin):
        return value
    if not isinstance(value, str) and not _number(value):
        raise ValueError("expected a return (10) or a fraction of the spread (0.5std)")
    return Margin.parse(str(value))


def _margin_text(margin: Margin) -> str:
    return f"{margin.absolute!r}" if margin.absolute is not None else f"{margin.fraction!r}std"


def _fault(value: Any) -> Fault:
    """One `--inject-fault` spec, card<N>:KIND or all:KIND."""
    if isinstance(value, Fault):
        return value
    if not isinstance(value, str):
        raise ValueError("expected card<N>:KIND or all:KIND, e.g. card1:perturb-weight")
    [fault] = parse_faults([value])
    return fault


def _tolerance(value: Any) -> tuple[str, Tolerance]:
    """One `--tolerance DTYPE=ATOL,RTOL`: the atol/rtol table of a dtype (its min_cos the fixed table's)."""
    from harness.dtypes import REDUCED_FLOAT32
    from harness.judge.compare import TOLERANCES, Tolerance

    if isinstance(value, tuple):
        return value
    known = (*TOLERANCES, *REDUCED_FLOAT32)
    dtype, _, numbers = str(value).partition("=")
    parts = numbers.split(",")
    try:
        if not isinstance(value, str) or len(parts) != 2 or dtype not in known:
            raise ValueError
        atol, rtol = (float(p) for p in parts)
        return dtype, Tolerance(atol, rtol, TOLERANCES[dtype.split("-")[0]].min_cos)
    except (ValueError, TypeError):
        raise ValueError(f"expected DTYPE=ATOL,RTOL with DTYPE one of {', '.join(known)}, e.g. float16=0.05,0.002") from None


def _tolerance_text(entry: tuple[str, Tolerance]) -> str:
    dtype, tolerance = entry
    return f"{dtype}={tolerance.atol!r},{tolerance.rtol!r}"


def _ratio_limits(value: Any) -> RatioLimits:
    """`--ratio-limits L,M,S`: the port rule's limits for >= 1000, >= 100 and fewer elements."""
    from harness.judge.golden import RatioLimits

    if isinstance(value, RatioLimits):
        return value
    if not isinstance(value, list) or not all(_number(v) for v in value):
        raise ValueError("expected a list of three numbers, e.g. 3,5,10")
    for v in value:
        if not math.isfinite(v):
            raise ValueError(f"{v}: must be a finite number")
    try:
        return RatioLimits(*(float(v) for v in value))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"three limits, for >= 1000, >= 100 and fewer elements, e.g. 3,5,10 ({exc})") from None


def _ratio_limits_list(limits: RatioLimits) -> list[float]:
    return [limits.large, limits.medium, limits.small]


def _kept_float32(value: Any) -> KeptFloat32 | None:
    """`--keep-float32 PLAN`: the plan read, each of its (policy, dtype) keeping a layer."""
    if value is None or isinstance(value, KeptFloat32):
        return value
    if not isinstance(value, str):
        raise ValueError("expected the path of a precision plan `harness diagnose` wrote")
    try:
        return KeptFloat32.read(value)
    except ValueError as exc:
        raise ValueError(f"{exc}; a plan that applies nothing never passes") from None


def _kept_path(kept: KeptFloat32 | None) -> str | None:
    return None if kept is None else kept.path


Count = Annotated[int, Field(ge=1)]
TypedFault = Annotated[Fault, BeforeValidator(_fault), PlainSerializer(str)]
TypedTolerance = Annotated[tuple[str, Tolerance], BeforeValidator(_tolerance), PlainSerializer(_tolerance_text)]


class CommonOptions(BaseModel):
    """What `harness sweep` and `harness bench` both take. Frozen: a validated config is the run's
    plan, read and never changed (`model_copy(update=...)` makes another)."""

    # strict: a TOML file's or a Python call's value is of the field's type (`threads = "2"` is
    # refused, not read as 2); a flag's text is made the field's type first (fields.given_by_args).
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", validate_default=True, defer_build=True)

    policies: list[str] = option(
        "--policy",
        "policy name (cartpole, huggy-arch) or path (.zip, .onnx, .pt, hf://); repeat for several",
        DEFAULT_POLICIES,
        "append",
        metavar="NAME_OR_PATH",
        min_length=1,
    )
    accelerator: str = option("--accelerator", auto_help(), AUTO, choices=choices)
    cards: int | None = option(
        "--cards",
        "number of cards (default: all the cluster has; 2 simulated cards on a private local Ray)",
        None,
        type=int,
        metavar="N",
        ge=1,
    )
    dtypes: list[str] = option(
        "--dtypes", "comma-separated dtypes of the card forward", CARD_DTYPES, "csv", choices=CARD_DTYPES, min_length=1
    )
    batch_sizes: list[Count] = option(
        "--batch-sizes", "comma-separated batch sizes", [1, 8, 4096], "csv", int, metavar="N,N", min_length=1
    )
    seed: int = option("--seed", "seed of every batch, noise draw and episode", 0, type=int, metavar="N", ge=0, le=MAX_SEED)
    threads: int = option(
        "--threads", "torch threads in each actor (bitwise results depend on it)", 1, type=int, metavar="N", ge=1
    )
    results: Path = option("--results", "folder of the Parquet datasets", "results", metavar="DIR", strict=False)
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
        gt=0,
    )
    precision: Precision = option(
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
    action_kind: ActionKindOption | None = option(
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
    junit_xml: str | None = option(
        "--junit-xml",
        "also write the run's gating checks as JUnit XML to this file, for CI systems: a testcase per check, a failure "
        "per failed one, inconclusive ones skipped",
        None,
        metavar="PATH",
    )

    if TYPE_CHECKING:
        # Each command declares its own --inject-fault: their help differs.
        inject_fault: list[Fault]

    def to_json(self) -> str:
        """The config as a run records it (the runs table's config_json, what --resume reads
        back): every option by its TOML key, each spec as its text."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    # The names the run reads (harness/sweep, harness/bench), where they differ from the keys.
    @property
    def common(self) -> CommonOptions:
        """What a sweep and a bench both run with: this config."""
        return self

    @property
    def faults(self) -> list[Fault]:
        return self.inject_fault

    @property
    def recorded(self) -> str:
        return self.to_json()


class SweepConfig(CommonOptions):
    """`harness sweep`: validate policies on every card against each other and the CPU."""

    episodes: Annotated[int | Literal["auto"], BeforeValidator(episode_count)] = option(
        "--episodes",
        "seeded episodes per mode (deterministic, stochastic) and dtype, for every policy with an environment; auto: "
        "rounds of episodes until every closed-loop verdict is conclusive or a cap is reached (--auto-max-episodes, "
        "--auto-max-seconds)",
        4,
        metavar="N|auto",
    )
    return_margin: Annotated[Margin, BeforeValidator(_margin), PlainSerializer(_margin_text)] = option(
        "--return-margin",
        "how much lost return matters to a closed-loop verdict: a fraction of the environment's per-episode spread "
        "(0.5std), or a return (10)",
        "0.5std",
        metavar="Fstd|RETURN",
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
        ge=1,
    )
    auto_max_seconds: float = option(
        "--auto-max-seconds",
        "with --episodes auto: start no further round of episodes after this many seconds of them",
        600.0,
        type=float,
        metavar="S",
        gt=0,
    )
    episode_batching: EpisodeBatching = option(
        "--episode-batching",
        "lockstep: a unit's episodes step together, one batched forward per step; single: batch 1, as a deployed agent runs",
        "lockstep",
        choices=EPISODE_BATCHINGS,
    )
    tolerance: list[TypedTolerance] = option(
        "--tolerance",
        "DTYPE=ATOL,RTOL: the atol/rtol table for a dtype, which then gates every output; repeatable",
        [],
        "append",
        metavar="DTYPE=ATOL,RTOL",
    )
    ratio_limits: Annotated[RatioLimits, BeforeValidator(_ratio_limits), PlainSerializer(_ratio_limits_list)] = option(
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
    published_return: PublishedReturn = option(
        "--published-return",
        "where a policy's published score is known (results.json, a model card's mean_reward, the RL Zoo's benchmark): "
        "gate: fail the run when the CPU float32's returns fall short of it by more than the margin (the environment "
        "or the weights are then not the agent's, and every closed-loop verdict was made in the wrong one); finding: "
        "report it without failing the run",
        "gate",
        choices=PUBLISHED_RETURNS,
    )
    require_published_return: bool = option(
        "--require-published-return",
        "what --published-return gate, the default, does; kept so that older command lines and configs run",
        False,
        "on",
    )
    inject_fault: list[TypedFault] = option(
        "--inject-fault",
        f"fault for negative tests, card<N>:KIND or all:KIND; KIND: {kinds_help()}; repeatable",
        [],
        "append",
        metavar="SPEC",
    )
    hang_timeout: float = option(
        "--hang-timeout",
        "seconds an actor may go without progress (a result back, an episode step) before it counts as hung, if also "
        "10x the longest it went without before; and the least a restarting actor is given to be back; a hung actor "
        "is killed and restarted once, hung again ends the run as incomplete (exit 3)",
        60.0,
        type=float,
        metavar="S",
        gt=0,
    )
    placement: Strategy = option("--placement", "placement group strategy", "PACK", choices=PLACEMENT_STRATEGIES)
    reference_pool: int | None = option(
        "--reference-pool",
        "CPU reference actors sharing its work (default: one per CPU the cluster has left after the cards, 1 to 6); "
        "results are the same whatever the number",
        None,
        type=int,
        metavar="N",
        ge=1,
    )
    keep_float32: Annotated[KeptFloat32 | None, BeforeValidator(_kept_float32), PlainSerializer(_kept_path)] = option(
        "--keep-float32",
        "a precision plan `harness diagnose` wrote: its layers computed in float32 on every card, each planned dtype "
        "judged as any dtype under a label such as float16+fp32[body.0]",
        None,
        metavar="PLAN",
    )
    resume: str | None = option(
        "--resume",
        "run id of an interrupted sweep: run only its missing units, with the run's own options (--hang-timeout and "
        "--max-memory given here apply; any other option that differs from the run's is refused)",
        None,
        metavar="RUN_ID",
    )
    _started_at: str | None = PrivateAttr(None)

    @property
    def margin(self) -> Margin:
        return self.return_margin

    @property
    def tolerances(self) -> dict[str, Tolerance]:
        """The user's tolerance table by dtype (--tolerance DTYPE=ATOL,RTOL)."""
        return dict(self.tolerance)

    @property
    def limits(self) -> RatioLimits:
        return self.ratio_limits

    @property
    def published_gates(self) -> bool:
        """A published score falling short fails the run (--published-return gate)."""
        return self.published_return == "gate"

    @property
    def kept(self) -> Mapping[tuple[str, str], tuple[str, ...]]:
        """--keep-float32: (policy, dtype) -> the layers computed in float32."""
        return {} if self.keep_float32 is None else self.keep_float32.kept

    @property
    def started_at(self) -> str | None:
        """A resumed run's start, as its runs row has it; None for a new run (it starts now)."""
        return self._started_at


class BenchConfig(CommonOptions):
    """`harness bench`: latency, throughput across cards, closed-loop decisions/s, the server scenario."""

    dtypes: list[str] = redefault(CommonOptions, "dtypes", ["float32"])
    batch_sizes: list[Count] = redefault(CommonOptions, "batch_sizes", [1, 8, 256, 4096])
    card_counts: list[Count] | None = option(
        "--card-counts",
        "comma-separated card counts to measure throughput at (default: 1 and --cards)",
        None,
        "csv",
        int,
        metavar="K,K",
        min_length=1,
    )
    windows: int = option(
        "--windows",
        "windows per measurement: each row's figure is their median, with a 95% interval from their order statistics "
        "(at least 6 for one)",
        12,
        type=int,
        metavar="N",
        ge=1,
    )
    window: float = option(
        "--window",
        "seconds per window (a window also holds at least --min-iterations calls)",
        0.15,
        type=float,
        metavar="S",
        gt=0,
    )
    min_iterations: int = option(
        "--min-iterations", "calls per window at least, however long they take", 10, type=int, metavar="N", ge=1
    )
    max_spread: float = option(
        "--max-spread",
        "a row is invalid when its 95% interval spans more than this fraction of its figure (the windows disagree)",
        0.25,
        type=float,
        metavar="F",
        gt=0,
    )
    duration: float | None = option(
        "--duration",
        "a quick look instead: one window of S seconds per measurement (and per server trial); rows say so and are "
        "never valid",
        None,
        type=float,
        metavar="S",
        gt=0,
    )
    latency_bound_ms: float = option(
        "--latency-bound-ms",
        "server scenario: the p99 latency that the highest sustained request rate must stay under",
        20.0,
        type=float,
        metavar="MS",
        gt=0,
    )
    min_queries: int = option(
        "--min-queries",
        "server scenario: requests per trial at least (368 is the fewest whose p99 has a 95% interval)",
        400,
        type=int,
        metavar="N",
        ge=1,
    )
    inject_fault: list[TypedFault] = option(
        "--inject-fault",
        f"fault in the timed path only, card<N>:KIND or all:KIND; KIND: {kinds_help(Strikes.POLICY)}; the audit "
        "against the sweep's path must then fail; repeatable",
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


def config_from_args(args: argparse.Namespace, config_type: type[Config]) -> Config:
    """The command's config from its parsed flags and `--config` file, validated."""
    return validate(config_from(config_type, given_by_args(args, config_type)))


def csv(values: list[Any]) -> str:
    return ",".join(map(str, values))


def validate(config: Config) -> Config:
    """Reject what options say about each other up front, with the bad value and what it may be
    (each option's own type, choices, bounds and spec were checked as the model was made)."""
    check_results_folder(config.results)
    if config.junit_xml is not None:
        check_output_file(Path(config.junit_xml), "--junit-xml")
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
    if config.require_published_return and config.published_return == "finding":
        raise UsageError("--require-published-return and --published-return finding contradict each other: give one")
    if config.resume is not None:
        check_run_id(config.resume, "--resume")
    for policy, dtype in config.kept:
        if policy not in config.policies or dtype not in config.dtypes:
            assert config.keep_float32 is not None
            raise UsageError(
                f"--keep-float32 {config.keep_float32.path}: its plan for {policy} {dtype} does not apply to this sweep "
                f"(--policy {' '.join(config.policies)}, --dtypes {','.join(config.dtypes)}); a plan never applied "
                "never passes"
            )


def _validate_bench(config: BenchConfig) -> None:
    if config.cards is not None and config.card_counts and max(config.card_counts) > config.cards:
        raise UsageError(f"--card-counts {csv(config.card_counts)!r}: more than --cards {config.cards}")
