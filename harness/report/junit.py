"""A run's checks as JUnit XML: what GitLab, Jenkins and GitHub Actions show as tests.

One `testcase` per gating check (a check the run's verdict depends on), named by where it was
made; a `failure` where it failed, carrying how far past its limit it went, the measures beside
their limits and the row's detail; an `error` where an actor produced nothing (a crash: no
measure to fail); `skipped` for a closed-loop verdict that is INCONCLUSIVE (it does not gate, and
it did not pass either). The suite's properties trace the verdict: the run id, the versions, the
devices, the revision. Built from the rows as stored, so `harness report` and a CI system read
the same verdicts; the XML is written by the standard library's ElementTree, which escapes.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.judge.kinds import CheckKind
from harness.judge.outcome import PUBLISHED
from harness.judge.results import measured_over_limit
from harness.judge.returns import Outcome
from harness.report.names import PolicyNames

# The measures a failure message shows where the row has them, each beside the limit it was held to.
MEASURES = (
    ("max_abs", "atol"),
    ("max_rel", "rtol"),
    ("cosine", "min_cos"),
    ("error_ratio", "ratio_limit"),
    ("max_flip_margin", "flip_margin_limit"),
    ("return_diff_low", "return_margin"),
    ("n_mismatch", None),
    ("max_ulp", None),
    ("n_illegal", None),
)
PROPERTIES = (
    "status",
    "accelerator",
    "n_cards",
    "harness_version",
    "torch_version",
    "ray_version",
    "git_revision",
    "hostname",
)


def is_testcase(row: Mapping[str, Any]) -> bool:
    """A gating check, or a closed-loop verdict that could not decide (shown as skipped)."""
    return bool(row["gating"]) or row.get("outcome") == Outcome.INCONCLUSIVE


def junit_tree(run_id: str, run: Mapping[str, Any], checks: Sequence[Mapping[str, Any]]) -> ET.Element:
    """The `testsuites` element of run `run_id` (its `runs` row `run`), each policy named as the
    summary names it."""
    names = PolicyNames.of(row["policy"] for row in checks)
    cases = [_testcase(row, names(row["policy"])) for row in checks if is_testcase(row)]
    counts = {tag: sum(case.find(tag) is not None for case in cases) for tag in ("failure", "error", "skipped")}
    suite = ET.Element(
        "testsuite",
        name=f"harness {run_id}",
        tests=str(len(cases)),
        failures=str(counts["failure"]),
        errors=str(counts["error"]),
        skipped=str(counts["skipped"]),
        timestamp=str(run.get("started_at") or ""),
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (("run_id", run_id), *((key, run.get(key)) for key in PROPERTIES), ("devices", _devices(run))):
        ET.SubElement(properties, "property", name=name, value="" if value is None else str(value))
    suite.extend(cases)
    root = ET.Element("testsuites", name="harness", tests=str(len(cases)), failures=str(counts["failure"]))
    root.set("errors", str(counts["error"]))
    root.append(suite)
    return root


def write_junit(path: Path, tree: ET.Element) -> None:
    """`tree` to `path`, atomically: a CI system never reads half a file."""
    ET.indent(tree)
    data = ET.tostring(tree, encoding="utf-8", xml_declaration=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _testcase(row: Mapping[str, Any], label: str) -> ET.Element:
    where = f"{row['workload']} {row['output']} {row['device_a']}" + (f" vs {row['device_b']}" if row["device_b"] else "")
    case = ET.Element("testcase", classname=f"{label} {row['dtype']} {row['kind']}", name=where)
    detail = str(row.get("detail") or "")
    if row["passed"]:
        return case
    if not row["gating"]:  # an inconclusive closed-loop verdict the run does not require to decide
        ET.SubElement(case, "skipped", message=f"inconclusive: {detail}")
    elif row["kind"] == CheckKind.ERROR:
        ET.SubElement(case, "error", message=detail.splitlines()[0] if detail else "the actor produced nothing").text = detail
    else:
        over = measured_over_limit(row)
        head = f"{over:.4g} times its limit" if over is not None else "not equal"
        measures = [_measure(row, measured, limit) for measured, limit in MEASURES if row.get(measured) is not None]
        failure = ET.SubElement(case, "failure", message=f"{row['kind']} failed: {head}: {detail}"[:1000], type=row["kind"])
        failure.text = "\n".join([*measures, detail])
    return case


def _measure(row: Mapping[str, Any], measured: str, limit: str | None) -> str:
    shown = f"{measured} = {row[measured]}"
    return f"{shown} (limit {limit} = {row[limit]})" if limit and row.get(limit) is not None else shown


def _devices(run: Mapping[str, Any]) -> str:
    """The devices as the runs row lists them: each one's kind, index and model."""
    try:
        devices = json.loads(run.get("devices") or "[]")
    except json.JSONDecodeError:
        return str(run.get("devices") or "")
    return ", ".join(f"{d.get('kind')}:{d.get('index')} ({d.get('model')})" for d in devices if isinstance(d, dict))


def junit(path: Path, run_id: str, status: str, run: Mapping[str, Any], checks: Sequence[Mapping[str, Any]]) -> None:
    """--junit-xml PATH: the checks of run `run_id` (its `runs` row `run`), once it has published
    them (`status`), as JUnit XML at `path`. A run that stopped early has no verdict to give: it
    says so instead."""
    if status not in PUBLISHED:
        print(f"harness: no JUnit XML written to {path}: the run is {status}, its checks are not all made", file=sys.stderr)
        return
    tree = junit_tree(run_id, run, checks)
    write_junit(path, tree)
    print(f"junit: {tree.get('tests')} testcases, {tree.get('failures')} failed, in {path}")
