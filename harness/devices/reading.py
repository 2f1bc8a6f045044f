"""Reading a card's settings without ever failing its description."""

from __future__ import annotations

import enum
from collections.abc import Callable


def plain(value: object) -> object:
    """A value as JSON can hold it: the description travels through Ray and into `runs.devices`."""
    if isinstance(value, enum.Enum):  # before int: CubeMathType is an IntEnum
        return value.name  # CubeMathType.KEEP_DTYPE -> "KEEP_DTYPE"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")  # torch_npu's options read back as bytes
    return str(value)


def guarded(read: Callable[[], object]) -> object:
    """`read()` as a plain value, or None where it raises: a name this version lacks, no CANN, no
    device, or no torch_npu at all (its module passed as None), or torch refusing to read a legacy
    flag once the new precision API was used."""
    try:
        return plain(read())
    except Exception:
        return None
