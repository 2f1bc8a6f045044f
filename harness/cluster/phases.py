"""Where a run's wall time goes, by phase, and the line that says so at its end. Light on purpose:
the command starts timing before it imports the driver (torch, Ray), so the imports are a phase."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

# The phases as the end of a run lists them, with the names a user reads.
PHASE_NAMES = {
    "imports": "imports",
    "plan": "plan",
    "ray": "Ray start-up",
    "actors": "actors start-up",
    "fanout": "fan-out",
    "compute": "compute",
    "judge": "judge",
    "write": "write",
    "shutdown": "Ray shutdown",
}


@dataclass
class Phases:
    """Where the wall time went, by phase: `with phases("compute"): ...` adds to that phase."""

    seconds: dict[str, float] = field(default_factory=dict)
    created: float = field(default_factory=time.perf_counter)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def __getitem__(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    @property
    def startup(self) -> float:
        """Ray's start (or joining it) and the actors' (placing, importing, loading policies)."""
        return self["ray"] + self["actors"]

    def as_json(self) -> dict[str, float]:
        return {f"{name}_s": round(seconds, 3) for name, seconds in self.seconds.items()}

    def line(self) -> str:
        """The phases in the order they happen, and the wall time since these phases began."""
        total = time.perf_counter() - self.created
        named = [f"{PHASE_NAMES.get(n, n)} {s:.1f} s" for n, s in sorted(self.seconds.items(), key=_phase_order)]
        outside = total - sum(self.seconds.values())
        return f"time: {', '.join(named)}; {total:.1f} s in all ({outside:.1f} s outside these)"


def _phase_order(item: tuple[str, float]) -> int:
    names = list(PHASE_NAMES)
    return names.index(item[0]) if item[0] in names else len(names)
