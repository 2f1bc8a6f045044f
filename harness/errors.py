"""Errors a user can cause. The command line prints them as one line and exits 2."""


class UsageError(Exception):
    """Bad usage, configuration or input: a one-line message, exit code 2, no traceback."""


class PolicyLoadError(UsageError):
    """A policy file that cannot be read; the message names the file and the problem."""

    def __init__(self, source: object, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
