"""What a check measured and the rule it was judged by: one result type per rule, each with its
`passed`, its `over_limit()` (how near its limit it came, unitless: 1 is the limit) and, as its
fields, the `checks` columns it fills.

The `checks` table's result columns are the union of these types' fields (`COLUMNS`), so a
field added to a result is a column, and `result_types` says which types a kind of check holds:
a `match` over `CheckKind` ending in `assert_never`, so a kind added and not handled here is a
mypy error; `KINDS` finds them by the kind's name. `read_result` turns a stored row back into
its result, so the summary and the report ask the result, never recompute a rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any, assert_never

from harness.judge.compare import Comparison, DecisionComparison, EpisodeComparison, MaskComparison, ToleranceComparison
from harness.judge.golden import GoldenComparison
from harness.judge.kinds import CheckKind
from harness.judge.localize import FirstNonFinite
from harness.judge.returns import ReturnComparison
from harness.registry import Registry

Result = (
    Comparison
    | ToleranceComparison
    | GoldenComparison
    | DecisionComparison
    | EpisodeComparison
    | ReturnComparison
    | FirstNonFinite
    | MaskComparison
)
ResultType = (
    type[Comparison]
    | type[ToleranceComparison]
    | type[GoldenComparison]
    | type[DecisionComparison]
    | type[EpisodeComparison]
    | type[ReturnComparison]
    | type[FirstNonFinite]
    | type[MaskComparison]
)

# The order of the columns: each type adds the fields the ones before did not have; `detail` last.
_COLUMN_ORDER: tuple[ResultType, ...] = (
    Comparison,
    GoldenComparison,
    ToleranceComparison,
    DecisionComparison,
    EpisodeComparison,
    ReturnComparison,
    FirstNonFinite,
    MaskComparison,
)


def result_types(kind: CheckKind) -> tuple[ResultType, ...]:
    """The result types a kind of check holds, in the order a stored row is read back as them."""
    match kind:
        case CheckKind.ERROR | CheckKind.BATCH_INVARIANCE | CheckKind.BENCH_AUDIT:
            return (Comparison,)
        case CheckKind.CROSS_CARD:
            # Outputs bit for bit; episode trajectories bit for bit.
            return (Comparison, EpisodeComparison)
        case CheckKind.CPU_REFERENCE:
            return (GoldenComparison,)
        case CheckKind.DECISIONS:
            return (DecisionComparison,)
        case CheckKind.EPISODE_RETURN | CheckKind.PUBLISHED_RETURN:
            return (ReturnComparison,)
        case CheckKind.TOLERANCE:
            return (ToleranceComparison,)
        case CheckKind.FIRST_NONFINITE:
            return (FirstNonFinite,)
        case CheckKind.MASKED_ACTIONS:
            return (MaskComparison,)
        case CheckKind.ONNX_REFERENCE:
            # Floating outputs by the port rule; integer ones (actions) bit for bit.
            return (GoldenComparison, Comparison)
        case _:
            assert_never(kind)


KINDS: Registry[tuple[ResultType, ...]] = Registry("check kind", {str(kind): result_types(kind) for kind in CheckKind})
"""Each kind of check by its name (the `checks.kind` column), with the result types it holds."""


def holds(kind: CheckKind, result: Result) -> bool:
    """Whether `result` is of a type `kind` holds (a tolerance result is no bitwise one)."""
    return type(result) in result_types(kind)


def _base(annotation: object) -> str:
    """A field's annotation without its None: the column's type (`int | None` -> `int`)."""
    return str(annotation).removesuffix(" | None")


def _columns() -> tuple[tuple[str, str], ...]:
    found: dict[str, str] = {}
    for result_type in _COLUMN_ORDER:
        for f in fields(result_type):
            if found.setdefault(f.name, _base(f.type)) != _base(f.type):
                raise TypeError(f"column {f.name} is {found[f.name]} in one result type, {_base(f.type)} in {result_type}")
    detail = found.pop("detail")
    return (*found.items(), ("detail", detail))


COLUMNS = _columns()
"""The result columns of `checks`, in order, each with its type's name (`bool`, `int`, `float`, `str`)."""


def columns_of(result: Result) -> dict[str, Any]:
    """The columns `result` fills, by name; the others are null in its row."""
    return {f.name: getattr(result, f.name) for f in fields(result)}


def _required(result_type: ResultType) -> tuple[str, ...]:
    """The columns a row of this type always fills (those that may be None, or have a default, need not)."""
    return tuple(f.name for f in fields(result_type) if not str(f.type).endswith("| None") and f.default is MISSING)


def read_result(row: Mapping[str, Any]) -> Result | None:
    """A stored `checks` row as its result: the first of its kind's types whose columns it fills;
    None for a row none fits (one written before a column it needs existed)."""
    for result_type in KINDS.get(row["kind"]):
        if all(row.get(name) is not None for name in _required(result_type)):
            filled: dict[str, Any] = {f.name: row.get(f.name) for f in fields(result_type)}
            return result_type(**filled)
    return None


def measured_over_limit(row: Mapping[str, Any]) -> float | None:
    """How close a stored row came to its limit, unitless: 1 is the limit, above it fails. None
    for checks with no limit to be near (bit for bit, errors) or a row no result type reads."""
    result = read_result(row)
    return None if result is None else result.over_limit()
