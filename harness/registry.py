"""One kind of registry for every table of named things the harness dispatches on: commands,
policy formats, accelerators, check kinds, fault kinds. Names in registration order (the order help lists
them, and `--accelerator auto` tries them); a name registered twice is refused, never silently
replaced; a name looked up and not found is a usage mistake that says what is known and the
nearest name ("did you mean").
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar

from harness.errors import UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names to entries of one kind; `what` names the kind in messages (`accelerator`, `--accelerator`)."""

    def __init__(self, what: str, entries: Mapping[str, T] | None = None) -> None:
        self.what = what
        self._entries: dict[str, T] = {}
        for name, entry in (entries or {}).items():
            self.register(name, entry)

    def register(self, name: str, entry: T, *, before: str | None = None) -> T:
        """Add `entry` as `name`, last or just before `before`; ValueError for a name already taken."""
        if not name:
            raise ValueError(f"a {self.what} needs a name")
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered already")
        entries = list(self._entries.items())
        at = [n for n, _ in entries].index(before) if before in self._entries else len(entries)
        entries.insert(at, (name, entry))
        self._entries = dict(entries)
        return entry

    def unregister(self, name: str) -> T:
        return self._entries.pop(name)

    @contextmanager
    def registered(self, name: str, entry: T, *, before: str | None = None) -> Iterator[T]:
        """`register` for the length of a `with` block (tests): gone after it."""
        self.register(name, entry, before=before)
        try:
            yield entry
        finally:
            self.unregister(name)

    def nearest(self, name: str) -> str | None:
        """The registered name closest to `name`, where one is close."""
        close = difflib.get_close_matches(name, list(self._entries), n=1)
        return close[0] if close else None

    def unknown(self, name: str, choices: tuple[str, ...] | None = None) -> UsageError:
        """The mistake of asking for `name`: what is known (`choices`, or the names) and the nearest."""
        close = self.nearest(name)
        hint = f"; did you mean {close!r}?" if close else ""
        return UsageError(f"{self.what} {name!r} is not one of {', '.join(choices or self.names())}{hint}")

    def get(self, name: str) -> T:
        """The entry registered as `name`; a UsageError naming the nearest when there is none."""
        if name not in self._entries:
            raise self.unknown(name)
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def values(self) -> tuple[T, ...]:
        return tuple(self._entries.values())

    def copy(self) -> Registry[T]:
        return Registry(self.what, self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


def imported(path: str) -> object:
    """What a "module:name" path names, its module imported now: an entry registered by its path
    keeps `--help` and option validation from importing what only a run needs (torch)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
