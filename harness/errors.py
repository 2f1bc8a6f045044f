"""Errors a user can cause. The command line prints them as one line and exits 2."""

from __future__ import annotations

import unicodedata


def first_line(exc: BaseException) -> str:
    """An exception as one line of an error message: its message's first line, or its type."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def one_line(text: str) -> str:
    """`text` as the one line an error is, whatever the user's values in it hold: each control
    character (a newline, a carriage return, an escape that moves a terminal's cursor) and each
    character that `str.splitlines` breaks at written as its escape, e.g. `\\n`."""
    return "".join(c.encode("unicode_escape").decode() if _breaks(c) else c for c in text)


def _breaks(c: str) -> bool:
    return unicodedata.category(c) == "Cc" or c in "\u2028\u2029"


class UsageError(Exception):
    """Bad usage, configuration or input: a one-line message, exit code 2, no traceback."""


class FileError(UsageError):
    """A file the user named that cannot be used; the message names the file and the problem."""

    def __init__(self, source: object, problem: str) -> None:
        super().__init__(f"{source}: {problem}")


class PolicyLoadError(FileError):
    """A policy file (or a file beside it) that cannot be read as a policy."""


class RunLost(Exception):
    """A run that no longer holds its run id (its staging folder removed, or another process took
    the run over): it stops without publishing, exit 3, and never writes over the holder's rows."""


class RunUnfinished(Exception):
    """A command that reads a finished run's checks (diagnose, repro) asked about one that has
    not finished: one line saying how to finish it, exit 3, as `harness report` says it."""


class InfrastructureError(Exception):
    """The machine failed the run, not the user and not the port: Ray did not start, the results
    folder could not be written (a full or failing disk). One line, exit 3; a sweep's run is kept
    `incomplete`, and `--resume` finishes it once the cause is gone."""
