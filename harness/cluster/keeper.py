"""The keeper of the warm cards of `harness up`: a small actor beside them that knows what they are,
lends them to one sweep at a time and counts their idle time. Light on purpose (no torch): it
starts in a process of its own while the cards start."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ray.util.placement_group import PlacementGroup

from harness.cluster.ray_internals import job_alive
from harness.devices.kind import Kind


@dataclass(frozen=True)
class WarmCards:
    """What `harness up` placed: the cards' kind and count, their placement group, and how long
    they stay up unused."""

    kind: Kind
    n_cards: int
    group: PlacementGroup
    idle_timeout_s: float


@dataclass(frozen=True)
class Lease:
    run_id: str
    job_id: str  # the sweep's driver: the lease ends when it is gone, however the sweep ended


class Keeper:
    def __init__(self, cards: WarmCards) -> None:
        self.cards = cards
        self.lease_: Lease | None = None
        self.last_used = time.monotonic()
        self.stop_asked = False

    def info(self) -> WarmCards:
        return self.cards

    def lease(self, run_id: str, job_id: str) -> str | None:
        """Lend the cards to run `run_id` of driver `job_id`; None where lent, else the run that holds them."""
        if self._held() and self.lease_ is not None and self.lease_.job_id != job_id:
            return self.lease_.run_id
        self.lease_, self.last_used = Lease(run_id, job_id), time.monotonic()
        return None

    def idle_s(self) -> float | None:
        """Seconds since the cards last served a sweep (0 while one holds them); None once asked to stop."""
        if self.stop_asked:
            return None
        if self._held():
            return 0.0
        return time.monotonic() - self.last_used

    def stop(self) -> None:
        self.stop_asked = True

    def _held(self) -> bool:
        """Whether a driver holds the cards; one that is gone gives them back, idle from now."""
        if self.lease_ is not None and not job_alive(self.lease_.job_id):
            self.lease_, self.last_used = None, time.monotonic()
        return self.lease_ is not None
