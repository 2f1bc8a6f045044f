"""Files beside a policy that say more about it than the policy file itself.

Two layouts are known. The RL Zoo (`rl_zoo3 train`, DLR-RM/rl-trained-agents) writes
`<dir>/<Env>.zip` with a run folder `<dir>/<Env>/` beside it: `args.yml` (its `env` is the
environment id, its `env_kwargs` what `gym.make` was given), `config.yml` (the hyperparameters,
among them `env_wrapper` and `frame_stack`) and, when it trained with VecNormalize,
`vecnormalize.pkl`. A Hugging Face SB3 repository has the zip at its root with `README.md` (the
model card, whose YAML front matter names the environment and the score it was published with)
and `vec_normalize.pkl` beside it; one that `rl_zoo3.push_to_hub` wrote also holds the run files
(`args.yml`, `config.yml`, `env_kwargs.yml`) and `results.json` (the evaluation behind the score)
at its root. The local cache snapshot keeps that layout, as symlinks, so paths here are never
resolved. A run file is looked for in the RL Zoo's run folder first, then beside the zip.

The RL Zoo publishes its agents' scores in its `benchmark.md`, not beside each agent: that table
ships with the harness (data/rl_zoo_benchmark.tsv) and scores an agent that has none beside it.

A file that is absent says nothing; one that is present but unreadable (a folder or a FIFO of
that name included) is a PolicyLoadError.
"""

from __future__ import annotations

import codecs
import csv
import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.errors import PolicyLoadError
from harness.files import json_value, read_start, read_whole

# What is parsed as YAML: a run file, a model card's front matter. Real ones are a few kilobytes;
# PyYAML's SafeLoader parses about a megabyte a second, and each actor loads the policy again.
MAX_YAML_BYTES = 64 * 1024
# A model card's prose may run long: only this much of its start is read, to find the front matter.
MAX_CARD_BYTES = 1024 * 1024

# The tag the RL Zoo's YAML carries: it dumps `OrderedDict`s with PyYAML's default Dumper.
ORDERED_DICT_TAG = "tag:yaml.org,2002:python/object/apply:collections.OrderedDict"

# An id as gymnasium spells them: an optional namespace, then the name ("seals/CartPole-v0").
ENV_ID = re.compile(r"(?:[\w.:-]+/)?[\w.:-]+")
# A model card's tags also name the library and the task; the environment's has a version.
ENV_TAG = re.compile(r"(?:[\w.:-]+/)?[\w.:-]+-v\d+")

# A model card's front matter as huggingface_hub.repocard finds it, and its opening line. Its
# pattern, `^\s*---[\r\n]+([\S\s]*?)[\r\n]+---(?:\r\n|\n|$)`, backtracks through a run of
# newlines in time that grows with its square (40,000 of them: 4 s); here the opening is possessive
# and the closing starts a run, which finds the same YAML in linear time.
FRONT_MATTER = re.compile(r"^\s*+---[\r\n]++([\S\s]*?)(?<![\r\n])[\r\n]+---(?:\r\n|\n|$)")
FRONT_MATTER_OPENS = re.compile(r"^\s*+---[\r\n]")

ZOO_ARGS = "args.yml"
ZOO_CONFIG = "config.yml"
ZOO_ENV_KWARGS = "env_kwargs.yml"
ZOO_VECNORMALIZE = "vecnormalize.pkl"
HF_CARD = "README.md"
HF_RESULTS = "results.json"
HF_VECNORMALIZE = "vec_normalize.pkl"
RL_ZOO_BENCHMARK = Path(__file__).parent / "data" / "rl_zoo_benchmark.tsv"

# A model card's score as huggingface_sb3 writes it: f"{mean_reward:.2f} +/- {std_reward:.2f}".
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
MEAN_STD = re.compile(rf"\s*({NUMBER})\s*\+/-\s*({NUMBER})\s*")
# `render_mode` in env_kwargs says how a person watched the agent, not what it plays.
NOT_THE_TASK = frozenset({"render_mode"})

Scalar = str | int | float | bool | None
Value = Scalar | tuple[Scalar, ...]
Kwargs = tuple[tuple[str, Value], ...]
"""Keyword arguments as a run file gives them, in its order: scalars, or lists of scalars as tuples
(YAML has no tuples; a wrapper's `shape: [64, 64]` means one), so that a setup can be hashed."""


@dataclass(frozen=True)
class Wrapper:
    """One gymnasium wrapper the RL Zoo wraps each environment in (`env_wrapper`): the class's
    dotted path, as the run file names it, and its keyword arguments."""

    path: str
    kwargs: Kwargs = ()

    def describe(self) -> str:
        return self.path + (f"({_describe_kwargs(self.kwargs)})" if self.kwargs else "")


@dataclass(frozen=True)
class EnvSetup:
    """How the environment is made beyond its id, as the RL Zoo makes it (`create_test_env`):
    `gym.make(env_id, **kwargs)`, each wrapper in order around it, then `frame_stack` frames
    stacked (SB3's VecFrameStack). `source` names the files that said so."""

    kwargs: Kwargs = ()
    wrappers: tuple[Wrapper, ...] = ()
    frame_stack: int = 0
    source: str = ""

    @property
    def plain(self) -> bool:
        return not (self.kwargs or self.wrappers or self.frame_stack)

    def describe(self) -> str:
        """e.g. "continuous=True; wrappers AtariWrapper(terminal_on_life_loss=False); frame_stack 4"."""
        parts = [_describe_kwargs(self.kwargs)] if self.kwargs else []
        if self.wrappers:
            parts.append("wrappers " + ", ".join(w.describe() for w in self.wrappers))
        if self.frame_stack:
            parts.append(f"frame_stack {self.frame_stack}")
        return "; ".join(parts)


PLAIN = EnvSetup()
"""An environment made from its id alone."""


@dataclass(frozen=True)
class PublishedScore:
    """The mean episode return a policy was published with, and how it was measured."""

    mean: float
    std: float
    deterministic: bool  # SB3's evaluate_policy with deterministic actions (RL Zoo: all but Atari)
    n_episodes: int | None  # None where the file does not say
    source: str  # e.g. "model card README.md: mean_reward 500.00 +/- 0.00"

    def describe(self) -> dict[str, object]:
        return {
            "mean": self.mean,
            "std": self.std,
            "deterministic": self.deterministic,
            "n_episodes": self.n_episodes,
            "source": self.source,
        }


@dataclass(frozen=True)
class EnvFound:
    """An environment id a file beside the policy names, and which file that was; how the files
    say to make it, and the score the policy was published with on it."""

    env_id: str
    source: str  # e.g. "RL Zoo CartPole-v1/args.yml", "model card README.md"
    setup: EnvSetup = PLAIN
    published: PublishedScore | None = None


class _RunFileLoader(yaml.SafeLoader):
    """SafeLoader plus the one tag the RL Zoo writes; every other python/ tag is still refused."""


def _ordered_dict(loader: yaml.SafeLoader, node: yaml.Node) -> dict[Any, Any]:
    # The node is `[[[key, value], ...]]`: OrderedDict's constructor arguments, a list of pairs.
    if not isinstance(node, yaml.SequenceNode) or len(node.value) != 1:
        raise yaml.constructor.ConstructorError(None, None, "OrderedDict arguments are not [pairs]", node.start_mark)
    pairs = loader.construct_sequence(node.value[0], deep=True)
    if not all(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) for pair in pairs):
        raise yaml.constructor.ConstructorError(None, None, "OrderedDict pairs are not [name, value]", node.start_mark)
    return {key: value for key, value in pairs}


_RunFileLoader.add_constructor(ORDERED_DICT_TAG, _ordered_dict)


def find_env(policy: Path, trained_steps: int | None = None) -> EnvFound | None:
    """The environment the RL Zoo's args.yml or else the model card beside `policy` names, how
    the run files say to make it, and the score results.json or the model card states, else the
    RL Zoo's benchmark table states for an agent trained `trained_steps` (the save's own count)."""
    args = run_file(policy, ZOO_ARGS)
    card = policy.parent / HF_CARD
    if args is not None:
        env_id, source = _args_env(args), f"RL Zoo {args.relative_to(policy.parent)}"
    elif card.exists() and (named := model_card_env(card)) is not None:
        env_id, source = named, f"model card {HF_CARD}"
    else:
        return None
    published = published_score(policy) or rl_zoo_score(policy, args, env_id, trained_steps)
    return EnvFound(env_id, source, env_setup(policy, args), published)


def run_file(policy: Path, name: str) -> Path | None:
    """The RL Zoo run file `name` of `policy`: in its run folder, else beside it (a Hugging Face
    repository that rl_zoo3 pushed); None where neither holds one."""
    return next((path for path in (rl_zoo_dir(policy) / name, policy.parent / name) if path.exists()), None)


def env_setup(policy: Path, args: Path | None) -> EnvSetup:
    """What the run files beside `policy` say about making its environment: `env_kwargs` from
    args.yml (else env_kwargs.yml, where the hub's copy keeps them), `env_wrapper` and
    `frame_stack` from config.yml. The RL Zoo's `vec_env_wrapper` is refused: it wraps the
    vectorized environment in a class of its own, which this harness does not replay."""
    sources = []
    kwargs: Kwargs = ()
    kwargs_file = args if args is not None else run_file(policy, ZOO_ENV_KWARGS)
    if kwargs_file is not None:
        data = read_run_file(kwargs_file)
        raw = data.get("env_kwargs") if kwargs_file.name == ZOO_ARGS else data
        kwargs = tuple((k, v) for k, v in _kwargs(kwargs_file, "env_kwargs", raw) if k not in NOT_THE_TASK)
        if kwargs:
            sources.append(str(kwargs_file.relative_to(policy.parent)))
    wrappers: tuple[Wrapper, ...] = ()
    frame_stack = 0
    config = run_file(policy, ZOO_CONFIG)
    if config is not None:
        hyperparams = read_run_file(config)
        if hyperparams.get("vec_env_wrapper") is not None:
            shown = _shown_value(hyperparams["vec_env_wrapper"])
            raise PolicyLoadError(config, f"vec_env_wrapper {shown} is not replayed by this harness (env_wrapper is)")
        wrappers = _wrappers(config, hyperparams.get("env_wrapper"))
        frame_stack = _frame_stack(config, hyperparams.get("frame_stack", 0))
        if wrappers or frame_stack:
            sources.append(str(config.relative_to(policy.parent)))
    return EnvSetup(kwargs, wrappers, frame_stack, ", ".join(sources))


def _kwargs(path: Path, what: str, raw: Any) -> Kwargs:
    """A mapping of keyword arguments from a run file, each value a scalar or a list of them."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        raise PolicyLoadError(path, f"{what} is {_shown_value(raw)}, expected a mapping of names to values")
    pairs = []
    for key, value in raw.items():
        if isinstance(value, list) and all(_is_scalar(v) for v in value):
            value = tuple(value)
        elif not _is_scalar(value):
            raise PolicyLoadError(path, f"{what} {key} is {_shown_value(value)}: only numbers, strings and lists of them")
        pairs.append((key, value))
    return tuple(pairs)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _wrappers(path: Path, raw: Any) -> tuple[Wrapper, ...]:
    """`env_wrapper` as rl_zoo3's get_wrapper_class reads it: a class path, or a list of class
    paths and one-key mappings {class path: its keyword arguments}, innermost first."""
    if raw is None:
        return ()
    found = []
    for item in raw if isinstance(raw, list) else [raw]:
        if isinstance(item, dict) and len(item) == 1:
            [(name, kwargs)] = item.items()
        else:
            name, kwargs = item, None
        if not isinstance(name, str) or not ENV_ID.fullmatch(name) or "/" in name:
            raise PolicyLoadError(path, f"env_wrapper {_shown_value(item)} is not a class path such as a.b.Wrapper")
        found.append(Wrapper(name, _kwargs(path, f"env_wrapper {name}", kwargs)))
    return tuple(found)


def _frame_stack(path: Path, raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise PolicyLoadError(path, f"frame_stack is {_shown_value(raw)}, expected a count of frames")
    return raw


def published_score(policy: Path) -> PublishedScore | None:
    """The score beside `policy`: results.json (the evaluation rl_zoo3 and huggingface_sb3 wrote
    when they published it, at full precision and with its mode), else the model card's
    `mean_reward` metric. None where neither states one."""
    results = policy.parent / HF_RESULTS
    if results.exists():
        return _results_score(results)
    card = policy.parent / HF_CARD
    return model_card_score(card) if card.exists() else None


@dataclass(frozen=True)
class RlZooBenchmark:
    """The RL Zoo's benchmark table (data/rl_zoo_benchmark.tsv): its rows by (algorithm, env id),
    and where it was taken from ("DLR-RM/rl-baselines3-zoo@0088472")."""

    origin: str
    rows: dict[tuple[str, str], dict[str, str]]

    def score(self, algo: str, env_id: str, trained_steps: int | None) -> PublishedScore | None:
        """The row of `algo` on `env_id`, where the save was trained for the steps the row's agent
        was (`n_timesteps`, which SB3 saves as `_total_timesteps`): a run of its own, an
        untrained or a retrained agent is not the one the table scored."""
        row = self.rows.get((algo, env_id))
        if row is None or trained_steps != _steps(row["n_timesteps"]):
            return None
        mean, std, episodes = row["mean_reward"], row["std_reward"], row["eval_episodes"]
        return PublishedScore(
            float(mean),
            float(std),
            row["deterministic"] == "true",
            int(episodes),
            f"RL Zoo benchmark.md ({self.origin}): {algo} {env_id} {mean} +/- {std} over {episodes} episodes",
        )


def _steps(text: str) -> int:
    """A count of steps as the table prints it: "20k", "1M", "150000"."""
    found = re.fullmatch(r"(\d+)([kM]?)", text)
    assert found is not None, f"{RL_ZOO_BENCHMARK}: n_timesteps {text!r}"
    return int(found.group(1)) * {"": 1, "k": 10**3, "M": 10**6}[found.group(2)]


@functools.cache
def rl_zoo_benchmark() -> RlZooBenchmark:
    """The table as shipped: `# key: value` lines say where it is from, then a header and its rows."""
    lines = RL_ZOO_BENCHMARK.read_text(encoding="utf-8").splitlines()
    facts = dict(line[2:].split(": ", 1) for line in lines if line.startswith("# ") and ": " in line)
    table = csv.DictReader([line for line in lines if not line.startswith("#")], delimiter="\t")
    rows = {(row["algo"], row["env_id"]): row for row in table}
    return RlZooBenchmark(f"{facts['repository']}@{facts['commit'][:7]}", rows)


def rl_zoo_score(policy: Path, args: Path | None, env_id: str, trained_steps: int | None) -> PublishedScore | None:
    """The RL Zoo's benchmark score of the agent `policy` on `env_id`. Its algorithm is args.yml's
    `algo`, else the folder the RL Zoo's layout `<algo>/<Env>_<n>/<Env>.zip` puts it in. None where
    neither names one, or the table has no row for that algorithm and environment trained as long."""
    named = read_run_file(args).get("algo") if args is not None else None
    algo = named if isinstance(named, str) else rl_zoo_algo(policy)
    return rl_zoo_benchmark().score(algo, env_id, trained_steps) if algo is not None else None


def rl_zoo_algo(policy: Path) -> str | None:
    """`<algo>` of the RL Zoo's layout `<algo>/<Env>_<n>/<Env>.zip`; None for a file laid out otherwise."""
    run = policy.parent
    if re.fullmatch(rf"{re.escape(policy.stem)}_\d+", run.name) and run.parent.name:
        return run.parent.name
    return None


def _results_score(path: Path) -> PublishedScore:
    try:
        data = json_value(_decode(path, read_whole(path, MAX_YAML_BYTES, "a results file", PolicyLoadError)))
    except json.JSONDecodeError as exc:
        raise PolicyLoadError(path, f"is not JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:
        raise PolicyLoadError(path, str(exc)) from None
    fields = data if isinstance(data, dict) else {}
    mean, std = _number(fields.get("mean_reward")), _number(fields.get("std_reward"))
    if mean is None or std is None:
        raise PolicyLoadError(path, "has no numeric mean_reward and std_reward (expected huggingface_sb3's results.json)")
    episodes = fields.get("n_eval_episodes")
    return PublishedScore(
        mean,
        std,
        fields.get("is_deterministic", True) is not False,
        episodes if isinstance(episodes, int) and not isinstance(episodes, bool) else None,
        f"{HF_RESULTS}: mean_reward {mean:.6g}, std_reward {std:.6g}",
    )


def _number(value: Any) -> float | None:
    """A finite number from a JSON file; None for anything else (a bool is no number here)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def model_card_score(card: Path) -> PublishedScore | None:
    """The model card's `model-index[].results[].metrics[]` of type mean_reward, as
    "MEAN +/- STD" (what huggingface_sb3 and rl_zoo3 write); None where the card states none."""
    meta = _card_meta(card)
    for model in _dicts(meta.get("model-index") if meta else None):
        for result in _dicts(model.get("results")):
            for metric in _dicts(result.get("metrics")):
                if metric.get("type") != "mean_reward":
                    continue
                value = metric.get("value")
                found = MEAN_STD.fullmatch(value) if isinstance(value, str) else None
                if found is None:
                    shown = _shown_value(value)
                    raise PolicyLoadError(card, f"model-index mean_reward is {shown}, expected 'MEAN +/- STD'")
                mean, std = float(found.group(1)), float(found.group(2))
                return PublishedScore(mean, std, True, None, f"model card {HF_CARD}: mean_reward {found.group(0).strip()}")
    return None


def _shown_value(value: Any) -> str:
    """A value from a run file or card, made safe for a one-line message."""
    text = ascii(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _describe_kwargs(kwargs: Kwargs) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs)


def find_vecnormalize(policy: Path) -> Path | None:
    """The VecNormalize statistics saved with `policy`: RL Zoo run folder first, then HF layout."""
    for stats in (rl_zoo_dir(policy) / ZOO_VECNORMALIZE, policy.parent / HF_VECNORMALIZE):
        if stats.exists():
            return stats
    return None


def rl_zoo_dir(policy: Path) -> Path:
    """The RL Zoo run folder of `<dir>/<Env>.zip`: `<dir>/<Env>/`."""
    return policy.parent / policy.stem


def _args_env(args: Path) -> str:
    env = read_run_file(args).get("env")
    if isinstance(env, str) and ENV_ID.fullmatch(env):
        return env
    if env is None:
        shown = "missing"
    else:
        shown = ascii(env[:100]) if isinstance(env, str) else f"a {type(env).__name__}"
    raise PolicyLoadError(args, f"env is {shown}, expected an environment id such as CartPole-v1")


def read_run_file(path: Path) -> dict[str, Any]:
    """An RL Zoo args.yml or config.yml as a dict; PolicyLoadError if it is not one."""
    data = _load_yaml(path, _decode(path, read_whole(path, MAX_YAML_BYTES, "a run file", PolicyLoadError)), _RunFileLoader)
    if not isinstance(data, dict):
        raise PolicyLoadError(path, f"is YAML but not a mapping ({type(data).__name__})")
    return data


def model_card_env(card: Path) -> str | None:
    """The environment a model card's front matter names: `model-index[].results[].dataset.name`,
    else the first tag that looks like an environment id. None when the card names none."""
    meta = _card_meta(card)
    if meta is None:
        return None
    for model in _dicts(meta.get("model-index")):
        for result in _dicts(model.get("results")):
            dataset = result.get("dataset")
            name = dataset.get("name") if isinstance(dataset, dict) else None
            if isinstance(name, str) and ENV_ID.fullmatch(name):
                return name
    tags = meta.get("tags")
    if not isinstance(tags, list):
        return None
    return next((t for t in tags if isinstance(t, str) and ENV_TAG.fullmatch(t)), None)


def _card_meta(card: Path) -> dict[str, Any] | None:
    """A model card's front matter as a mapping; None where the card has none."""
    front = _front_matter(card)
    if front is None:
        return None
    text, first_line = front
    meta = _load_yaml(card, text, yaml.SafeLoader, first_line)
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise PolicyLoadError(card, f"front matter is YAML but not a mapping ({type(meta).__name__})")
    return meta


def _front_matter(card: Path) -> tuple[str, int] | None:
    """A card's front matter and the line it starts on; None where the card has none. Refused
    unparsed past MAX_YAML_BYTES, also where it does not end in the part of the card read."""
    raw = read_start(card, MAX_CARD_BYTES, "a model card", PolicyLoadError)
    cut = len(raw) > MAX_CARD_BYTES
    text = _decode(card, raw[:MAX_CARD_BYTES], final=not cut)
    found = FRONT_MATTER.match(text)
    if found is None and cut and FRONT_MATTER_OPENS.match(text):
        raise PolicyLoadError(
            card, f"front matter does not end in the first {MAX_CARD_BYTES} bytes: over the {MAX_YAML_BYTES} byte limit"
        )
    if found is None:
        return None
    size = len(found.group(1).encode())
    if size > MAX_YAML_BYTES:
        raise PolicyLoadError(card, f"front matter is {size} bytes, over the {MAX_YAML_BYTES} byte limit")
    return found.group(1), text[: found.start(1)].count("\n") + 1


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The mappings in a list field of the card; a field of another shape names nothing."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _decode(path: Path, raw: bytes, final: bool = True) -> str:
    """UTF-8 text. Not `final` where the read was cut: a character cut in two there is dropped."""
    try:
        return codecs.getincrementaldecoder("utf-8")().decode(raw, final=final)
    except UnicodeDecodeError as exc:
        raise PolicyLoadError(path, f"is not UTF-8 text (byte {exc.start})") from None


def _load_yaml(path: Path, text: str, loader: type[yaml.SafeLoader], first_line: int = 1) -> Any:
    """`text` parsed by `loader`; errors give the file's line number (`text` starts at `first_line`)."""
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + first_line}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise PolicyLoadError(path, f"is not readable YAML ({' '.join(str(problem).split())}{where})") from None
    except RecursionError:
        raise PolicyLoadError(path, "is YAML nested too deeply to read") from None
