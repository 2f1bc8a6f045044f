"""SIGTERM ends a run as Ctrl-C does (`kill` and `ray job stop` send it): a KeyboardInterrupt in
the main thread, so the run records itself `interrupted` and says how to finish it, never left
`running`. Light on purpose: the command line sets it before importing the driver."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside, SIGTERM raises KeyboardInterrupt; the handler before is put back after.
    `ray.init` sets a handler of its own (it exits at once), so a run sets this again once Ray
    is up. Only the main thread may set one: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
