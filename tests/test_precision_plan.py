"""After a FAIL, the layers to keep in float32: a precision plan's label and cast, its file, the
search (bisection then linear refinement) on a predicate, and end to end on the session's
cluster: a float16 sweep of a policy whose first layer overflows float16 fails, `harness
diagnose` proposes keeping exactly that layer, and `harness sweep --keep-float32 PLAN` passes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from harness.dtypes import base_dtype, kept_label, precision_of, split_kept
from harness.policies import load_policy
from harness.policies.base import cast_policy
from harness.policies.keep_float32 import precision_layers
from harness.run.diagnose import smallest_float32_set
from harness.run.precision_plan import read_plan
from tests import builders
from tests.conftest import Head
from tests.helpers import assert_usage_error, cli, read_table, sweep_on

QUICK = ("--dtypes", "float16", "--batch-sizes", "64", "--episodes", "0", "--cards", "2")


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


def test_a_plan_that_does_not_apply_is_refused(overflow: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    body = {"policy": str(overflow), "dtype": "float16", "layers": ["body.0"], "found_on": "", "steps": [], "verified": True}
    plan.write_text(json.dumps({"version": 1, "run_id": "r", "plans": [body]}))
    proc = cli("sweep", "--policy", "cartpole", "--dtypes", "float16", "--keep-float32", str(plan), "--results", str(tmp_path))
    assert_usage_error(proc, "--keep-float32", "does not apply")
    plan.write_text("{}")
    assert_usage_error(cli("sweep", "--keep-float32", str(plan), "--results", str(tmp_path)), "not a precision plan")


@pytest.mark.slow
def test_diagnose_keeps_the_overflowing_layer_and_the_plan_passes(overflow: Path, ray_head: Head, tmp_path: Path) -> None:
    failed = sweep_on(ray_head.address, tmp_path, "--policy", str(overflow), *QUICK, "--run-id", "overflow")
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    # Where each card's NaN began: the first layer, the row, the layer's largest finite input (the observations).
    found = [r for r in read_table(tmp_path, "checks").to_pylist() if r["kind"] == "first_nonfinite"]
    assert {r["device_a"] for r in found} == {"sim-cpu0", "sim-cpu1"}
    assert all(r["layer"] == "body.0" and not r["gating"] and not r["passed"] for r in found)
    assert all(0 < r["input_max_abs"] < 10 and r["n_nonfinite"] > 0 for r in found)
    assert (
        "finding (not gating)" in failed.stdout and "first value not finite appeared at body.0 Linear(4, 16)" in failed.stdout
    )

    diagnosed = cli("diagnose", "overflow", "--results", str(tmp_path), "--address", ray_head.address)
    assert diagnosed.returncode == 0, diagnosed.stdout[-3000:] + diagnosed.stderr[-3000:]
    assert "step 1: float16+fp32[body.0,head]: PASS" in diagnosed.stdout
    assert "step 2: float16+fp32[body.0]: PASS" in diagnosed.stdout
    path = Path(diagnosed.stdout.strip().splitlines()[-1].removeprefix("plan: "))
    [plan] = read_plan(path).plans
    assert (plan.layers, plan.verified, plan.found_on) == (("body.0",), True, "sim-cpu0")
    assert [s.passed for s in plan.steps] == [True, True] and all(s.units > 0 and s.seconds > 0 for s in plan.steps)

    verified = sweep_on(ray_head.address, tmp_path, "--policy", str(overflow), *QUICK, "--keep-float32", str(path))
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    run_id = next(line.split()[1].rstrip(":") for line in verified.stdout.splitlines() if line.startswith("run "))
    rows = [r for r in read_table(tmp_path, "checks").to_pylist() if r["run_id"] == run_id]
    assert rows and {r["dtype"] for r in rows} == {"float16+fp32[body.0]"}
