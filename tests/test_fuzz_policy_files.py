"""Policy files, mutated (issue 35): real published policies from ../shared/cases, damaged the
ways files get damaged or forged: a member of the zip removed, a value of SB3's `data` JSON
swapped for one of another type, a huge number or deep nesting, a member or the whole file
truncated, bytes flipped (inside a member, so that the zip's CRC still holds and the damage
reaches the parsers, or in the file itself), a side file (args.yml, config.yml,
vecnormalize.pkl, ML-Agents' YAML) damaged the same ways, an ONNX graph's node or initializer
removed. Each mutant either loads, and a forward runs on it, or is refused with one line, a
PolicyLoadError (exit 2 from the command); never another exception.

The loader is the one `--policy PATH` uses (`harness.policies.load_policy`), called in-process;
a few refused mutants go through the real command too. Hypothesis draws a fixed number of
mutants per case, derandomized, so CI runs the same ones every time (docs/ci.md, "The
fuzz tests", states the counts).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from harness.errors import PolicyLoadError
from harness.policies import load_policy
from tests.fuzzing import fuzz_settings
from tests.helpers import harness


@dataclass(frozen=True)
class Case:
    """A published policy as it lies in ../shared/cases: its folder (copied whole, side files
    included, into each mutant's world) and the policy file in it."""

    folder: str
    policy: str


CASES = {
    # SB3 1.0rc0 PPO, the RL Zoo layout: CartPole-v1/args.yml and config.yml beside the zip.
    "sb3-ppo-cartpole": Case("sb3-ppo-CartPole-v1", "CartPole-v1.zip"),
    # An SB3 2.4 save: spaces in `data` as JSON beside their pickles, system_info.txt.
    "a2c-cartpole-sb3-2": Case("rlzoo/a2c/CartPole-v1_1", "CartPole-v1.zip"),
    # A2C of continuous actions with VecNormalize statistics (vecnormalize.pkl) beside.
    "a2c-vecnormalize": Case("rlzoo/a2c/MountainCarContinuous-v0_1", "MountainCarContinuous-v0.zip"),
    # SAC's squashed Gaussian actor with gSDE.
    "sac-gsde": Case("rlzoo/sac/MountainCarContinuous-v0_1", "MountainCarContinuous-v0.zip"),
    # Unity ML-Agents 3DBall, export version 3, with its trainer YAML beside.
    "mlagents-3dball": Case("mlagents-3DBall", "3DBall.onnx"),
}

# What a JSON value of `data` is swapped for: every other type, numbers at the edges of a double
# and past 64 bits, long strings, and nesting deeper than any save has.
REPLACEMENTS: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 2**31, 2**63, -(2**63), 10**30, 0.5, -0.0, 1e308, -1e308, 5e-324,
    float("nan"), float("inf"), float("-inf"), "", "x" * 10_000, "None", "auto", ":serialized:",
    [], [None], [0, 0, 0], [-1], [1e308], {}, {"": None}, {":type:": "<class 'int'>", ":serialized:": "AAAA"},
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]], 2**64, 10**400, -(10**400), int("9" * 4000),
)  # fmt: skip
DEEP = 200_000  # past Python's recursion limit many times over, as json.loads would recurse


def json_paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON document, the root's children first: each key and list index."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*at, k)
            yield from json_paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*at, i)
            yield from json_paths(v, (*at, i))


def replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return document


@st.composite
def byte_damage(draw: st.DrawFn, content: bytes) -> bytes:
    """`content` truncated, with bytes flipped, or both; never the same bytes."""
    out = bytearray(content)
    if draw(st.booleans(), label="truncate") or not out:
        out = out[: draw(st.integers(0, max(len(out) - 1, 0)), label="keep bytes")]
    if out and draw(st.booleans(), label="flip"):
        for at in draw(st.lists(st.integers(0, len(out) - 1), min_size=1, max_size=8), label="flip at"):
            out[at] ^= draw(st.integers(1, 255), label="xor")
    return bytes(out)


@st.composite
def data_json(draw: st.DrawFn, text: bytes) -> bytes:
    """SB3's `data` with one value swapped for another type, a number at an edge, or deep nesting;
    or its text damaged as bytes."""
    document = json.loads(text)
    how = draw(st.sampled_from(["swap", "deep", "bytes"]), label="data")
    if how == "bytes":
        return draw(byte_damage(text))
    paths = list(json_paths(document))
    path = paths[draw(st.integers(0, len(paths) - 1), label="data path")]
    value = "[" * DEEP + "]" * DEEP if how == "deep" else json.dumps(draw(st.sampled_from(REPLACEMENTS), label="value"))
    note(f"data{list(path)} = {value[:80]}")
    marker = "\x00swapped\x00"  # json.dumps writes the value where the marker is, unparsed
    return json.dumps(replaced(document, path, marker), indent=4).replace(json.dumps(marker), value).encode()


@st.composite
def zip_mutant(draw: st.DrawFn, original: bytes) -> bytes:
    """An SB3 save damaged: a member removed, `data` swapped, a member's bytes damaged and zipped
    again (its CRC right, so the parsers see the damage), or the zip's own bytes damaged."""
    how = draw(st.sampled_from(["remove", "data", "member", "file"]), label="zip")
    if how == "file":
        return draw(byte_damage(original))
    with zipfile.ZipFile(io.BytesIO(original)) as zf:
        members = {info.filename: zf.read(info) for info in zf.infolist()}
    name = "data" if how == "data" else draw(st.sampled_from(sorted(members)), label="member")
    if how == "remove":
        del members[name]
    elif how == "data":
        members[name] = draw(data_json(members[name]))
    else:
        members[name] = draw(byte_damage(members[name]))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, content in members.items():
            zf.writestr(member, content)
    return out.getvalue()


@st.composite
def onnx_mutant(draw: st.DrawFn, original: bytes) -> bytes:
    """An ONNX graph damaged: a node, an initializer or an output removed, an initializer's dims
    changed, or the file's bytes damaged."""
    import onnx

    how = draw(st.sampled_from(["node", "initializer", "output", "dims", "file"]), label="onnx")
    if how == "file":
        return draw(byte_damage(original))
    model = onnx.load_from_string(original)
    graph = model.graph
    items = {"node": graph.node, "initializer": graph.initializer, "output": graph.output, "dims": graph.initializer}[how]
    at = draw(st.integers(0, len(items) - 1), label=f"{how} index")
    if how == "dims":
        dims = graph.initializer[at].dims
        if dims:
            dims[draw(st.integers(0, len(dims) - 1), label="dim")] = draw(st.sampled_from([0, 1, 3, 2**31]), label="size")
    else:
        del items[at]
    return model.SerializeToString()


def mutate(case: Case, cases: Path, world: Path, data: st.DataObject) -> Path:
    """`case` (in `cases`) copied into `world` with one of its files damaged; the policy's path in
    the world. The copies are made writable: the cases are read-only."""
    folder = world / Path(case.folder).name
    shutil.copytree(cases / case.folder, folder)
    os.chmod(folder, 0o755)
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            os.chmod(Path(root, name), 0o755 if name in dirs else 0o644)
    policy = folder / case.policy
    side = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p != policy)
    # The policy file three times in four: its parsers are the most of what a mutant reaches.
    mutate_side = side and data.draw(st.integers(0, 3), label="side file?") == 0
    path = folder / (data.draw(st.sampled_from(side), label="side file") if mutate_side else case.policy)
    original = path.read_bytes()
    if path == policy and policy.suffix == ".zip":
        mutant = data.draw(zip_mutant(original))
    elif path == policy:
        mutant = data.draw(onnx_mutant(original))
    else:
        mutant = data.draw(byte_damage(original))
    path.write_bytes(mutant)
    return policy


def forward(policy: Any) -> torch.Tensor:
    obs = [torch.from_numpy(i.zeros(3)) for i in policy.info.inputs]
    return policy(*obs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_mutant_loads_and_runs_or_is_refused_in_one_line(name: str, cases: Path) -> None:
    case = CASES[name]

    @fuzz_settings
    @given(st.data())
    def one_mutant(data: st.DataObject) -> None:
        with tempfile.TemporaryDirectory(prefix="fuzz-policy-") as world:
            path = mutate(case, cases, Path(world), data)
            try:
                policy = load_policy(str(path))
            except PolicyLoadError as exc:
                assert len(str(exc).splitlines()) == 1, str(exc)
                return
            forward(policy)

    one_mutant()


def _without(member: str) -> Any:
    def damage(original: bytes) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(original)) as zf, zipfile.ZipFile(out, "w") as mutant:
            for info in zf.infolist():
                if info.filename != member:
                    mutant.writestr(info.filename, zf.read(info))
        return out.getvalue()

    return damage


# Mutants through the real command, as a user meets them: exit 2, one line naming the file,
# before Ray starts.
REAL = {
    "zip-without-policy.pth": ("sb3-ppo-cartpole", _without("policy.pth")),
    "zip-cut-in-half": ("a2c-vecnormalize", lambda b: b[: len(b) // 2]),
    "onnx-cut-in-half": ("mlagents-3dball", lambda b: b[: len(b) // 2]),
}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(REAL))
def test_a_refused_mutant_through_the_real_command(mutant: str, cases: Path, tmp_path: Path) -> None:
    name, damage = REAL[mutant]
    case = CASES[name]
    folder = tmp_path / "policy"
    shutil.copytree(cases / case.folder, folder)
    path = folder / case.policy
    path.chmod(0o644)
    path.write_bytes(damage(path.read_bytes()))
    ray_dir = tmp_path / "ray"
    proc = harness(
        "sweep", "--policy", str(path), "--accelerator", "cpu", "--episodes", "0", "--no-progress",
        "--results", str(tmp_path / "results"), timeout=120, env={"RAY_TMPDIR": str(ray_dir)},
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"harness: error: {path}"), proc.stderr
    assert not ray_dir.exists() and not (tmp_path / "results").exists()
