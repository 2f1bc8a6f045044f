"""A run id held by one process at a time: the claim on a run in a results folder.

A run's staging folder `<results>/.staging/<run_id>/` holds its claim: `owner-<n>.json`, made by
an exclusive create (a hard link to the owner written whole, which fails where the name
exists, as O_EXCL does), so of two processes that make the same name one wins. The highest n
is the run's owner. A new run makes `owner-1`; `--resume`, or a new run over one whose owner died
before it wrote anything, makes the next n, and of two that try, one gets it. Every write of the
run checks first that the claim is still its own; the claim ends when the run is published (the
staging folder, renamed away whole, is removed) or released (its owner file removed: a run that
ended early keeps its staging for `--resume`).

The owner is a host, a pid and that process's start time. On the same machine (the same host
name, boot and pid namespace) a claim whose process is gone, or whose pid now names a process that
started at another time, is seen as left behind. From another machine it cannot be checked: the
refusal names the file to remove once that process is known to be gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil

from harness.errors import RunLost, UsageError
from harness.store.paths import STAGING, check_run_id, inside, table_dir
from harness.store.schema import TABLES

# Two claimers that keep making the next owner file before this one: give up rather than spin.
TRIES = 20
# A pid names the same process when its start time agrees to within this (the clock can be
# stepped between two readings of a process's start).
START_SLACK_S = 1.0


class OwnerState(Enum):
    ALIVE = "alive"
    GONE = "gone"
    ELSEWHERE = "elsewhere"  # another machine, boot or pid namespace: it cannot be checked from here


def machine() -> str:
    """Where a pid names a process: the host's name, its boot, and the pid namespace (two
    containers on one host count pids of their own). The last two read where Linux has them."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return "/".join(parts)


@dataclass(frozen=True)
class Owner:
    """The process that holds a run id, as its owner file records it."""

    pid: int
    started: float  # the process's start, seconds since the epoch (psutil's create_time)
    host: str
    machine: str
    token: str  # this claim's own: a pid and a host may claim the same run again
    claimed_at: str
    command: str

    @classmethod
    def me(cls, claimed_at: str, command: str) -> Owner:
        pid = os.getpid()
        return cls(
            pid, psutil.Process(pid).create_time(), socket.gethostname(), machine(), os.urandom(8).hex(), claimed_at, command
        )

    @classmethod
    def read(cls, path: Path) -> Owner | None:
        """The owner recorded in `path`; None where it cannot be read as one (being written, or damaged)."""
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def state(self) -> OwnerState:
        if self.machine != machine():
            return OwnerState.ELSEWHERE
        try:
            process = psutil.Process(self.pid)
            alive = abs(process.create_time() - self.started) < START_SLACK_S and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return OwnerState.GONE
        except psutil.AccessDenied:  # another user's process under that pid: it is there
            return OwnerState.ALIVE
        return OwnerState.ALIVE if alive else OwnerState.GONE

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host} (claimed {self.claimed_at})"


def began(results: Path, run_id: str) -> bool:
    """Whether the run has written anything readers see: a folder in any table."""
    return any(table_dir(results, table, run_id).exists() for table in TABLES)


def _owner_files(staging: Path) -> list[tuple[int, Path]] | None:
    """The staging's owner files by n, lowest first; None where the staging folder is gone."""
    try:
        names = os.listdir(staging)
    except FileNotFoundError:
        return None
    found = []
    for name in names:
        number = name.removeprefix("owner-").removesuffix(".json")
        if name.startswith("owner-") and name.endswith(".json") and number.isdigit():
            found.append((int(number), staging / name))
    return sorted(found)


def _create(path: Path, owner: Owner) -> bool:
    """Make `path` holding `owner`, only if no file of that name exists: False where one does.
    The owner is written whole under a hidden name first, then linked to `path` (a link, like
    O_EXCL, fails where the name exists): no reader ever sees the claim empty or half written."""
    written = path.with_name(f".{path.name}.{owner.token}.tmp")
    try:
        with open(written, "x") as f:
            json.dump(asdict(owner), f)
            f.flush()
            os.fsync(f.fileno())
        os.link(written, path)
    except FileExistsError:
        return False
    finally:
        written.unlink(missing_ok=True)
    return True


class Claim:
    """This process's hold on a run id: made by `take`, checked before each write, ended by
    `end` (the run is published) or on leaving the `with` block (released; where the run wrote
    nothing readers see, its staging removed too)."""

    def __init__(self, results: Path, run_id: str, owner: Owner, path: Path, made: tuple[Path, ...] = ()) -> None:
        self.results, self.run_id, self.owner, self.path = results, run_id, owner, path
        self.staging = path.parent
        self.made = made  # the folders above the staging that this claim made: removed with it where left empty

    @classmethod
    def take(cls, results: Path, run_id: str, resume: bool, claimed_at: str, command: str = "") -> Claim:
        """Claim `run_id` in `results` for a new run, or (`resume`) for finishing one that ended
        early; a UsageError (exit 2) naming the holder where another process has it."""
        where = "--resume" if resume else "--run-id"
        check_run_id(run_id, where)
        staging = inside(results, results / STAGING / run_id)
        if not resume and began(results, run_id) and not staging.is_dir():  # published
            raise UsageError(_exists(run_id, results))
        me, lost = Owner.me(claimed_at, command), 0
        above = tuple(p for p in (staging.parent, results) if not p.exists())
        for _ in range(TRIES):
            made = not resume and _make(staging)
            owners = _owner_files(staging)
            if owners is None:  # published, or its staging removed, since the look
                if resume:
                    raise UsageError(f"--resume {run_id}: that run has finished; nothing to resume")
                continue
            n, left = owners[-1] if owners else (0, None)
            if lost > n:  # the listing is behind what the exclusive create found (NFS caches folder listings)
                n, left = lost, staging / f"owner-{lost}.json"
            _may_take_over(results, run_id, where, left, resume)
            if _create(staging / f"owner-{n + 1}.json", me):
                break
            lost = n + 1
        else:
            raise UsageError(f"{where} {run_id}: other processes kept claiming that run in {results}; try again")
        claim = cls(results, run_id, me, staging / f"owner-{n + 1}.json", above)
        if left is not None:
            print(f"harness: run {run_id}: {_owner_line(left)} is gone; this process takes the run over", file=sys.stderr)
            left.unlink(missing_ok=True)
        if not resume and began(results, run_id):  # published by another process between the look and the claim
            if made:
                claim.end()
            else:
                claim.path.unlink()
            raise UsageError(_exists(run_id, results))
        return claim

    def check(self) -> None:
        """Nothing, while the claim is this process's own; RunLost (exit 3) once its staging is
        gone or another process holds the run (its owner file, maybe of the same name, another
        claim's: a claim removed by hand and made again)."""
        owners = _owner_files(self.staging)
        if owners is None:
            raise RunLost(f"run {self.run_id}: its staging folder {self.staging} was removed while it ran; {NOTHING}")
        holder = Owner.read(owners[-1][1]) if owners else None
        if holder is None or holder.token != self.owner.token:
            now = f"{holder.describe()} holds it now" if holder else f"its claim {self.path} was removed"
            raise RunLost(f"run {self.run_id}: this process no longer holds the run ({now}); {NOTHING}")

    def held(self) -> bool:
        try:
            self.check()
        except RunLost:
            return False
        return True

    def end(self) -> None:
        """Remove the staging, at once for readers and claimers: renamed to a hidden name of
        this claim's own (never a run id: those do not start with '.'), then deleted."""
        gone = inside(self.results, self.results / STAGING / f".{self.run_id}.{self.owner.token}.ended")
        os.rename(self.staging, gone)
        shutil.rmtree(gone, ignore_errors=True)
        for folder in self.made:
            with contextlib.suppress(OSError):  # not empty: other runs' are there
                folder.rmdir()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if not self.held():
            return
        if began(self.results, self.run_id):
            self.path.unlink()  # released: the staging stays for --resume
        else:
            self.end()  # nothing to resume: leave nothing behind


NOTHING = "nothing of this process was published"


def _exists(run_id: str, results: Path) -> str:
    return f"--run-id {run_id}: a run of that name exists in {results}; pick another or --resume it"


def _make(staging: Path) -> bool:
    """Make the staging folder; False where it exists."""
    for _ in range(TRIES):
        staging.parent.mkdir(parents=True, exist_ok=True)
        try:
            staging.mkdir()
        except FileExistsError:
            return False
        except FileNotFoundError:  # the folder above, left empty by a claim that ended, removed meanwhile
            continue
        return True
    raise UsageError(f"{staging.parent}: its folders keep being removed while this run claims {staging.name}; try again")


def _owner_line(path: Path) -> str:
    owner = Owner.read(path)
    return owner.describe() if owner else f"the process that made {path}"


def refuse_held(results: Path, run_id: str) -> None:
    """For `--resume` of a run that has no `runs` row yet: the UsageError `Claim.take` would say
    where a process holds the run (it is still starting: "wait for it to end"), else nothing."""
    owners = _owner_files(inside(results, results / STAGING / run_id))
    if owners:
        _may_take_over(results, run_id, "--resume", owners[-1][1], resume=True)


def _may_take_over(results: Path, run_id: str, where: str, path: Path | None, resume: bool) -> None:
    """Nothing where the run may be claimed: its claim is free (`path` None) or its owner gone,
    and a new run claims only a run that wrote nothing yet (`--resume` finishes one that did);
    else the UsageError that says why not, and who holds the run."""
    if path is None:
        if not resume and began(results, run_id):
            raise UsageError(_exists(run_id, results))
        return
    owner = Owner.read(path)
    if owner is None:
        raise UsageError(
            f"{where} {run_id}: the run's claim {path} cannot be read (being written, or damaged); "
            "if no process runs it, remove that file and try again"
        )
    state = owner.state()
    if state is OwnerState.ALIVE:
        then = "wait for it to end" if resume else "pick another id"
        raise UsageError(f"{where} {run_id}: run {run_id} is being run in {results} by {owner.describe()}; {then}")
    if state is OwnerState.ELSEWHERE:
        raise UsageError(
            f"{where} {run_id}: run {run_id} is claimed in {results} by {owner.describe()}, which cannot be checked from "
            f"here; once that process is gone, release the claim (rm {path}) and try again"
        )
    if not resume and began(results, run_id):
        raise UsageError(
            f"--run-id {run_id}: a run of that name exists in {results}, left by {owner.describe()}, which is gone; "
            f"finish it with --resume {run_id}, or pick another id"
        )
