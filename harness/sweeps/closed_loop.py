"""Closed-loop verdicts over every episode of a mode: the rounds `--episodes auto` plays, and the
episode_return and published_return checks, judged once a mode's rounds are done.

Episode units (harness/sweeps/plan.py `EpisodeWork`) are rounds: the first is planned with the
sweep's other units; with `--episodes auto` each further round of a mode plays the seeds after
the last round's, on the dtypes whose verdict is still INCONCLUSIVE, so its unit id is stable.
Its size comes from the episodes the open verdicts say would decide, at least twice and at most
AUTO_GROWTH times what was played, until every verdict is conclusive or a cap is reached: the
episodes per mode (`--auto-max-episodes`) or the seconds spent on further rounds
(`--auto-max-seconds`).

The verdicts are units of their own (no actor runs them), staged like any unit under an id of
their policy, dtype, mode and seeds. `--resume` replays the decisions in order from the staged
rows, each round judged on the rounds before it, so a resumed run plays the rounds an
uninterrupted one would (the time cap aside: a resumed run has its own).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from harness.judge.returns import Outcome, ReturnComparison
from harness.judge.verdicts import (
    HONEST,
    REFERENCE,
    Check,
    ClosedLoopRules,
    Paired,
    Published,
    judge_published,
    judge_returns,
)
from harness.policies import PolicyNet
from harness.config.command_plan import SweepPlan
from harness.config.options import AUTO_EPISODES
from harness.sweeps.plan import PUBLISHED_DTYPE, EpisodeWork, Unit, unit_id
from harness.store.schema import EpisodeRow

# A further round plays at least twice the episodes played, and at most this many times: the
# estimate of episodes needed, from a few dozen, is rough.
AUTO_GROWTH = 8

Mode = tuple[str, bool, str]
"""A policy's episodes of one kind: (policy, stochastic, batching)."""


@dataclass
class Group:
    """The episodes of one policy, dtype and mode, round after round, as rows."""

    mode: Mode
    dtype: str
    rounds: list[EpisodeWork] = field(default_factory=list)
    rows: list[EpisodeRow] = field(default_factory=list)

    @property
    def played(self) -> int:
        return sum(len(w.seeds) for w in self.rounds)

    def paired(self) -> dict[str, Paired]:
        """Each card's returns and the CPU's of the same seeds, in seed order."""
        by_device: dict[str, dict[int, EpisodeRow]] = {}
        for row in self.rows:
            by_device.setdefault(row.device, {})[row.episode_seed] = row
        cpu, honest = by_device.get(REFERENCE, {}), by_device.get(HONEST, {})
        pairs = {}
        for device, episodes in by_device.items():
            if device in (REFERENCE, HONEST):
                continue
            seeds = sorted(s for s in episodes if s in cpu)
            pairs[device] = Paired(
                seeds=np.asarray(seeds, dtype=np.int64),
                card=np.asarray([episodes[s].episode_return for s in seeds], dtype=np.float64),
                cpu=np.asarray([cpu[s].episode_return for s in seeds], dtype=np.float64),
                card_steps=[episodes[s].first_divergent_step for s in seeds],
                honest_steps=[honest[s].first_divergent_step if s in honest else None for s in seeds],
            )
        return pairs


@dataclass(frozen=True)
class Verdict:
    """A closed-loop check and the unit it is staged as."""

    unit_id: str
    policy: str
    dtype: str
    workload: str
    input_sha256: str
    check: Check


class ClosedLoop:
    """Every episode unit's rows by policy, dtype and mode; the rounds still to play; the verdicts."""

    def __init__(self, plan: SweepPlan, policies: dict[str, PolicyNet]) -> None:
        self.rules = ClosedLoopRules(plan.margin, plan.require_conclusive, plan.published_gates)
        self.policies = policies
        self.seed = plan.common.seed
        self.auto = plan.episodes == AUTO_EPISODES
        self.max_episodes = plan.auto_max_episodes
        self.max_seconds = plan.auto_max_seconds
        self.groups: dict[tuple[Mode, str], Group] = {}
        self.stopped = ""  # why --episodes auto played no further round
        self._started: float | None = None

    def add(self, unit: Unit, rows: list[EpisodeRow]) -> None:
        """An episode unit's rows, as it was judged (or as a resumed run staged it)."""
        work = unit.work
        assert isinstance(work, EpisodeWork)
        mode = (unit.policy, work.stochastic, work.batching)
        group = self.groups.setdefault((mode, unit.dtype), Group(mode, unit.dtype))
        group.rounds.append(work)
        group.rows += rows

    def verdicts(self) -> list[Verdict]:
        """episode_return per card, dtype and mode; published_return per policy, on the CPU's
        episodes of the mode it was published in."""
        verdicts = [
            self._verdict(mode, dtype, "returns", group.rounds, check)
            for (mode, dtype), group in self.groups.items()
            for check in self._return_checks(group)
        ]
        verdicts += [
            self._verdict(mode, PUBLISHED_DTYPE, "published", self._rounds_of(mode), self._published_check(mode))
            for mode in self._published_modes()
        ]
        return verdicts

    def next_round(self) -> list[Unit]:
        """With `--episodes auto`: the next round of every mode with a verdict still open, or
        nothing once every verdict is conclusive or a cap is reached (`stopped` says which)."""
        if not self.auto:
            return []
        if self._started is None:
            self._started = time.monotonic()
        open_modes = self._open()
        if not open_modes:
            self.stopped = "every closed-loop verdict is conclusive"
            return []
        if time.monotonic() - self._started >= self.max_seconds:
            self.stopped = f"the time cap (--auto-max-seconds {self.max_seconds:g}) was reached"
            return []
        units: list[Unit] = []
        for mode, (groups, needed) in open_modes.items():
            played = max(g.played for g in self.groups.values() if g.mode == mode)
            if played >= self.max_episodes:
                continue
            grown = min(needed or 2 * played, AUTO_GROWTH * played)
            target = min(self.max_episodes, max(2 * played, grown))
            last = groups[0].rounds[-1]
            work = EpisodeWork(last.env, tuple(range(self.seed + played, self.seed + target)), mode[1], mode[2])
            policy = self.policies[mode[0]]
            units += [Unit(unit_id(policy, g.dtype, work), mode[0], g.dtype, work) for g in groups]
        if not units:
            self.stopped = f"the episode cap (--auto-max-episodes {self.max_episodes}) was reached"
        return units

    def describe(self) -> str:
        """What --episodes auto did, for the summary (empty without it)."""
        if not self.auto:
            return ""
        played = sorted({g.played for g in self.groups.values()})
        shown = ", ".join(map(str, played)) if played else "none"
        return (
            f"--episodes auto: {shown} episodes per mode (caps: {self.max_episodes} episodes, {self.max_seconds:g} s); "
            f"stopped: {self.stopped or 'not started'}"
        )

    def _return_checks(self, group: Group) -> list[Check]:
        std = self._published_std(group.mode)
        return [judge_returns(label, paired, self.rules, std) for label, paired in group.paired().items()]

    def _published_check(self, mode: Mode) -> Check:
        score = self.policies[mode[0]].info.published
        assert score is not None
        cpu = {
            row.episode_seed: row.episode_return
            for (m, _), group in self.groups.items()
            if m == mode
            for row in group.rows
            if row.device == REFERENCE
        }
        returns = np.asarray([cpu[s] for s in sorted(cpu)], dtype=np.float64)
        return judge_published(returns, Published(score.mean, score.std, score.n_episodes, score.source), self.rules)

    def _open(self) -> dict[Mode, tuple[list[Group], int | None]]:
        """Per mode, the groups with a verdict still INCONCLUSIVE and the most episodes any of
        them says would decide; a required published score still undecided keeps its mode's
        first group open."""
        found: dict[Mode, tuple[list[Group], int | None]] = {}

        def keep(group: Group, checks: list[Check]) -> None:
            undecided = [
                c.result for c in checks if isinstance(c.result, ReturnComparison) and c.result.outcome == Outcome.INCONCLUSIVE
            ]
            if not undecided:
                return
            groups, most = found.get(group.mode, ([], None))
            needed = [r.episodes_needed for r in undecided if r.episodes_needed is not None]
            found[group.mode] = ([*groups, group] if group not in groups else groups, max([*needed, most or 0]) or None)

        for group in self.groups.values():
            keep(group, self._return_checks(group))
        if self.rules.published_gates:
            for mode in self._published_modes():
                first = next(g for g in self.groups.values() if g.mode == mode)
                keep(first, [self._published_check(mode)])
        return found

    def _published_std(self, mode: Mode) -> float | None:
        """The published standard deviation, where the policy states one for this mode."""
        score = self.policies[mode[0]].info.published
        return score.std if score is not None and score.deterministic != mode[1] else None

    def _published_modes(self) -> list[Mode]:
        """Each played mode a policy's score was published in."""
        modes = dict.fromkeys(g.mode for g in self.groups.values())
        return [m for m in modes if (score := self.policies[m[0]].info.published) is not None and score.deterministic != m[1]]

    def _rounds_of(self, mode: Mode) -> list[EpisodeWork]:
        """Every round played in a mode, by any dtype, once each (a seed's CPU episode is the
        same whichever dtype's unit ran it)."""
        rounds = {w.seeds: w for g in self.groups.values() if g.mode == mode for w in g.rounds}
        return [rounds[s] for s in sorted(rounds)]

    def _verdict(self, mode: Mode, dtype: str, what: str, rounds: list[EpisodeWork], check: Check) -> Verdict:
        workload = _workload(what, mode, rounds)
        sha = hashlib.sha256("|".join(w.input_sha256 for w in rounds).encode()).hexdigest()
        text = f"{self.policies[mode[0]].info.sha256}|{dtype}|{workload}|{sha}"
        return Verdict(hashlib.sha256(text.encode()).hexdigest()[:16], mode[0], dtype, workload, sha, check)


def _workload(what: str, mode: Mode, rounds: list[EpisodeWork]) -> str:
    seeds = sorted(s for w in rounds for s in w.seeds)
    kind = "stochastic" if mode[1] else "deterministic"
    return f"{what}-{kind}-{len(seeds)}x-s{seeds[0] if seeds else 0}-{mode[2]}"
