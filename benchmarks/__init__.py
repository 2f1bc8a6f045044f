"""Benchmarks: each measures two things side by side in one run and prints their ratio against
its target. Run them all with `python -m benchmarks`, or some by name:
`python -m benchmarks timer_overhead card_scaling`. Numbers depend on the machine and its load;
tests never assert them."""

from __future__ import annotations

from dataclasses import dataclass

import harness  # noqa: F401  (the device-backend guard, before any benchmark imports torch)


@dataclass(frozen=True)
class Comparison:
    name: str
    measured: dict[str, str]  # label -> the measured number, formatted with its unit
    ratio: float
    ratio_label: str  # what the ratio is, e.g. "harness / SB3 steps/s"
    target: float
    higher_is_better: bool = True
    notes: str = ""
    limit: float | None = None
    """The best ratio the two sides can honestly give (1.0 when the harness side does the other
    side's work plus more). A ratio past it means the two sides were not measured alike: the
    result is reported as suspect, never as a met target."""

    @property
    def suspect(self) -> bool:
        if self.limit is None:
            return False
        return self.ratio > self.limit if self.higher_is_better else self.ratio < self.limit

    @property
    def met(self) -> bool:
        if self.suspect:
            return False
        return self.ratio >= self.target if self.higher_is_better else self.ratio < self.target

    def render(self) -> str:
        width = max(map(len, self.measured))
        lines = [f"== {self.name}"]
        lines += [f"   {label:<{width}}  {value}" for label, value in self.measured.items()]
        relation = ">=" if self.higher_is_better else "<"
        verdict = (
            f"SUSPECT: past the honest limit {self.limit:g}, so the two sides differ in more than the harness"
            if self.suspect
            else ("MET" if self.met else "NOT MET")
        )
        lines.append(f"   {self.ratio_label}: {self.ratio:.3g} (target {relation} {self.target:g}): {verdict}")
        if self.notes:
            lines.append(f"   {self.notes}")
        return "\n".join(lines)
