"""Where a run's files go: the results folder, the run's name, and nothing outside them.

A run id is a name, never a path: it is checked against one alphabet wherever it is taken
(`--run-id`, `--resume`, `report RUN_ID`, `--compare`, a TOML key, a job's arguments), and every
path the writer writes or removes is checked to lie inside the results folder before it is
touched, so no run id, however it was made, reaches a file outside. Light on purpose: the
options module checks names with it before anything heavy is imported.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from harness.errors import UsageError

STAGING = ".staging"
RUN_ID_MAX = 128
# Letters, digits, '.', '_' and '-', not starting with '.': a file name on every system, never
# hidden, never '..' or a path, and the same string in a hive partition (`run_id=<id>`) and in SQL.
RUN_ID = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{RUN_ID_MAX - 1}}}")


def check_run_id(run_id: str, where: str = "--run-id") -> str:
    """`run_id` if it is a valid name, else a UsageError saying what a run id may be."""
    if RUN_ID.fullmatch(run_id):
        return run_id
    raise UsageError(
        f"{where} {run_id!r}: a run id is a name of letters, digits, '.', '_' and '-', not starting with '.', "
        f"at most {RUN_ID_MAX} characters, e.g. nightly-2026-12-01"
    )


def inside(results: Path, path: Path) -> Path:
    """`path`, after checking that it resolves to a place inside `results` (links followed)."""
    root, target = results.resolve(), path.resolve()
    if target == root or not target.is_relative_to(root):
        raise UsageError(f"{path} is not inside the results folder {results}: the harness writes nowhere else")
    return path


def check_results_folder(results: Path) -> Path:
    """`results`, if a run may write there: a folder (or a path where one can be made) that is
    not the filesystem's root and that this process can write. Checked before Ray starts, so a
    read-only mount is one line, not a traceback after start-up."""
    try:
        root = results.resolve() == Path(results.resolve().anchor)
    except (OSError, RuntimeError) as exc:
        raise UsageError(f"--results {results}: cannot be a folder: {unusable(exc)}") from None
    if root:
        raise UsageError(f"--results {results}: the filesystem root; give the results a folder of their own, e.g. ./results")
    return check_writable_folder(results, "--results")


def check_writable_folder(folder: Path, flag: str) -> Path:
    """`folder`, if files can be written in it: a folder, or a path where one can be made, that
    this process can write; a UsageError naming `flag` otherwise."""
    try:
        resolved = folder.resolve()
        if resolved.exists() and not resolved.is_dir():
            raise UsageError(f"{flag} {folder}: is a file; it must be a folder (it is made if missing)")
        existing = next(p for p in (resolved, *resolved.parents) if p.exists())
    except (OSError, RuntimeError) as exc:
        raise UsageError(f"{flag} {folder}: cannot be a folder: {unusable(exc)}") from None
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == resolved else f" (its nearest existing folder {existing} is not)"
        raise UsageError(f"{flag} {folder}: not writable by this process{where}; pick a folder you can write")
    return folder


def unusable(exc: OSError | RuntimeError) -> str:
    """Why a path cannot be looked at, in a few words: a name too long, a symlink loop (which
    Python 3.11's `Path.resolve` raises as RuntimeError), a file where a folder should be."""
    if isinstance(exc, RuntimeError):
        return "a symlink loop"
    return exc.strerror or str(exc)


def check_output_file(path: Path, flag: str) -> Path:
    """`path`, if a run may write a file there: not a folder, in a folder this process can write.
    Anything else that is there already (a FIFO, whose writer waits for a reader for ever, a
    device) is refused too, and so is a path that cannot be looked at (a name too long)."""
    try:
        if path.is_dir():
            raise UsageError(f"{flag} {path}: is a folder; give a file name, e.g. {path / 'harness.xml'}")
        if path.exists() and not path.is_file():
            raise UsageError(f"{flag} {path}: is not a regular file; give a file name")
        folder = path.parent
        usable = folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot be written: {unusable(exc)}") from None
    if not usable:
        raise UsageError(f"{flag} {path}: its folder {folder} is missing or not writable by this process")
    return path


def table_dir(results: Path, table: str, run_id: str) -> Path:
    return inside(results, results / table / f"run_id={check_run_id(run_id)}")
