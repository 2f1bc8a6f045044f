"""A bench row's validity as a table of rules: each rule a name and the reason a measurement
breaks it (None where the measurement meets it). A mode declares its table next to its
measurement; judging is the same for every mode."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from harness.judge.bench_stats import invalid_reason

M = TypeVar("M")


@dataclass(frozen=True)
class Rule(Generic[M]):
    name: str
    broken: Callable[[M], str | None]  # why the measurement breaks the rule; None where it meets it


@dataclass(frozen=True)
class Verdict:
    rule: str
    reason: str | None

    @property
    def met(self) -> bool:
        return self.reason is None


def judge(measurement: M, rules: Sequence[Rule[M]]) -> list[Verdict]:
    """Every rule's verdict on `measurement`, in the table's order."""
    return [Verdict(rule.name, rule.broken(measurement)) for rule in rules]


def verdict_reason(verdicts: Sequence[Verdict]) -> str:
    """The reasons of the rules broken, joined; empty for a valid row."""
    return invalid_reason(v.reason for v in verdicts)
