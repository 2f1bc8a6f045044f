"""Reading a card's settings without ever failing its description, and never leaving one blank."""

from __future__ import annotations

import enum
from collections.abc import Callable

from harness.errors import first_line

UNREADABLE = "unreadable: "


def plain(value: object) -> object:
    """A value as JSON can hold it: the description travels through Ray and into `runs.devices`."""
    if isinstance(value, enum.Enum):  # before int: CubeMathType is an IntEnum
        return value.name  # CubeMathType.KEEP_DTYPE -> "KEEP_DTYPE"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")  # torch_npu's options read back as bytes
    return str(value)


def unreadable(exc: BaseException) -> str:
    """What a setting that failed to read records: `unreadable: RuntimeError: the call needs CANN`."""
    return f"{UNREADABLE}{type(exc).__name__}: {first_line(exc)}"


def is_unreadable(value: object) -> bool:
    return isinstance(value, str) and value.startswith(UNREADABLE)


def read_setting(read: Callable[[], object]) -> object:
    """`read()` as a plain value, or `unreadable: <why>` where it raises (a name this version
    lacks, no CANN, no device, no torch_npu): a setting is recorded, never left blank."""
    try:
        return plain(read())
    except Exception as exc:
        return unreadable(exc)


def guarded(read: Callable[[], object]) -> object:
    """`read()` as a plain value, or None where it raises: for versions and names in a card's
    `runtime`, where "" says "not readable" (see `read_version`)."""
    try:
        return plain(read())
    except Exception:
        return None


def read_version(read: Callable[[], object]) -> str:
    """A version or id for a card's `runtime`: "" where it is unreadable or absent."""
    value = guarded(read)
    return "" if value is None else str(value)
