"""Where a batch unit's failure began: the layer searches that follow it, as units of their own.

Once the judge has failed a batch unit's rows, `Searches.follow` names what to look for there:
for each card that failed the port, the first layer where it parts from card 0 bit for bit or
from the golden by the port rule; where the dtype itself overflows (the CPU in the card's dtype
too), from the CPU reference's captures; where a card's first NaN or inf appeared. Each search is
a `LocateWork` unit, sent and gathered as any unit is (harness/sweeps/dispatch.py,
harness/sweeps/gather.py), so it queues behind the actors' other work and is watched as it is.

A search is asked once: per failing card, dtype and kind of check (later batches that fail the
same way name that batch's answer), per policy and dtype for the overflow, per card, policy and
dtype for the first NaN or inf (later batches that show it add nothing). The batch unit's rows
are held until every search they name is judged; `localized` then adds what was found: notes in
the failing rows' `detail`, a `first_nonfinite` finding row per card. A search's unit id is a
hash of what it computes (plan.unit_id); it is never staged on its own, so a resumed run asks
again the searches of the batch units it runs again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from harness.judge.golden import GoldenComparison
from harness.judge.kinds import CheckKind
from harness.judge.verdicts import Check
from harness.policies import PolicyNet
from harness.store.schema import CheckRow
from harness.sweeps.dispatch import Located, check_row
from harness.sweeps.plan import LocateWork, Search, Unit, unit_id
from harness.workloads import ObsBatch

# The checks whose failures are searched, and the search each asks for.
SEARCHED = {CheckKind.CROSS_CARD: Search.CROSS_CARD, CheckKind.CPU_REFERENCE: Search.PORT}
# The dtype's own checks that fail on values it cannot hold: each names where the overflow began.
OVERFLOWED = (CheckKind.TOLERANCE, CheckKind.DECISIONS)


@dataclass(frozen=True)
class Ask:
    """One search a batch unit's rows wait for, and the rows (by index) that take what it finds."""

    search: Unit
    rows: tuple[int, ...]
    found_on: str = ""
    """The workload an earlier batch asked this search on, which the note names before what was found."""


@dataclass
class Held:
    """A judged batch unit whose rows wait for their searches."""

    unit: Unit
    rows: list[CheckRow]
    asks: list[Ask]


class Searches:
    """The layer searches of one fan-out, each asked once, and the batch units waiting for them."""

    def __init__(self, policies: Mapping[str, PolicyNet], lane_of: Callable[[str], int]) -> None:
        """`lane_of`: a card's place in the card order, from the label its rows carry."""
        self.policies = policies
        self.lane_of = lane_of
        self.asked: dict[tuple[str, str, Search, str], tuple[Unit, str]] = {}  # -> the search, the workload it was asked on
        self.found: dict[str, Located] = {}  # by the search's unit id
        self.held: list[Held] = []

    def follow(self, unit: Unit, batch: ObsBatch, rows: list[CheckRow]) -> list[Unit]:
        """Hold the rows of batch unit `unit` until the searches they name are judged; the searches
        not asked before, to send."""
        asks: list[Ask] = []
        new: list[Unit] = []

        def search(kind: Search, label: str) -> tuple[Unit, str]:
            """The search of `kind` on card `label` ("" for the overflow: the CPU's), and the
            workload of an earlier batch that asked it ("" where this one asks it)."""
            key = (unit.policy, unit.dtype, kind, label)
            if key in self.asked:
                return self.asked[key]
            work = LocateWork(kind, batch, self.lane_of(label) if label else None)
            searched = Unit(unit_id(self.policies[unit.policy], unit.dtype, work), unit.policy, unit.dtype, work)
            self.asked[key] = (searched, batch.name)
            new.append(searched)
            return searched, ""

        for kind, label in sorted({(CheckKind(r.kind), r.device_a) for r in rows if not r.passed and r.kind in SEARCHED}):
            searched, found_on = search(SEARCHED[kind], label)
            failed = tuple(i for i, r in enumerate(rows) if (r.kind, r.device_a) == (kind, label) and not r.passed)
            asks.append(Ask(searched, failed, found_on))
        if cards := {r.device_a for r in rows if _forgave_overflow(r)}:
            searched, _ = search(Search.OVERFLOW, "")  # its note names the batch it was found on, whichever asks
            named = tuple(
                i
                for i, r in enumerate(rows)
                if r.device_a in cards and (_forgave_overflow(r) or (r.kind in OVERFLOWED and not r.passed))
            )
            asks.append(Ask(searched, named))
        for i, row in enumerate(rows):
            if _not_finite_on_card(row) and (unit.policy, unit.dtype, Search.NONFINITE, row.device_a) not in self.asked:
                asks.append(Ask(search(Search.NONFINITE, row.device_a)[0], (i,)))
        self.held.append(Held(unit, rows, asks))
        return new

    def judged(self, search: Unit, located: Located) -> None:
        self.found[search.unit_id] = located

    def ready(self) -> list[tuple[Unit, list[CheckRow]]]:
        """The held batch units whose every search is judged, in the order they were held, each
        with its rows as `localized` makes them; they are held no longer."""
        ready: list[Held] = []
        waiting: list[Held] = []
        for held in self.held:
            (ready if all(a.search.unit_id in self.found for a in held.asks) else waiting).append(held)
        self.held = waiting
        return [(h.unit, localized(h.unit, h.rows, h.asks, self.found)) for h in ready]


def localized(unit: Unit, rows: list[CheckRow], asks: list[Ask], found: Mapping[str, Located]) -> list[CheckRow]:
    """`rows` (left as they are) with what their searches found, in the order the searches were
    asked: a note in the detail of each row an ask names; a card's first NaN or inf as a
    `first_nonfinite` finding row, after the unit's rows."""
    noted = [replace(row) for row in rows]
    findings = []
    for ask in asks:
        located = found[ask.search.unit_id]
        if located.nonfinite is not None:
            [row] = [noted[i] for i in ask.rows]
            check = Check(row.output, CheckKind.FIRST_NONFINITE, row.device_a, row.device_b, False, located.nonfinite)
            findings.append(
                check_row(
                    check,
                    unit_id=unit.unit_id,
                    policy=unit.policy,
                    dtype=unit.dtype,
                    workload=unit.workload,
                    input_sha256=unit.work.input_sha256,
                )
            )
            continue
        note = f"as found on {ask.found_on}: {located.note}" if ask.found_on else located.note
        for i in ask.rows:
            noted[i].note(note)
    return noted + findings


def _not_finite_on_card(row: CheckRow) -> bool:
    """A port row whose card computed NaN or inf where the golden did not (forgiven or not)."""
    result = row.result
    return (
        row.kind == CheckKind.CPU_REFERENCE
        and isinstance(result, GoldenComparison)
        and (result.n_overflow > 0 or not math.isfinite(result.max_abs))
    )


def _forgave_overflow(row: CheckRow) -> bool:
    """A port row that judged the card where both computed finite values: the dtype overflowed."""
    return row.kind == CheckKind.CPU_REFERENCE and isinstance(row.result, GoldenComparison) and row.result.n_overflow > 0
