"""The judge's heavy imports, taken ahead of the first check.

The comparison functions import scipy.stats (closed-loop intervals) and ml_dtypes (bfloat16's
ULPs) where they first need them, so that the command line and the report stay light. In a sweep
that first need is the first unit judged, where the imports cost more than judging all of a
default sweep's units (a profile of the default sweep: 4.6 of its 11.2 s of judging was
ml_dtypes' import, 1.7 s scipy.stats', on a loaded host). The driver takes them on a thread of
their own while it waits for Ray and the actors, which it does anyway.
"""

from __future__ import annotations

import threading


def _take() -> None:
    import ml_dtypes  # noqa: F401
    import scipy.stats  # noqa: F401


def import_ahead() -> threading.Thread:
    """The imports begun in the background; a judge that needs one before it is done waits on
    Python's import lock for it, never imports it twice."""
    thread = threading.Thread(target=_take, name="judge-imports", daemon=True)
    thread.start()
    return thread
