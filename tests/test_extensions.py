"""Each kind of extension has one place (docs/architecture.md, "Where to add each kind of thing"):
a toy of each added there, and nothing else, works. Accelerators, policy formats, fault kinds and
commands are registries, so their toys are registered from this test and put back after it; a
check kind (an enum member that mypy holds every `match` to) and an option (a field of the
command's config) are lines in the code, so theirs are added to a copy of it."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.policy_actor import PolicyActor
from harness import devices
import harness.cli
from harness.config.command_plan import bench_plan
from harness.config.options import BenchConfig, SweepConfig, validate
from harness.devices.cpu import SimulatedCpu, cpu_reference
from harness.errors import UsageError
from harness.inference.fault_specs import FAULTS, Fault, FaultKind, Strikes, kinds_help, parse_faults
from harness.inference.forward import run_batch
from harness.policies import PolicyNet, PolicySpec, load_policy
from harness.policies import registry as policies
from harness.policies.loader import Peek, PolicyFormat
from harness.policies.mlagents import BODY, HEAD, weights_from_state_dict
from harness.workloads import make_batch
from tests.helpers import REPO


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}"
    path.write_text(text.replace(old, new, 1))


def _copy_of_harness(root: Path) -> Path:
    shutil.copytree(REPO / "harness", root / "harness", ignore=shutil.ignore_patterns("__pycache__", "data"))
    return root / "harness"


def _python(root: Path, code: str) -> str:
    """What `code` prints, run against the copy of the harness under `root`."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


# An accelerator: a class and its registration.
class ToySimulated(SimulatedCpu):
    """A second family of simulated cards, as a vendor's CPU-backed emulator would be."""

    display = "a toy simulated card"


def test_a_toy_accelerator_is_an_option_and_its_card_runs_a_policy(tmp_path: Path) -> None:
    with devices.registered("toysim", ToySimulated) as kind:
        assert devices.choices() == ("auto", "npu", "cuda", "toysim", "cpu")
        validate(SweepConfig(accelerator="toysim", results=str(tmp_path)))
        actor = PolicyActor(kind, 0, [PolicySpec("cartpole")], 1, "strict", [], str(tmp_path / "marker"))
        card = actor.describe().device
        assert (card.kind, card.label, card.simulated) == ("toysim", "sim-toysim0", True)
        batch = make_batch(load_policy("cartpole").info, "normal", 8, seed=0)
        toy = actor.run_batch("cartpole", "float32", batch.obs, batch.noise).value
    cpu = run_batch(load_policy("cartpole"), cpu_reference(), batch.obs, batch.noise)
    assert all(np.array_equal(toy[name], cpu[name]) for name in cpu), "a CPU-backed card computes the CPU's bits"
    assert "toysim" not in devices.choices()


# A policy format: a class and its registration.
class ToyFormat(PolicyFormat):
    """ML-Agents weights as JSON lists under "toy"."""

    name = "toy"
    suffixes = (".toy",)
    what = 'a JSON object whose "toy" holds ML-Agents weights'

    @classmethod
    def claims(cls, peek: Peek) -> bool:
        return peek.head.startswith(b'{"toy":')

    @classmethod
    def load(cls, path: Path, spec: PolicySpec) -> PolicyNet:
        content = path.read_bytes()
        state = {key: torch.tensor(value) for key, value in json.loads(content)["toy"].items()}
        sha256 = hashlib.sha256(content).hexdigest()
        return weights_from_state_dict(state).to_policy(name=path.stem, source=cls.name, sha256=sha256, detail="a toy")


def test_a_toy_policy_format_is_loaded_by_its_suffix_and_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    state = {
        f"{BODY}.0.weight": rng.uniform(-0.5, 0.5, (8, 4)),
        f"{BODY}.0.bias": np.zeros(8),
        f"{HEAD}.mu.weight": rng.uniform(-0.5, 0.5, (2, 8)),
        f"{HEAD}.mu.bias": np.zeros(2),
        f"{HEAD}.log_sigma": np.zeros((1, 2)),
    }
    path = tmp_path / "walker.toy"
    path.write_text(json.dumps({"toy": {key: value.astype(np.float32).tolist() for key, value in state.items()}}))
    with policies.FORMATS.registered(ToyFormat.name, ToyFormat):
        policy = load_policy(str(path))
    assert (policy.info.name, policy.info.source, policy.info.action_size) == ("walker", "toy", 2)
    batch = make_batch(policy.info, "normal", 8, seed=0)
    assert run_batch(policy, cpu_reference(), batch.obs, batch.noise)["action"].shape == (8, 2)
    with pytest.raises(UsageError, match="unknown policy"):
        load_policy(str(path))


# A fault kind: a record and its registration; how it applies is a function, here or by path.
class Stalled(Exception):
    """What the toy unit fault does to a card: it fails the unit (a real one dies or hangs)."""


def _double_the_head(policy: PolicyNet, _fault: Fault) -> None:
    policy.head.register_forward_hook(lambda _module, _inputs, output: output * 2)


def _stall() -> None:
    raise Stalled


DOUBLE = FaultKind("toy-double", Strikes.POLICY, "the head's output doubled", _double_the_head)
STALL = FaultKind("toy-stall", Strikes.UNIT, "the card fails its first unit", _stall, once=True)


def test_a_toy_fault_kind_is_parsed_injected_and_struck(tmp_path: Path) -> None:
    with FAULTS.registered(DOUBLE.name, DOUBLE), FAULTS.registered(STALL.name, STALL):
        faults = parse_faults(["card0:toy-double", "all:toy-stall"])
        assert faults == [Fault(0, "toy-double"), Fault(None, "toy-stall")]
        assert "toy-double, toy-stall" in kinds_help() and "toy-stall" not in kinds_help(Strikes.POLICY)
        bench_plan(BenchConfig(inject_fault=["card0:toy-double"]))  # a bench takes a fault that strikes the policy
        with pytest.raises(UsageError, match=r"a bench injects only into its timed path: .*, toy-double, e\.g\."):
            bench_plan(BenchConfig(inject_fault=["all:toy-stall"]))

        batch = make_batch(load_policy("cartpole").info, "normal", 8, seed=0)
        card = PolicyActor(devices.SIMULATED, 0, [PolicySpec("cartpole")], 1, "strict", faults, str(tmp_path / "card0"))
        with pytest.raises(Stalled):
            card.run_batch("cartpole", "float32", batch.obs, batch.noise)
        struck = card.run_batch("cartpole", "float32", batch.obs, batch.noise).value  # once: the marker is there
    clean = run_batch(load_policy("cartpole"), cpu_reference(), batch.obs, batch.noise)
    np.testing.assert_array_equal(struck["logits"], 2 * clean["logits"])
    with pytest.raises(UsageError, match="expected card<N>:<kind> or all:<kind>"):
        parse_faults(["card0:toy-double"])


def test_a_fault_kind_that_says_neither_how_nor_what_variables_is_refused() -> None:
    with pytest.raises(ValueError, match="'toy-nothing': a POLICY fault takes how alone"):
        FaultKind("toy-nothing", Strikes.POLICY, "nothing")
    with pytest.raises(ValueError, match="'toy-env': a PROCESS fault takes env alone"):
        FaultKind("toy-env", Strikes.PROCESS, "a variable and a function", _stall, env={"TOY": "1"})


# A command: a module with `register` and `run`, and its line in COMMANDS.
TOY_COMMAND = """
def register(subparsers):
    parser = subparsers.add_parser("toy", help="a toy command that greets")
    parser.add_argument("--times", type=int, default=1)
    parser.set_defaults(func=run)


def run(args):
    print(" ".join(["hello"] * args.times))
    return 0
"""


def test_a_toy_command_is_in_help_and_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "toy_command.py").write_text(TOY_COMMAND)
    spec = importlib.util.spec_from_file_location("toy_command", tmp_path / "toy_command.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Read off the module when called: a test that reloads harness.cli gives it a new COMMANDS.
    cli = harness.cli
    with cli.COMMANDS.registered("toy", module):
        assert "a toy command that greets" in cli.build_parser().format_help()
        assert cli.main(["toy", "--times", "2"]) == 0
    assert capsys.readouterr().out == "hello hello\n"
    assert cli.main(["toy"]) == 2, "gone with its registration"


# A check kind: a member of CheckKind and its result types in `result_types` (in a copy of the
# code; tests/test_results.py shows mypy refusing the member until `result_types` handles it).
def test_a_toy_check_kind_is_found_by_name_and_read_back(tmp_path: Path) -> None:
    judge = _copy_of_harness(tmp_path) / "judge"
    _replace(judge / "kinds.py", '    BENCH_AUDIT = "bench_audit"', '    BENCH_AUDIT = "bench_audit"\n    TOY = "toy"')
    _replace(
        judge / "results.py",
        "        case _:\n            assert_never(kind)",
        "        case CheckKind.TOY:\n            return (Comparison,)\n        case _:\n            assert_never(kind)",
    )
    out = _python(
        tmp_path,
        "from harness.judge.compare import compare_bitwise; from harness.judge.kinds import CheckKind\n"
        "from harness.judge.results import KINDS, columns_of, read_result; from harness.judge.verdicts import Check\n"
        "import numpy as np\n"
        "check = Check('logits', CheckKind.TOY, 'sim-cpu0', 'sim-cpu1', True, compare_bitwise(np.zeros(3), np.ones(3)))\n"
        "row = {'kind': 'toy', **columns_of(check.result)}\n"
        "print(*(t.__name__ for t in KINDS.get('toy')), type(read_result(row)).__name__, read_result(row).passed)",
    )
    assert out.split() == ["Comparison", "Comparison", "False"], out


# An option: a field of the command's config in harness/config/options.py. Written against
# today's `option(...)`; the move to a model library adapts it.
def test_a_toy_option_added_to_the_sweep_config_is_a_flag(tmp_path: Path) -> None:
    _replace(
        _copy_of_harness(tmp_path) / "config" / "options.py",
        '    """`harness sweep`: validate policies on every card against each other and the CPU."""\n',
        '    """`harness sweep`: validate policies on every card against each other and the CPU."""\n\n'
        '    toy_knob: int = option("--toy-knob", "a toy option", 3, type=int, metavar="N", at_least=1)\n',
    )
    out = _python(
        tmp_path,
        "import argparse\nfrom harness.cli import build_parser\nfrom harness.config.options import SweepConfig, "
        "config_from_args\nparser = build_parser()\n"
        "[sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]\n"
        "print('--toy-knob N' in sub.choices['sweep'].format_help())\n"
        "print(config_from_args(parser.parse_args(['sweep', '--toy-knob', '5']), SweepConfig).toy_knob)",
    )
    assert out.split() == ["True", "5"], out
