"""A file a user hands in, read as bytes: only a regular file, and only as much as a bound allows.

`open()` on a FIFO waits for a writer, for ever if none comes, and a character device such as
/dev/zero never ends; so a path is looked at before it is opened, and anything but a regular file
is refused by what it is. Symlinks are followed: the Hugging Face cache keeps every file as one.
Every policy loader, side-file reader and the config file reader read through here; a refusal is
the caller's kind of error (`FileError`, or `PolicyLoadError` for a policy's files), one line
naming the file. A JSON file's text is parsed within bounds too (`json_value`): nesting deep
enough to exhaust the stack and integers of thousands of digits are refused, not raised past.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from harness.errors import FileError

KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


def regular_file_size(path: Path, what: str, error: type[FileError] = FileError) -> int:
    """The size of regular file `path`; `error` for a missing path, a folder, a FIFO, ...
    `what` is what the file should be, for a folder's message: "a policy file"."""
    try:
        mode = os.stat(path)
    except FileNotFoundError:
        raise error(path, "no such file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in a name that came from a file
        raise error(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(mode.st_mode):
        raise error(path, f"is a folder, not {what}")
    _refuse_irregular(path, mode.st_mode, error)
    return mode.st_size


def read_start(path: Path, limit: int, what: str, error: type[FileError] = FileError) -> bytes:
    """At most `limit` + 1 bytes from the start of regular file `path`: more than `limit` says the
    file is larger than its reader accepts, in the reader's words."""
    regular_file_size(path, what, error)
    try:
        # Non-blocking, should the path turn into a FIFO after the look: the open does not wait.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            _refuse_irregular(path, os.fstat(f.fileno()).st_mode, error)
            return f.read(limit + 1)
    except OSError as exc:
        raise error(path, f"cannot read: {exc.strerror or exc}") from None


def read_whole(path: Path, limit: int, what: str, error: type[FileError] = FileError) -> bytes:
    """The bytes of regular file `path`, refused when there are more than `limit` of them."""
    content = read_start(path, limit, what, error)
    if len(content) > limit:
        raise error(path, f"is over the {limit} byte limit for {what}")
    return content


def sha256_of(*parts: bytes) -> str:
    """A policy's identity: the bytes it is built from, in the order its loader documents."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def _refuse_irregular(path: Path, mode: int, error: type[FileError]) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in KINDS if test(mode)), "an unknown kind of file")
        raise error(path, f"is not a regular file ({kind})")


def read_text(path: Path, limit: int, what: str, error: type[FileError] = FileError) -> str:
    """`read_whole` as UTF-8 text."""
    try:
        return read_whole(path, limit, what, error).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(path, f"is not UTF-8 text (byte {exc.start})") from None


# No count, size or seed a harness reads from a file is wider than 64 bits; Python parses an
# integer of up to 4300 digits (and raises past that), and float() of one over 308 overflows.
MAX_JSON_INT = 2**64


def json_value(text: str) -> Any:
    """`text` parsed as JSON; ValueError saying what is wrong (json.JSONDecodeError where it is
    not JSON): nested too deeply to read, or an integer wider than 64 bits."""
    try:
        return json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def _bounded_int(text: str) -> int:
    # Its digits are counted before int() reads them: int() of 200000 digits raises, slowly.
    digits = len(text.lstrip("-"))
    if digits > len(str(MAX_JSON_INT)) or abs(int(text)) >= MAX_JSON_INT:
        raise ValueError(f"an integer of {digits} digits, wider than 64 bits")
    return int(text)
