"""The options of every command, declared once: their flags, defaults and choices held to what
they were (tests/data/options.json, made from the parser), and one field added to a model is a
flag, a TOML key, a help line and a recorded config value."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness.cli import Parser
from harness.config.fields import Given, add_arguments, config_from, given_by_mapping, option
from harness.config.options import SweepConfig, config_from_args
from harness.errors import UsageError

EXPECTED = Path(__file__).parent / "data" / "options.json"
# sweep's and bench's flags leave their default to the model (argparse.SUPPRESS, so that a TOML
# file can fill them) and show it at the end of their help, as "(default: ...)".
SHOWN_DEFAULT = re.compile(r"\(default: (.*)\)$")


def declared(parser: argparse.ArgumentParser) -> dict[str, dict[str, dict[str, Any]]]:
    """Each command's options as its parser declares them."""
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: options_of(command) for name, command in sorted(sub.choices.items())}


def options_of(command: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """By flag (or positional), the metavar, the default, the choices, how many values it takes
    and what it does with them."""
    found: dict[str, dict[str, Any]] = {}
    for action in command._actions:
        if action.default is argparse.SUPPRESS:
            shown = SHOWN_DEFAULT.search(action.help or "")
            default = shown.group(1) if shown else None
        else:
            default = repr(action.default)
        found[" ".join(action.option_strings) or action.dest] = {
            "metavar": list(action.metavar) if isinstance(action.metavar, tuple) else action.metavar,
            "default": default,
            "choices": None if action.choices is None else [str(c) for c in action.choices],
            "nargs": action.nargs,
            "action": type(action).__name__,
        }
    return found


def test_every_command_keeps_its_options_their_defaults_and_choices() -> None:
    """Scripts and jobs depend on the flags: a flag renamed, dropped, or given another default or
    choices fails here (tests/data/options.json was made from the parser before the options
    moved to pydantic)."""
    from harness.cli import build_parser

    expected = json.loads(EXPECTED.read_text())
    found = declared(build_parser())
    assert sorted(found) == sorted(expected)
    for command in expected:
        assert found[command] == expected[command], command


def test_the_ray_job_takes_the_sweep_s_options() -> None:
    from harness.cli import build_parser
    from jobs.sweep import parser

    assert options_of(parser()) == declared(build_parser())["sweep"]


def test_a_changed_default_fails_the_held_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above sees a default that moved (the fault it guards against, injected)."""
    from harness.cli import build_parser
    from harness.config.options import SweepConfig

    monkeypatch.setattr(SweepConfig.model_fields["threads"], "default", 2)
    assert declared(build_parser())["sweep"]["--threads"]["default"] == "2"
    assert declared(build_parser())["sweep"] != json.loads(EXPECTED.read_text())["sweep"]


class ToyConfig(SweepConfig):
    """A sweep with one option more, declared as every option is: one field."""

    toy_level: int = option("--toy-level", "how much of a toy the run is", 3, type=int, metavar="N", ge=1)


def _toy(*args: str) -> ToyConfig:
    parser = Parser(prog="toy")
    add_arguments(parser, ToyConfig)
    return config_from_args(parser.parse_args(list(args)), ToyConfig)


def test_one_field_is_a_flag_a_toml_key_a_help_line_and_a_recorded_value(tmp_path: Path) -> None:
    parser = Parser(prog="toy")
    add_arguments(parser, ToyConfig)
    assert "--toy-level N how much of a toy the run is (default: 3)" in " ".join(parser.format_help().split())
    results = ("--results", str(tmp_path))
    assert _toy(*results).toy_level == 3
    assert _toy(*results, "--toy-level", "5").toy_level == 5
    toml = tmp_path / "toy.toml"
    toml.write_text("toy_level = 7\n")
    assert _toy(*results, "--config", str(toml)).toy_level == 7
    assert _toy(*results, "--config", str(toml), "--toy-level", "8").toy_level == 8, "a flag wins over the file"
    config = _toy(*results, "--toy-level", "5")
    assert json.loads(config.to_json())["toy_level"] == 5
    again = config_from(ToyConfig, Given(json.loads(config.to_json()), {}))
    assert again == config, "what a run records reads back as the same config (--resume)"
    assert config_from(ToyConfig, given_by_mapping(ToyConfig, {"toy_level": 4}, "toy()")).toy_level == 4
    with pytest.raises(UsageError, match=r"^--toy-level 0: must be at least 1$"):
        _toy(*results, "--toy-level", "0")
    toml.write_text('toy_level = "7"\n')
    with pytest.raises(UsageError, match=r"toy.toml: toy_level must be an int, got '7'$"):
        _toy(*results, "--config", str(toml))
