"""Files beside a policy that say more about it than the policy file itself.

Two layouts are known. The RL Zoo (`rl_zoo3 train`, DLR-RM/rl-trained-agents) writes
`<dir>/<Env>.zip` with a run folder `<dir>/<Env>/` beside it: `args.yml` (its `env` is the
environment id), `config.yml` and, when it trained with VecNormalize, `vecnormalize.pkl`. A
Hugging Face SB3 repository has the zip at its root with `README.md` (the model card, whose YAML
front matter names the environment) and `vec_normalize.pkl` beside it; the local cache snapshot
keeps that layout, as symlinks, so paths here are never resolved.

A file that is absent says nothing; one that is present but unreadable (a folder or a FIFO of
that name included) is a PolicyLoadError.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.errors import PolicyLoadError
from harness.files import read_start, read_whole

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
ZOO_VECNORMALIZE = "vecnormalize.pkl"
HF_CARD = "README.md"
HF_VECNORMALIZE = "vec_normalize.pkl"


@dataclass(frozen=True)
class EnvFound:
    """An environment id a file beside the policy names, and which file that was."""

    env_id: str
    source: str  # e.g. "RL Zoo CartPole-v1/args.yml", "model card README.md"


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


def find_env(policy: Path) -> EnvFound | None:
    """The environment the RL Zoo's args.yml or else the model card beside `policy` names."""
    args = rl_zoo_dir(policy) / ZOO_ARGS
    if args.exists():
        return EnvFound(_args_env(args), f"RL Zoo {args.relative_to(policy.parent)}")
    card = policy.parent / HF_CARD
    if card.exists():
        env = model_card_env(card)
        return EnvFound(env, f"model card {HF_CARD}") if env is not None else None
    return None


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
    front = _front_matter(card)
    if front is None:
        return None
    text, first_line = front
    meta = _load_yaml(card, text, yaml.SafeLoader, first_line)
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise PolicyLoadError(card, f"front matter is YAML but not a mapping ({type(meta).__name__})")
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
