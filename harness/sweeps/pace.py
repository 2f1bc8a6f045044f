"""When a sweep's actor counts as hung, and how long one that restarts may take: from its own
pace alone, never another actor's. Pure: the driver (harness/sweeps/gather.py) gives it the clock.

A slow actor and a hung one both take long over a unit; what tells them apart is progress. An
actor shows progress when a result of its comes back and, while a unit runs, when its count of
episode steps moves (the driver asks it on a thread of its own). A slow one's progress keeps
coming, however slow the machine; a hung one's stops. So a unit has no deadline of its own: an
actor is hung once it has shown nothing for longer than HANG_MULTIPLE times the longest silence
it showed before and then broke (its own pace, on this machine, under its load), and never less
than `--hang-timeout`. Another actor's pace says nothing about this one's: the CPU reference
does more per unit than a card (its own episodes and their replay under the honest-card model),
and an earlier rule that gave it ten times the fastest card's time declared it hung on a busy
machine, then lost (issue 35).
"""

from __future__ import annotations

from dataclasses import dataclass

HANG_MULTIPLE = 10.0
# What a restart must be given, as a multiple of the longest start seen: the first start of the
# sweep's actors, or a restart since, each a process that imports torch and loads the policies.
RESTART_MARGIN = 2.0


@dataclass
class Pace:
    """One actor's progress as the driver has seen it: when it last showed any (or its clock
    started), and the longest silence it showed and then broke."""

    moved: float
    longest_quiet_s: float = 0.0

    def start(self, now: float) -> None:
        """Its clock starts over, with no silence to learn from: work given to an idle actor, an
        actor back from a restart."""
        self.moved = now

    def progressed(self, now: float) -> None:
        self.longest_quiet_s = max(self.longest_quiet_s, now - self.moved)
        self.moved = now

    def bound_s(self, hang_timeout_s: float) -> float:
        """How long it may show nothing before it counts as hung."""
        return max(hang_timeout_s, HANG_MULTIPLE * self.longest_quiet_s)

    def quiet_s(self, now: float) -> float:
        return now - self.moved

    def hung(self, now: float, hang_timeout_s: float) -> bool:
        return self.quiet_s(now) > self.bound_s(hang_timeout_s)


def restart_bound_s(placement_timeout_s: float, started_s: float, hang_timeout_s: float) -> float:
    """How long an actor that went away may take to be back: as long as a placement, RESTART_MARGIN
    times the longest start seen, or as long as an actor may show nothing (`--hang-timeout`: a
    restarting actor shows nothing), whichever is longest."""
    return max(placement_timeout_s, RESTART_MARGIN * started_s, hang_timeout_s)
