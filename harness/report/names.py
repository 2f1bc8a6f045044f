"""A policy's name where a run is shown: the summary, the sign-off page, the comparison page.

A policy is given as a name (`cartpole`) or a path, and the paths of a run often share their file
name: every RL Zoo agent of one environment is `<algo>/<Env>_1/<Env>.zip`. So a policy is named
by the shortest end of its path, in whole components, that no other policy of the run ends in:
the file name alone where that is unique (`CartPole-v1.zip`), else as many folders as tell it
apart (`ppo/HalfCheetah-v3_1/HalfCheetah-v3.zip`). Where folders were needed and the file only
repeats its folder's name (the RL Zoo's `<Env>_<n>/<Env>.zip`), the file is left off
(`ppo/HalfCheetah-v3_1`), unless that would name two policies alike. Where a full path is needed,
the policy reads as it was given.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyNames:
    """The label of each policy of a run (`PolicyNames.of(policies)(policy)`)."""

    labels: dict[str, str]

    @classmethod
    def of(cls, policies: Iterable[str]) -> PolicyNames:
        given = list(dict.fromkeys(policies))
        parts = {p: _components(p) for p in given}
        ends = {p: _unique_end(p, parts) for p in given}
        shortened = {p: _without_repeated_file(parts[p][-k:]) for p, k in ends.items() if k > 1}
        taken = Counter([*shortened.values(), *(_label(parts[p], k, p) for p, k in ends.items())])
        labels = {}
        for p, k in ends.items():
            short = shortened.get(p)
            labels[p] = short if short is not None and taken[short] == 1 else _label(parts[p], k, p)
        return cls(labels)

    def __call__(self, policy: str) -> str:
        """The policy's label; a policy the run did not name, by its file name."""
        return self.labels.get(policy) or _components(policy)[-1]

    @property
    def width(self) -> int:
        """The longest label: a text table's column fits it, so no two labels are cut alike."""
        return max(map(len, self.labels.values()), default=0)


def _components(policy: str) -> list[str]:
    return [part for part in policy.split("/") if part] or [policy]


def _unique_end(policy: str, parts: dict[str, list[str]]) -> int:
    """The fewest trailing components of `policy` that no other policy ends in; all of them where
    none are (one path is the end of another)."""
    mine = parts[policy]
    for k in range(1, len(mine) + 1):
        if all(other[-k:] != mine[-k:] for p, other in parts.items() if p != policy):
            return k
    return len(mine)


def _label(parts: list[str], k: int, policy: str) -> str:
    return policy if k == len(parts) else "/".join(parts[-k:])


def _without_repeated_file(end: list[str]) -> str | None:
    """`end` without its file where the file repeats its folder's name (`<Env>_<n>/<Env>.zip`)."""
    folder, file = end[-2], end[-1]
    stem = file.rsplit(".", 1)[0]
    return "/".join(end[:-1]) if re.fullmatch(rf"{re.escape(stem)}(_\d+)?", folder) else None
