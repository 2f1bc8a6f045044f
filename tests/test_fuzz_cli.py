"""The command line, fuzzed (issue 35): every option of every command that takes a value, given
hostile numbers (0, negative, nan, inf, 1e999, integers of thousands of digits), strings (odd
characters, surrogate-escaped bytes, very long) and paths (missing, a folder, a FIFO, a device, a
symlink loop, under a file, a name too long, empty, unreadable). Each value either gets as far as
the command's real work (Ray's start, which is replaced here by `WouldRun`, or a query, a report,
an export) or is refused in one line with exit 2 and no traceback, having written nothing outside
the results folder.

The options are read from the command line's own parser, so an option added later is fuzzed with
no change here. Hypothesis draws a fixed number of examples per command, derandomized, so CI
runs the same examples every time (docs/ci.md, "The fuzz tests", states the counts); a handful of
the hostile values run through the real command as well, where a fresh process shows what a user
sees and the `runs` table is read for a row left `running`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.judge.compare import ToleranceComparison
from harness.store.claim import Claim
from harness.store.schema import CheckRow
from harness.store.writer import RunWriter, to_table
from tests.fuzzing import fuzz_settings
from tests.helpers import cli, harness, run_row

RUN_ID = "r1"
RESULTS = "results"  # inside each example's world, where the command may write
# Per example: an option whose check is missing, and a FIFO it opens, would otherwise hang CI.
EXAMPLE_DEADLINE_S = 120

# What each command runs with when no value is hostile: it gets as far as its real work.
BASE: dict[str, list[str]] = {
    "sweep": ["--policy", "cartpole", "--dtypes", "float32", "--accelerator", "cpu", "--no-progress", "--episodes", "0"],
    "bench": ["--policy", "cartpole", "--dtypes", "float32", "--accelerator", "cpu", "--no-progress"],
    "query": ["--results", RESULTS, "--", "SELECT status FROM runs"],
    "report": ["--results", RESULTS, "--", RUN_ID],
    "diagnose": ["--results", RESULTS, "--", RUN_ID],
    "repro": ["--results", RESULTS, "--", RUN_ID],
    "export-onnx": ["--", "cartpole", "out.onnx"],
    "info": ["--json"],
    "up": ["--accelerator", "cpu"],
    "down": [],
}
COMMANDS = tuple(BASE)


class WouldRun(BaseException):
    """Every check made before Ray starts was passed: the command would now start its real work.
    A BaseException, so that no `except Exception` of the command's own turns it into an answer."""


@contextlib.contextmanager
def ray_never_starts() -> Iterator[None]:
    """Joining or starting Ray, wherever a command does it, raises WouldRun instead."""
    import harness.cluster.lifecycle as lifecycle
    import harness.cluster.place as place

    def would_run(*args: object, **kwargs: object) -> str:
        raise WouldRun

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lifecycle, "connect", would_run)
        patch.setattr(place, "connect", would_run)
        yield


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"no answer in {seconds} s: a check that blocks (a FIFO opened, a device read)?")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- the values -------------------------------------------------------------------------------------

HOSTILE_NUMBERS = (
    "0", "-0", "-1", "0.0", "nan", "-nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e999", "1e-400",
    "4294967296", "9223372036854775808", str(10**40), str(-(10**40)), "9" * 5000, "1" + "0" * 300,
    "0x10", "1_000", "1e3", "2.5", "+1", " 1", "1,", ",", ",,", "1,,2", "1,nan", "", " ",
)  # fmt: skip
ODD_CHARACTERS = "\t\n\r\x1b\x7f'\"`$;|&<>*?[]{}()\\/.:=,% \u00e9\u200b\u202e\ufeff\U0001f600\udc80\udcff"


def numbers() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(HOSTILE_NUMBERS),
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.lists(st.sampled_from(HOSTILE_NUMBERS[:20]), min_size=1, max_size=4).map(",".join),
    )


def strings() -> st.SearchStrategy[str]:
    odd = st.text(alphabet=st.one_of(st.sampled_from(ODD_CHARACTERS), st.characters(blacklist_characters="\x00")), max_size=40)
    # Argument strings of a real command line are at most 128 KiB each (MAX_ARG_STRLEN).
    long = st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "/", "9", "-", "%s"]), st.integers(256, 100_000))
    return st.one_of(odd, long, st.sampled_from(["", "-", "--", "-h", "--help", "auto", "cpu", "float16", RUN_ID]))


PATH_KINDS = ("missing", "folder", "fifo", "null", "zero", "loop", "under-file", "long-name", "empty", "garbage", "unreadable")
SUFFIXES = ("", ".zip", ".onnx", ".pt", ".toml", ".json", ".onnx/")


@dataclass(frozen=True)
class PathValue:
    """A path the example's world makes before the command runs: what `kind` says, named with `suffix`."""

    kind: str
    suffix: str

    def make(self, world: Path, tag: int) -> str:
        """The path, made in `world`; `tag` tells apart the paths of one example."""
        name = f"odd-{self.kind}-{tag}{self.suffix.rstrip('/')}"
        path = world / name
        if self.kind == "folder":
            path.mkdir()
        elif self.kind == "fifo":
            os.mkfifo(path)
        elif self.kind in ("null", "zero"):
            return f"/dev/{self.kind}"
        elif self.kind == "loop":
            os.symlink(world / f"{name}.other", path)
            os.symlink(path, world / f"{name}.other")
        elif self.kind == "under-file":
            (world / f"a-file-{tag}").write_bytes(b"x")
            path = world / f"a-file-{tag}" / name
        elif self.kind == "long-name":
            path = world / (f"{tag}" + "n" * 300 + self.suffix.rstrip("/"))
        elif self.kind == "empty":
            path.write_bytes(b"")
        elif self.kind == "garbage":
            path.write_bytes(bytes(range(256)) * 4)
        elif self.kind == "unreadable":
            path.write_bytes(b"PK\x03\x04 locked")
            path.chmod(0)
        return str(path) + ("/" if self.suffix.endswith("/") else "")


def paths() -> st.SearchStrategy[PathValue]:
    return st.builds(PathValue, st.sampled_from(PATH_KINDS), st.sampled_from(SUFFIXES))


# TOML values of every type, and the numbers TOML has that a flag's text has not (inf, nan).
TOML_VALUES = (
    "inf", "-inf", "nan", "0", "-1", str(10**40), "9" * 5000, "1e999", "0.0", "true", '""', '"auto"', '"nan"',
    '"../../etc"', "[]", '[1, "a"]', "[nan]", "[inf, 1]", '[""]', '{a = 1}', '{"x" = "y"}', "1979-05-27",
    "[" * 5000 + "]" * 5000, "{a = " * 2000 + "1" + "}" * 2000,
)  # fmt: skip


@dataclass(frozen=True)
class ConfigValue:
    """A `--config` file (or any path) whose TOML sets one option, or a key of no option, to a
    value of any type."""

    key: str
    value: str

    def make(self, world: Path, tag: int) -> str:
        path = world / f"fuzzed-{tag}.toml"
        path.write_text(f"{self.key} = {self.value}\n")
        return str(path)


def configs() -> st.SearchStrategy[ConfigValue]:
    from harness.config.options import BenchConfig, SweepConfig

    keys = sorted({name for c in (SweepConfig, BenchConfig) for name in c.model_fields} | {"no_such_option"})
    return st.builds(ConfigValue, st.sampled_from(keys), st.one_of(st.sampled_from(TOML_VALUES), numbers()))


Value = str | PathValue | ConfigValue


def values() -> st.SearchStrategy[Value]:
    return st.one_of(numbers(), strings(), paths(), configs())


# -- the options, as the parser declares them --------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """Where a value goes on a command line: an option's flag (`--cards`), or a positional's index."""

    flag: str | None
    position: int
    nargs: int


def slots(command: str) -> list[Slot]:
    """Every argument of `command` that takes a value, read from the command line's parser."""
    from harness.cli import build_parser

    [sub] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    parser = sub.choices[command]
    found, position = [], 0
    for action in parser._actions:
        if action.nargs == 0 or isinstance(action, argparse._HelpAction):
            continue
        width = action.nargs if isinstance(action.nargs, int) else 1
        if action.option_strings:
            found.append(Slot(max(action.option_strings, key=len), -1, width))
        else:
            found.append(Slot(None, position, width))
            position += 1
    return found


def command_line(command: str, fuzzed: list[tuple[Slot, list[str]]]) -> list[str]:
    """`command`'s base arguments with each fuzzed slot's values in place of (or beside) its own."""
    base = BASE[command]
    split = base.index("--") if "--" in base else len(base)
    options, positionals = list(base[:split]), list(base[split + 1 :])
    for slot, words in fuzzed:
        if slot.flag is None:
            positionals[slot.position : slot.position + 1] = words
        elif slot.nargs == 1:
            if slot.flag in options:  # one value per flag: the fuzzed one replaces the base's
                at = options.index(slot.flag)
                del options[at : at + 2]
            options.append(f"{slot.flag}={words[0]}")  # `=`: a value such as -1 is the flag's, not a flag
        else:
            options += [slot.flag, *words]
    return [command, *options, *(["--", *positionals] if positionals else [])]


# -- the world an example runs in ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder holding one finished sweep (RUN_ID) whose float16 failed, copied into each
    example's world: what report, query, diagnose and repro take."""
    results = tmp_path_factory.mktemp("fuzz-template") / RESULTS
    config = {"policies": ["cartpole"], "dtypes": ["float32", "float16"], "accelerator": "cpu", "episodes": 0}
    row = run_row("failed", config)
    failed = ToleranceComparison(
        passed=False, bitwise_equal=False, n_elements=16, n_mismatch=3, max_ulp=9, max_abs=3.0, mean_abs=0.7,
        max_rel=0.01, cosine=0.99999, ref_max_abs=2.1, atol=0.05, rtol=0.02, min_cos=0.999, detail="max_abs 3 > 0.05",
    )  # fmt: skip
    check = CheckRow(
        unit_id="u1", policy="cartpole", dtype="float16", workload="normal-b8-s0", output="logits",
        kind="cpu_reference", device_a="sim-cpu0", device_b="cpu", input_sha256="ab" * 32, gating=True, result=failed,
    )  # fmt: skip
    with Claim.take(results, RUN_ID, False, row.started_at) as claim:
        RunWriter(claim).publish({"checks": to_table("checks", [check])}, row)
    return results


def snapshot(world: Path, skip: Path) -> dict[str, tuple[int, int, int]]:
    """What is in `world` outside `skip` (the results), links not followed."""
    seen = {}
    for root, dirs, files in os.walk(world):
        if Path(root) == world:
            dirs[:] = [d for d in dirs if world / d != skip]
        for name in dirs + files:
            st_ = os.lstat(Path(root) / name)
            seen[str(Path(root, name).relative_to(world))] = (st_.st_mode, st_.st_size, st_.st_mtime_ns)
    return seen


def runs_left_running(results: Path) -> list[str]:
    """The run ids of `runs` rows in `results` whose status is `running`."""
    found = []
    for part in sorted(results.glob("runs/run_id=*/*.parquet")):
        if "running" in pq.read_table(part, columns=["status"]).column("status").to_pylist():
            found.append(part.parent.name)
    return found


def check_answer(argv: list[str], code: int, stderr: str) -> None:
    """Exit 2 is one line, `harness: error:` (or argparse's `harness COMMAND: error:`), no traceback;
    nothing ever ends in a traceback."""
    assert "Traceback" not in stderr, (argv, stderr[-3000:])
    if code == 2:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(("harness: error: ", f"harness {argv[0]}: error: ")), (argv, stderr)
    else:
        assert code in (0, 1, 3), (argv, code, stderr[-3000:])


@pytest.mark.parametrize("command", COMMANDS)
def test_every_value_of_every_option_runs_or_is_one_line_exit_2(command: str, template: Path) -> None:
    command_slots = slots(command)

    @fuzz_settings
    @given(st.data())
    def one_example(data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(command_slots), min_size=1, max_size=2, unique=True), label="slots")
        drawn = [(slot, data.draw(st.lists(values(), min_size=slot.nargs, max_size=slot.nargs))) for slot in chosen]
        with contextlib.ExitStack() as stack:
            world = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fuzz-cli-")))
            stack.callback(_unlock, world)
            results = world / RESULTS
            shutil.copytree(template, results)
            tags = iter(range(len(drawn) * 2))
            fuzzed = [(slot, [v if isinstance(v, str) else v.make(world, next(tags)) for v in words]) for slot, words in drawn]
            argv = command_line(command, fuzzed)
            if command in ("sweep", "bench") and not any(s.flag == "--results" for s, _ in fuzzed):
                argv.insert(1, f"--results={results}")
            before = snapshot(world, results)
            stack.enter_context(contextlib.chdir(world))  # a relative path lands in the world
            stack.enter_context(ray_never_starts())
            stack.enter_context(deadline(EXAMPLE_DEADLINE_S))
            try:
                proc = cli(*argv)
            except WouldRun:
                return
            check_answer(argv, proc.returncode, proc.stderr)
            if proc.returncode == 2:
                assert snapshot(world, results) == before, (argv, "wrote outside the results folder")
            assert not runs_left_running(results), (argv, "a runs row left running")

    one_example()


def _unlock(world: Path) -> None:
    """The unreadable file made readable again, so that the world can be removed."""
    for path in world.glob("odd-unreadable*"):
        if not path.is_symlink():
            path.chmod(stat.S_IRUSR | stat.S_IWUSR)


# -- through the real command --------------------------------------------------------------------------

# Values that once reached past the checks, each through a fresh process as a user runs it.
REAL = [
    ("sweep", ["--max-memory=nan"]),
    ("sweep", ["--hang-timeout=-inf"]),
    ("sweep", ["--policy", "{world}/odd.zip"]),  # a FIFO named like a policy
    ("sweep", ["--keep-float32", "/dev/zero"]),
    ("bench", ["--window=nan", "--batch-sizes=" + "9" * 5000]),
    ("sweep", ["--results", "{world}/" + "n" * 300]),
    ("query", ["--results", "{world}/loop", "SELECT 1"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("command", "args"), REAL, ids=[f"{c}-{i}" for i, (c, _) in enumerate(REAL)])
def test_hostile_values_through_the_real_command(command: str, args: list[str], tmp_path: Path, template: Path) -> None:
    world = tmp_path
    results = world / RESULTS
    shutil.copytree(template, results)
    os.mkfifo(world / "odd.zip")
    os.symlink(world / "loop", world / "loop")
    base = BASE[command][: BASE[command].index("--")] if "--" in BASE[command] else BASE[command]
    words = [a.format(world=world) for a in args]
    results_flag = [] if any(a.startswith("--results") for a in words) else ["--results", str(results)]
    before = snapshot(world, results)
    proc = harness(command, *base, *results_flag, *words, timeout=120, env={"RAY_TMPDIR": str(world / "ray")})
    check_answer([command, *words], proc.returncode, proc.stderr)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert snapshot(world, results) == before, "wrote outside the results folder (Ray's session folder included)"
    assert not runs_left_running(results)
