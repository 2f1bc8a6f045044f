"""After a FAIL, the layers to keep in float32 and a repro a vendor can run: a precision plan's
label and cast, its file, the search (bisection then linear refinement) on a predicate, and end
to end on the session's cluster, three harness commands sharing one failed sweep of two policies
in float16 with every card's float16 matmuls summed in float16 (fp16-accumulate): one whose first
layer overflows float16 (its first NaN named), one whose 1024-wide head the accumulator spoils.
`harness diagnose` keeps exactly the overflowing layer of the one and the head of the other in
float32; `harness sweep --keep-float32 PLAN` passes both, fault and all, but for card1, whose
kept head computes in reduced float32 (reduced-fp32@head): cards part there. `harness repro`
makes a folder whose script reruns card1's failing float16 in a process without the harness.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from harness.dtypes import base_dtype, kept_label, precision_of, split_kept
from harness.errors import UsageError
from harness.inference.fault_specs import parse_faults
from harness.inference.faults import inject
from harness.policies import load_policy
from harness.policies.base import cast_policy
from harness.policies.keep_float32 import precision_layers
from harness.policies.matmul_precision import round_mantissa
from harness.diagnose.search import smallest_float32_set
from harness.config.precision_plan import read_plan
from tests import builders
from tests.conftest import Head
from tests.helpers import assert_usage_error, cli, harness, read_table, sweep_on

# One batch size (64 rows: past the port rule's small-batch limit) beside the uniform and edge
# batches every sweep has; no episodes: the plan's point is the batch checks.
QUICK = ("--dtypes", "float16", "--batch-sizes", "64", "--episodes", "0", "--cards", "2")
FAULT = ("--inject-fault", "all:fp16-accumulate")


@pytest.fixture(scope="module")
def overflow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builders.float16_overflow(tmp_path_factory.mktemp("softsign"), nn.Softsign)


def test_a_plan_label_names_its_dtype_and_layers() -> None:
    label = kept_label("bfloat16", ("body.0", "head"))
    assert label == "bfloat16+fp32[body.0,head]"
    assert split_kept(label) == ("bfloat16", ("body.0", "head")) and precision_of(label) == "bfloat16"
    assert base_dtype(label) == label and base_dtype("float32-tf32") == "float32"
    assert kept_label("float16", ()) == "float16" and split_kept("float16") == ("float16", ())


def test_a_kept_layer_computes_in_float32_and_mends_the_overflow(overflow: Path) -> None:
    policy = load_policy(str(overflow))
    assert precision_layers(policy) == ["body.0", "head"]
    obs = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
    golden = cast_policy(policy, "float64")(obs.double())
    assert not torch.isfinite(cast_policy(policy, "float16")(obs)).all()
    mixed = cast_policy(policy, "float16+fp32[body.0]")
    first, kept = dict(policy.named_parameters()), dict(mixed.named_parameters())
    assert kept["body.0.weight"].dtype == torch.float32 and kept["head.weight"].dtype == torch.float16
    # The kept layer's weights come from the float32 policy: past 65504, float16 made them inf.
    assert torch.equal(kept["body.0.weight"], first["body.0.weight"])
    out = mixed(obs)
    assert torch.isfinite(out).all() and float((out.double() - golden).abs().max()) < 0.05
    with pytest.raises(ValueError, match=r"no layer body\.9"):
        cast_policy(policy, "float16+fp32[body.9]")


def test_the_search_bisects_then_drops_what_is_not_needed() -> None:
    layers = [f"body.{i}" for i in range(8)]
    asked: list[tuple[str, ...]] = []

    def needs(*wanted: str) -> Callable[[tuple[str, ...]], bool]:
        def passes(kept: tuple[str, ...]) -> bool:
            asked.append(kept)
            return set(wanted) <= set(kept)

        return passes

    assert smallest_float32_set(layers, needs("body.2", "body.5")) == ("body.2", "body.5")
    # All, then 3 bisection steps, then one try per layer of the leading run but its last.
    assert len(asked) == 1 + 3 + 5
    assert smallest_float32_set(layers, needs("body.0")) == ("body.0",)
    assert smallest_float32_set(layers, lambda kept: False) is None


def test_a_fault_strikes_one_layer_and_reduced_float32_rounds_as_the_bits_do(overflow: Path) -> None:
    [fault] = parse_faults(["card1:reduced-fp32@head"])
    assert (fault.card, fault.kind, fault.layer, str(fault)) == (1, "reduced-fp32", "head", "card1:reduced-fp32@head")
    with pytest.raises(UsageError, match="strikes no single layer"):
        parse_faults(["card0:corrupt-weight@head"])
    # In a plan, the layers kept in float32 are the float32 ones it reduces; the named one alone.
    policy = load_policy(str(overflow))
    mixed = inject(cast_policy(policy, "float16+fp32[body.0,head]"), [fault])
    kept = dict(mixed.named_parameters())
    assert torch.equal(kept["body.0.weight"], policy.body[0].weight)
    assert not torch.equal(kept["head.weight"], policy.head.weight)
    assert torch.equal(kept["head.weight"], round_mantissa(policy.head.weight))
    with pytest.raises(ValueError, match=r"no Linear layer 'body\.7'"):
        inject(cast_policy(policy, "float32"), parse_faults(["all:reduced-fp32@body.7"]))
    # round_mantissa is arithmetic (torch.jit.trace records it); on the bits, as TF32 rounds: the same bits.
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * 10.0 ** torch.randint(-44, 38, (100_000,))
    x = torch.cat([x, torch.tensor([0.0, -0.0, 3.4e38, 1e-40, 1 + 2**-11, 1 + 3 * 2**-11, float("inf"), float("nan")])])
    raw = x.view(torch.int32)
    bits = ((raw + (1 << 12) - 1 + ((raw >> 13) & 1)) & ~((1 << 13) - 1)).view(torch.float32)
    on_bits = torch.where(torch.isfinite(x), bits, x)
    assert torch.equal(round_mantissa(x).view(torch.int32), on_bits.view(torch.int32))


def test_a_plan_that_does_not_apply_is_refused(overflow: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    body = {"policy": str(overflow), "dtype": "float16", "layers": ["body.0"], "found_on": "", "steps": [], "verified": True}
    plan.write_text(json.dumps({"version": 1, "run_id": "r", "plans": [body]}))
    proc = cli("sweep", "--policy", "cartpole", "--dtypes", "float16", "--keep-float32", str(plan), "--results", str(tmp_path))
    assert_usage_error(proc, "--keep-float32", "does not apply")
    plan.write_text("{}")
    assert_usage_error(cli("sweep", "--keep-float32", str(plan), "--results", str(tmp_path)), "not a precision plan")


def _entry(policy: Path, layers: list[str], verified: bool) -> dict[str, Any]:
    return {"policy": str(policy), "dtype": "float16", "layers": layers, "found_on": "", "steps": [], "verified": verified}


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], "the plan of run r holds no (policy, dtype): it keeps nothing in float32"),
        # what `harness diagnose` writes where every layer in float32 still fails
        ([_entry(Path("P"), ["body.0", "head"], verified=False)], "plans[0] (P float16) is no plan: `harness diagnose`"),
        ([_entry(Path("P"), ["body.0"], True), _entry(Path("P"), [], True)], "plans[1] (P float16) keeps no layer"),
    ],
)
def test_a_plan_that_keeps_nothing_is_refused(
    overflow: Path, tmp_path: Path, entries: list[dict[str, Any]], expected: str
) -> None:
    plan = tmp_path / "plan.json"
    for entry in entries:
        entry["policy"] = str(overflow) if entry["policy"] == "P" else entry["policy"]
    plan.write_text(json.dumps({"version": 1, "run_id": "r", "plans": entries}))
    args = ("--policy", str(overflow), "--dtypes", "float16", "--keep-float32", str(plan), "--results", str(tmp_path))
    named = expected.replace("P", str(overflow))
    assert_usage_error(cli("sweep", *args), f"--keep-float32 '{plan}': ", named, "applies nothing never passes")
    assert not (tmp_path / "runs").exists()


def test_a_plan_nested_past_the_stack_is_one_line(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("[" * 200_000)
    proc = harness("sweep", "--keep-float32", str(plan), "--results", str(tmp_path), timeout=120)
    assert_usage_error(proc, "not a precision plan", "JSON nested too deeply to read")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # a damaged model is no mismatch (exit 1): the script cannot run here
        (["--device", "cpu", "--model", "damaged.pt"], "damaged.pt: not a model torch.jit can load ("),
        (["--device", "cpu:3"], "--device cpu:3: there is one CPU device, cpu"),
        (["--device", "cuda:x"], "--device cuda:x: expected cuda:N, npu:N or cpu"),
    ],
)
def test_the_repro_script_says_what_keeps_it_from_running_in_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    from harness.repro import script as repro_script

    shutil.copy(repro_script.__file__, tmp_path / "repro.py")
    (tmp_path / "manifest.json").write_text(json.dumps({"weights": {"sha256": "0" * 64, "origin": "cartpole"}}))
    (tmp_path / "damaged.pt").write_bytes(b"PK\x03\x04" + bytes(100))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "repro.py", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    [line] = run.stderr.strip().splitlines()
    assert line.startswith("repro: ") and expected in line, line


@dataclass(frozen=True)
class Swept:
    results: Path
    overflow: Path
    wide: Path
    failed: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def swept(overflow: Path, ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> Swept:
    """The failed sweep the module's commands share: both policies, float16, fp16-accumulate."""
    results = tmp_path_factory.mktemp("results")
    wide = builders.wide_layer(tmp_path_factory.mktemp("wide"))
    policies = ("--policy", str(overflow), "--policy", str(wide))
    failed = sweep_on(ray_head.address, results, *policies, *QUICK, *FAULT, "--run-id", "failed")
    return Swept(results, overflow, wide, failed)


def _rows(results: Path, run_id: str) -> list[dict[str, Any]]:
    return [r for r in read_table(results, "checks").to_pylist() if r["run_id"] == run_id]


@pytest.mark.slow
def test_a_card_s_first_nan_is_named_and_the_accumulator_fails_the_port(swept: Swept) -> None:
    failed = swept.failed
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    rows = _rows(swept.results, "failed")
    # Where each card's NaN began: the first layer, the row, the layer's largest finite input (the observations).
    found = [r for r in rows if r["kind"] == "first_nonfinite"]
    assert {(r["policy"], r["device_a"]) for r in found} == {(str(swept.overflow), f"sim-cpu{i}") for i in range(2)}
    assert all(r["layer"] == "body.0" and not r["gating"] and not r["passed"] for r in found)
    assert all(r["input_max_abs"] > 0 and r["n_nonfinite"] > 0 for r in found)
    assert (
        "finding (not gating)" in failed.stdout and "first value not finite appeared at body.0 Linear(4, 16)" in failed.stdout
    )
    # The float16 accumulator: every card alike (cross_card passes), the port rule fails on the wide policy.
    wide = [r for r in rows if r["policy"] == str(swept.wide)]
    assert all(r["passed"] for r in wide if r["kind"] == "cross_card")
    port = [r for r in wide if r["kind"] == "cpu_reference" and r["output"] == "logits" and r["workload"] == "normal-b64-s0"]
    assert len(port) == 2 and not any(r["passed"] for r in port) and all(r["error_ratio"] > 1 for r in port)


@pytest.fixture(scope="module")
def plan(swept: Swept, ray_head: Head) -> tuple[subprocess.CompletedProcess[str], Path]:
    diagnosed = cli("diagnose", "failed", "--results", str(swept.results), "--address", ray_head.address)
    assert diagnosed.returncode == 0, diagnosed.stdout[-3000:] + diagnosed.stderr[-3000:]
    return diagnosed, Path(diagnosed.stdout.strip().splitlines()[-1].removeprefix("plan: "))


@pytest.mark.slow
def test_diagnose_keeps_the_layer_each_failure_needs_and_no_more(
    swept: Swept, plan: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    diagnosed, path = plan
    plans = {p.policy: p for p in read_plan(path).plans}
    overflow, wide = plans[str(swept.overflow)], plans[str(swept.wide)]
    # The overflow: everything kept passes, then bisection stops at body.0 alone.
    assert (overflow.layers, overflow.verified, overflow.found_on) == (("body.0",), True, "sim-cpu0")
    assert [(s.layers, s.passed) for s in overflow.steps] == [(("body.0", "head"), True), (("body.0",), True)]
    # The accumulator: body.0 alone does not mend it, and the head alone does.
    assert (wide.layers, wide.verified) == (("head",), True)
    assert [(s.layers, s.passed) for s in wide.steps] == [(("body.0", "head"), True), (("body.0",), False), (("head",), True)]
    assert all(s.units > 0 and s.seconds > 0 for p in plans.values() for s in p.steps)
    assert "step 2: float16+fp32[body.0]: PASS" in diagnosed.stdout and "step 3: float16+fp32[head]: PASS" in diagnosed.stdout


@pytest.mark.slow
def test_the_plans_pass_a_sweep_but_on_a_card_that_reduces_a_kept_layer(
    swept: Swept, plan: tuple[subprocess.CompletedProcess[str], Path], ray_head: Head
) -> None:
    """One sweep verifies both plans under the fault the run failed with; card1 also computes its
    float32 Linear layers in reduced float32 (reduced-fp32@head: the wide plan's kept head)."""
    policies = ("--policy", str(swept.overflow), "--policy", str(swept.wide))
    faults = (*FAULT, "--inject-fault", "card1:reduced-fp32@head")
    verified = sweep_on(
        ray_head.address, swept.results, *policies, *QUICK, *faults, "--keep-float32", str(plan[1]), "--run-id", "planned"
    )
    assert verified.returncode == 1, verified.stdout[-3000:] + verified.stderr[-3000:]
    rows = [r for r in _rows(swept.results, "planned") if r["gating"]]
    labels = {str(swept.overflow): "float16+fp32[body.0]", str(swept.wide): "float16+fp32[head]"}
    assert {(r["policy"], r["dtype"]) for r in rows} == set(labels.items())
    # The overflow's plan passes every check; the accumulator's passes the port rule on both cards.
    assert all(r["passed"] for r in rows if r["policy"] == str(swept.overflow))
    wide = [r for r in rows if r["policy"] == str(swept.wide)]
    assert all(r["passed"] for r in wide if r["kind"] in ("cpu_reference", "decisions") and r["device_a"] == "sim-cpu0")
    # card1 does not compute the kept head in float32: it parts from card0 bit for bit, at the head.
    parted = [r for r in wide if not r["passed"]]
    assert parted and {r["device_a"] for r in parted} == {"sim-cpu1"}
    assert {r["kind"] for r in parted} == {"cross_card"}
    assert all("first divergent layer: head Linear(1024, 2)" in r["detail"] for r in parted)


@pytest.mark.slow
def test_a_repro_folder_reruns_the_failing_check_without_the_harness(
    swept: Swept, ray_head: Head, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = cli(
        "repro",
        "failed",
        *("--check", "cpu_reference", "--card", "sim-cpu1", "--policy", str(swept.wide), "--workload", "normal-b64-s0"),
        *("--output", "logits", "--results", str(swept.results), "--address", ray_head.address),
    )
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    assert "FAIL again on this rerun" in made.stdout
    folder = Path(made.stdout.strip().splitlines()[-1].removeprefix("repro: "))
    assert folder.is_relative_to(swept.results / "repro" / "failed")
    assert {p.name for p in folder.iterdir()} >= {"inputs.npz", "outputs.npz", "model.pt", "manifest.json", "repro.py"}
    manifest = json.loads((folder / "manifest.json").read_text())
    recorded = next(
        r
        for r in _rows(swept.results, "failed")
        if (r["kind"], r["device_a"], r["policy"], r["workload"], r["output"])
        == ("cpu_reference", "sim-cpu1", str(swept.wide), "normal-b64-s0", "logits")
    )
    # Traceable: which bytes went in, on which card, in which dtype, with what done to it.
    assert manifest["input"]["sha256"] == recorded["input_sha256"]
    assert manifest["card"]["label"] == "sim-cpu1" and manifest["card"]["faults"] == ["all:fp16-accumulate"]
    assert manifest["dtype"]["label"] == "float16" and manifest["dtype"]["precision"] == "strict"
    assert manifest["versions"]["torch_version"] and manifest["rerun"]["passed"] is False

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        """The folder's script in a fresh interpreter, told nothing of the harness, which never loads it."""
        code = (
            "import runpy, sys\n"
            f"sys.argv = ['repro.py', *{list(args)!r}]\n"
            "try:\n    runpy.run_path('repro.py', run_name='__main__')\nexcept SystemExit as exc:\n    code = exc.code\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'harness')\n"
            "print('harness modules:', loaded)\nsys.exit(code)\n"
        )
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD")}
        return subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True, timeout=120)

    run = script("--device", "cpu")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "harness modules: []" in run.stdout
    assert "this rerun against the card's output in the run: equal bit for bit" in run.stdout
    assert f"FAIL: error_ratio {recorded['error_ratio']:.4g} and max_ratio {recorded['max_ratio']:.4g}" in run.stdout
    # The rest in this process (a fresh interpreter per call costs seconds): the script's own
    # main, loaded from the folder. The verdict is the rerun's: with the recorded card output
    # gone, the same mismatch, the model read from where --model says.
    main = runpy.run_path(str(folder / "repro.py"))["main"]
    saved = dict(np.load(folder / "outputs.npz"))
    np.savez(folder / "outputs.npz", **(saved | {"card/logits": np.zeros_like(saved["card/logits"])}))
    moved = tmp_path / "model.pt"
    shutil.move(folder / "model.pt", moved)
    assert main(["--device", "cpu", "--model", str(moved)]) == 1
    said = capsys.readouterr()
    assert "FAIL: error_ratio" in said.out and "128 of 128 values differ" in said.out
    # No device, no run: never the CPU in the card's place; no weights, no run either.
    assert main(["--device", "cuda:0"]) == 2 and "no cuda device is available here" in capsys.readouterr().err
    assert main(["--device", "cpu"]) == 2
    missing = capsys.readouterr().err
    assert manifest["weights"]["sha256"] in missing and "pass --model" in missing
