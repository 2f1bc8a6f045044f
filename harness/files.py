"""Reading a file a user names, bounded: only a regular file, never more than a limit.

A FIFO opened for reading blocks until a writer comes, `/dev/zero` never ends, and a folder or a
device has no bytes to give, so each is refused by what it is, in one line, before a byte is read.
The file is opened without blocking and checked again on the open descriptor, so a path swapped
for a FIFO after the first look is refused too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from harness.errors import UsageError

_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def not_regular(mode: int) -> str | None:
    """What a file of this `st_mode` is, when it is not a regular file; None when it is one."""
    return None if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_bounded(path: Path, what: str, limit: int) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes; UsageError (naming `what`,
    e.g. "config file") for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        kind = not_regular(info.st_mode)
        if kind is not None:
            raise UsageError(f"{path}: is {kind}, not a {what}")
        if info.st_size > limit:
            raise UsageError(f"{path}: is {info.st_size} bytes, over the {limit} byte limit for a {what}")
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    content = b"".join(chunks)
    if len(content) > limit:  # it grew since fstat
        raise UsageError(f"{path}: is over the {limit} byte limit for a {what}")
    return content


def read_bounded_text(path: Path, what: str, limit: int) -> str:
    """`read_bounded` as UTF-8 text."""
    try:
        return read_bounded(path, what, limit).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: the {what} is not UTF-8 text (byte {exc.start})") from None
