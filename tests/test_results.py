"""A check's result owns its rule and its columns (harness/judge/results.py): the `checks` columns
are its fields, a stored row reads back into the result it was, and how near its limit a row came
is the result's to say. A kind added and not handled is a mypy error; registered, it is a column."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from harness.judge.compare import Comparison, Tolerance, compare_bitwise, compare_decisions, compare_tolerance
from harness.judge.golden import RatioLimits, compare_to_golden
from harness.judge.kinds import CheckKind
from harness.judge.results import COLUMNS, Result, measured_over_limit, read_result, result_types
from harness.judge.verdicts import Check, ClosedLoopRules, Paired, error_check, judge_returns
from harness.store.schema import SCHEMAS, CheckRow
from harness.store.writer import to_table
from tests.helpers import REPO

MYPY = str(Path(sys.executable).parent / "mypy")
RNG = np.random.default_rng(0)
REF = RNG.standard_normal((8, 4)).astype(np.float32)


def _stored(kind: CheckKind, result: Result) -> dict[str, object]:
    """The row as it comes back from Parquet."""
    row = CheckRow("u", "p", "float32", "w", "logits", kind, "card0", "cpu", "ab", True, result)
    table = to_table("checks", [row])
    assert table.schema == SCHEMAS["checks"]
    [stored] = table.to_pylist()
    return stored


def _results() -> list[tuple[CheckKind, Result]]:
    golden = REF.astype(np.float64)
    returns = Paired(np.arange(30), RNG.normal(100, 5, 30), RNG.normal(100, 5, 30), [3] * 30, [4] * 30)
    return [
        (CheckKind.CROSS_CARD, compare_bitwise(REF, REF + np.float32(1e-3))),
        (CheckKind.TOLERANCE, compare_tolerance(REF + np.float32(1e-3), REF, Tolerance(1e-4, 0.0, 0.9))),
        (CheckKind.CPU_REFERENCE, compare_to_golden(REF * 1.01, REF, golden, "float32", RatioLimits())),
        (CheckKind.DECISIONS, compare_decisions(np.array([0, 1]), np.array([0, 0]), np.array([[1.0, 0.9], [2.0, 0.0]]), 0.5)),
        (CheckKind.EPISODE_RETURN, judge_returns("card0", returns, ClosedLoopRules()).result),
        (CheckKind.ERROR, error_check("card0", "died").result),
    ]


def _same(a: object, b: object) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize(("kind", "result"), _results(), ids=lambda x: str(x) if isinstance(x, CheckKind) else "")
def test_a_stored_row_reads_back_into_the_result_it_was(kind: CheckKind, result: Result) -> None:
    stored = _stored(kind, result)
    back = read_result(stored)
    assert type(back) is type(result)
    assert all(_same(getattr(back, f.name), getattr(result, f.name)) for f in fields(result)), (back, result)
    filled = {f.name for f in fields(result)}
    assert all(stored[name] is None for name, _ in COLUMNS if name not in filled), "a result fills only its own columns"
    over = measured_over_limit(stored)
    assert _same(over, result.over_limit())


def test_over_limit_is_the_rule_that_passed_or_failed_the_result() -> None:
    tol = Tolerance(atol=0.01, rtol=0.0, min_cos=0.0)
    within, beyond = compare_tolerance(REF + np.float32(0.005), REF, tol), compare_tolerance(REF + np.float32(0.02), REF, tol)
    assert within.passed and within.over_limit() <= 1 and not beyond.passed and beyond.over_limit() > 1
    golden = REF.astype(np.float64)
    right = compare_to_golden(REF, REF, golden, "float32", RatioLimits())
    off = compare_to_golden(REF * 1.01, REF, golden, "float32", RatioLimits())  # a fault: a 1% gain on the card
    assert right.passed and (right.over_limit() or 0) <= 1 and not off.passed and (off.over_limit() or 0) > 1


def test_a_check_refuses_a_result_its_kind_does_not_hold() -> None:
    table = compare_tolerance(REF, REF, Tolerance(1e-4, 0.0, 0.9))
    assert Check("logits", CheckKind.TOLERANCE, "card0", "cpu", True, table).passed
    with pytest.raises(TypeError, match="a cross_card check cannot hold a ToleranceComparison"):
        Check("logits", CheckKind.CROSS_CARD, "card0", "card1", True, table)
    assert Comparison in result_types(CheckKind.CROSS_CARD)


def test_the_checks_columns_are_where_then_every_result_column() -> None:
    names = SCHEMAS["checks"].names
    assert names[:11] == [
        "unit_id", "policy", "dtype", "workload", "output", "kind", "device_a", "device_b", "input_sha256", "gating", "passed",
    ]  # fmt: skip
    assert names[11:] == [name for name, _ in COLUMNS[1:]] and names[-1] == "detail"


TOY = '''"""A toy check: one number against a limit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToyComparison:
    passed: bool
    n_elements: int
    toy_score: float
    detail: str

    def over_limit(self) -> float:
        return self.toy_score
'''


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}"
    path.write_text(text.replace(old, new, 1))


def _mypy(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [MYPY, "--cache-dir", str(root / ".mypy_cache"), "harness/judge", "harness/store/schema.py"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_a_toy_check_kind_fails_mypy_until_handled_then_is_a_column(tmp_path: Path) -> None:
    shutil.copytree(REPO / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    judge = tmp_path / "harness" / "judge"
    _replace(judge / "kinds.py", '    BENCH_AUDIT = "bench_audit"', '    BENCH_AUDIT = "bench_audit"\n    TOY = "toy"')
    proc = _mypy(tmp_path)
    assert proc.returncode == 1 and "harness/judge/results.py" in proc.stdout, proc.stdout[-3000:]
    assert '"assert_never" has incompatible type "Literal[CheckKind.TOY]"' in proc.stdout, proc.stdout[-3000:]

    # Handled: a new module with its result type, and its registration in results.py.
    (judge / "toy.py").write_text(TOY)
    results = judge / "results.py"
    _replace(
        results,
        "from harness.judge.returns import ReturnComparison",
        "from harness.judge.returns import ReturnComparison\nfrom harness.judge.toy import ToyComparison",
    )
    _replace(results, "| ReturnComparison\n", "| ReturnComparison | ToyComparison\n")
    _replace(results, "    | type[ReturnComparison]\n", "    | type[ReturnComparison]\n    | type[ToyComparison]\n")
    _replace(results, ",\n)\n\n\ndef result_types", ",\n    ToyComparison,\n)\n\n\ndef result_types")
    _replace(
        results,
        "        case _:\n            assert_never(kind)",
        "        case CheckKind.TOY:\n            return (ToyComparison,)\n        case _:\n            assert_never(kind)",
    )
    proc = _mypy(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    script = (
        "from harness.store.schema import SCHEMAS; from harness.judge.results import read_result; "
        "s = SCHEMAS['checks']; print(s.field('toy_score').type, s.names[-1]); "
        "print(read_result({'kind': 'toy', 'passed': False, 'n_elements': 1, 'toy_score': 2.5, 'detail': 'x'}).over_limit())"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert out.split() == ["double", "detail", "2.5"], out
