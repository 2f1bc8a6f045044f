"""One `Registry[T]` (harness/registry.py) for commands, policy formats, accelerators, check kinds
and fault kinds: a name taken twice is refused, a name not found is a usage mistake naming the nearest."""

from __future__ import annotations

import pytest

from harness import devices
from harness.cli import COMMANDS, build_parser
from harness.errors import UsageError
from harness.inference.fault_specs import FAULTS, register_fault
from harness.judge.kinds import CheckKind
from harness.judge.results import KINDS, read_result
from harness.policies import registry as policies
from harness.policies.sb3_zip import Sb3Zip
from harness.registry import Registry
from tests.helpers import harness


def test_a_registry_keeps_order_refuses_a_duplicate_and_suggests_the_nearest() -> None:
    colours: Registry[int] = Registry("colour", {"red": 1, "green": 2})
    colours.register("blue", 3, before="green")
    assert (
        colours.names() == ("red", "blue", "green")
        and colours.values() == (1, 3, 2)
        and list(colours) == list(colours.names())
    )
    with pytest.raises(ValueError, match="colour 'red' is registered already"):
        colours.register("red", 9)
    assert colours.get("red") == 1, "a refused duplicate replaces nothing"
    with pytest.raises(UsageError, match=r"^colour 'gren' is not one of red, blue, green; did you mean 'green'\?$"):
        colours.get("gren")
    with pytest.raises(UsageError, match=r"^colour 'purple' is not one of red, blue, green$"):
        colours.get("purple")
    with colours.registered("purple", 4):
        assert colours.get("purple") == 4
    assert "purple" not in colours and len(colours) == 3
    with pytest.raises(ValueError, match="needs a name"):
        colours.register("", 0)


def test_the_commands_are_the_parser_s_and_a_misspelt_one_is_exit_2_naming_the_nearest() -> None:
    parser = build_parser()
    [sub] = [a for a in parser._actions if a.dest == "command"]
    assert list(sub.choices or {}) == list(COMMANDS.names())
    proc = harness("swep")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "harness: error: command 'swep' is not one of info, sweep, bench, query, report, export-onnx, diagnose, repro, up, "
        "down; did you mean 'sweep'?"
    ]


def test_a_policy_format_or_accelerator_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="policy format 'sb3-zip' is registered already"):
        policies.register_format(Sb3Zip)
    assert policies.FORMATS.names() == ("sb3-zip", "onnx", "mlagents-pt", "torchscript")
    with pytest.raises(ValueError, match="--accelerator 'cuda' is registered already"):
        devices.register("cuda", "harness.devices.cuda:Cuda")
    with pytest.raises(UsageError, match=r"unknown policy 'cartpol': did you mean 'cartpole'\?"):
        policies.load_source(policies.PolicySpec("cartpol"))


def test_a_fault_kind_registered_twice_is_refused_and_a_misspelt_one_named() -> None:
    with pytest.raises(ValueError, match="fault kind 'hang' is registered already"):
        register_fault(FAULTS.get("hang"))
    assert FAULTS.names()[-2:] == ("hang-once", "hang")
    with pytest.raises(UsageError, match=r"fault kind 'hnag' is not one of .*; did you mean 'hang'\?"):
        FAULTS.get("hnag")


def test_a_check_kind_is_found_by_name_and_an_unknown_one_named() -> None:
    assert KINDS.names() == tuple(CheckKind)
    with pytest.raises(UsageError, match=r"check kind 'cpu_referense' is not one of .*; did you mean 'cpu_reference'\?"):
        read_result({"kind": "cpu_referense"})
