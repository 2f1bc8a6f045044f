"""A precision plan: for a (policy, dtype), the layers to compute in float32 so that the dtype
passes. `harness diagnose` writes one (harness/diagnose/search.py); `harness sweep --keep-float32
PLAN` reads it and runs each planned dtype under the label `float16+fp32[body.0]`, judged as any
dtype. A JSON file, so the same plan can be read by whatever deploys the policy."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.dtypes import CARD_DTYPES, kept_label
from harness.errors import UsageError
from harness.files import json_value, read_text

PLAN_VERSION = 1
# A plan is a few kilobytes; read no more than this.
MAX_PLAN_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Step:
    """One step of the search: the layers it kept, whether the dtype passed, what it cost (the
    seconds and the units run again)."""

    layers: tuple[str, ...]
    passed: bool
    seconds: float
    units: int


@dataclass(frozen=True)
class KeptLayers:
    """The plan of one (policy, dtype): `layers` computed in float32, in forward order."""

    policy: str
    dtype: str
    layers: tuple[str, ...]
    found_on: str = ""
    """The card the search ran on (the one that failed), as the run labelled it."""
    steps: tuple[Step, ...] = ()
    verified: bool = True
    """False where even every layer in float32 did not pass: `layers` is then all of them, no plan."""

    @property
    def label(self) -> str:
        return kept_label(self.dtype, self.layers)


@dataclass(frozen=True)
class Plan:
    run_id: str
    """The failing run the plan was searched for."""
    plans: tuple[KeptLayers, ...] = field(default_factory=tuple)

    def kept(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """(policy, dtype) -> the layers to keep in float32. ValueError naming the entry that
        applies nothing (no plan found, no layer kept) or a plan of no entries: a sweep of it
        would run the plain dtype under the plain label and pass as if the plan had."""
        if not self.plans:
            raise ValueError(f"the plan of run {self.run_id} holds no (policy, dtype): it keeps nothing in float32")
        for i, p in enumerate(self.plans):
            if not p.verified:
                raise ValueError(
                    f"plans[{i}] ({p.policy} {p.dtype}) is no plan: `harness diagnose` found none, every layer in "
                    "float32 still failed"
                )
            if not p.layers:
                raise ValueError(f"plans[{i}] ({p.policy} {p.dtype}) keeps no layer in float32")
        return {(p.policy, p.dtype): p.layers for p in self.plans}


@dataclass(frozen=True)
class KeptFloat32:
    """`--keep-float32 PLAN`: the plan file as given, and the layers it keeps by (policy, dtype)."""

    path: str
    kept: Mapping[tuple[str, str], tuple[str, ...]]

    @staticmethod
    def read(path: str) -> KeptFloat32:
        """ValueError for a plan that keeps nothing (see `Plan.kept`); UsageError for a file that
        is no plan."""
        return KeptFloat32(path, read_plan(Path(path)).kept())


def write_plan(path: Path, plan: Plan) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": PLAN_VERSION, **asdict(plan)}, indent=2) + "\n")
    return path


def read_plan(path: Path) -> Plan:
    """The plan in `path`; a UsageError saying what is wrong with a file that is not one."""
    text = read_text(path, MAX_PLAN_BYTES, "--keep-float32")
    try:
        raw = json_value(text)
        if raw.get("version") != PLAN_VERSION:
            raise ValueError(f"version {raw.get('version')!r}, this harness reads {PLAN_VERSION}")
        plans = tuple(_kept(p) for p in raw["plans"])
        return Plan(str(raw["run_id"]), plans)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--keep-float32 {path}: not a precision plan `harness diagnose` writes ({exc})") from None


def _kept(raw: Mapping[str, Any]) -> KeptLayers:
    dtype = str(raw["dtype"])
    if dtype not in CARD_DTYPES or dtype == "float32":
        raise ValueError(f"dtype {dtype!r}: a plan keeps layers of float16 or bfloat16 in float32")
    layers = tuple(str(name) for name in raw["layers"])
    if any(not name or "," in name or "]" in name for name in layers):
        raise ValueError(f"layer names {list(layers)!r}")
    steps = tuple(Step(tuple(s["layers"]), bool(s["passed"]), float(s["seconds"]), int(s["units"])) for s in raw["steps"])
    return KeptLayers(str(raw["policy"]), dtype, layers, str(raw["found_on"]), steps, bool(raw["verified"]))


def check_plan(
    kept: Mapping[tuple[str, str], tuple[str, ...]], policies: Mapping[str, list[str]], dtypes: Sequence[str]
) -> None:
    """UsageError for a plan that cannot apply to this sweep: a policy it does not run, a dtype
    it does not compute in, a layer the policy does not have (`policies`: each policy's layers
    a plan can name). A plan that never applied would read as a plan that passed."""
    for (policy, dtype), layers in kept.items():
        if policy not in policies:
            raise UsageError(f"--keep-float32: the plan is for policy {policy!r}, not among --policy ({', '.join(policies)})")
        if dtype not in dtypes:
            raise UsageError(f"--keep-float32: the plan is for {dtype}, and the sweep computes in {','.join(dtypes)}")
        unknown = [name for name in layers if name not in policies[policy]]
        if unknown:
            raise UsageError(
                f"--keep-float32: {policy} has no layer {', '.join(unknown)}; its layers: {', '.join(policies[policy])}"
            )
