"""Options of `harness sweep` and `harness bench`: one dataclass per command, the options they
share declared once in `CommonOptions`, which both embed.

Each field is declared with `option` (harness/config/fields.py): its flag and one-line help,
so the command line, the TOML file (`--config FILE`), `jobs/sweep.py` and every `--help` (defaults
included) come from one place, as CleanRL's `Args` does. Precedence: the field's default, then the
TOML file, then flags given on the command line. Values are checked in `validate`, before Ray
starts, with the bad value and a valid example; the specs among them (faults, tolerances, ratio
limits, the return margin, a precision plan) are parsed once, into the typed plan the run reads
(harness/config/command_plan.py). A config stays what the user wrote: it is what a run records and
what --resume reads back. Light on purpose: `harness --help` imports this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from harness.devices.registry import AUTO, auto_help, choices
from harness.devices.precision import PRECISIONS, Precision
from harness.dtypes import CARD_DTYPES
from harness.errors import UsageError
from harness.config.fields import meta_of, option, redefault, values_from_args
from harness.store.paths import check_output_file, check_results_folder, check_run_id

if TYPE_CHECKING:
    from harness.policies.base import ActionKind

DEFAULT_POLICIES = ("cartpole", "huggy-arch")
Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
PLACEMENT_STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
EpisodeBatching = Literal["lockstep", "single"]
EPISODE_BATCHINGS: tuple[EpisodeBatching, ...] = get_args(EpisodeBatching)
PublishedReturn = Literal["gate", "finding"]
PUBLISHED_RETURNS: tuple[PublishedReturn, ...] = get_args(PublishedReturn)
AUTO_EPISODES: Literal["auto"] = "auto"
"""`--episodes auto`: rounds of episodes until every closed-loop verdict is conclusive."""
ACTION_KINDS = ("discrete", "continuous")
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
    junit_xml: str | None = option(
        "--junit-xml",
        "also write the run's gating checks as JUnit XML to this file, for CI systems: a testcase per check, a failure "
        "per failed one, inconclusive ones skipped",
        None,
        metavar="PATH",
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
    episode_batching: EpisodeBatching = option(
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
        "seconds an actor may go without progress (a result back, an episode step) before it counts as hung, if also "
        "10x the longest it went without before; and the least a restarting actor is given to be back; a hung actor "
        "is killed and restarted once, hung again ends the run as incomplete (exit 3)",
        60.0,
        type=float,
        metavar="S",
        above=0,
    )
    placement: Strategy = option("--placement", "placement group strategy", "PACK", choices=PLACEMENT_STRATEGIES)
    reference_pool: int | None = option(
        "--reference-pool",
        "CPU reference actors sharing its work (default: one per CPU the cluster has left after the cards, 1 to 6); "
        "results are the same whatever the number",
        None,
        type=int,
        metavar="N",
        at_least=1,
    )
    keep_float32: str | None = option(
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


def config_from_args(args: argparse.Namespace, config_type: type[Config]) -> Config:
    """The command's config from its parsed flags and `--config` file, validated."""
    return validate(config_type(**values_from_args(args, config_type)))


def csv(values: list[Any]) -> str:
    return ",".join(map(str, values))


def validate(config: Config) -> Config:
    """Reject bad values up front, with the bad value and what it may be: first each option by
    its own choices and bounds, then what options say about each other. The specs are checked
    where they are parsed, into the command's plan (harness/config/command_plan.py)."""
    for f in dataclasses.fields(config):
        meta_of(f).check(getattr(config, f.name))
    check_results_folder(Path(config.results))
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


def _validate_bench(config: BenchConfig) -> None:
    if config.cards is not None and config.card_counts and max(config.card_counts) > config.cards:
        raise UsageError(f"--card-counts {csv(config.card_counts)!r}: more than --cards {config.cards}")
