"""What a policy format declares: the file it reads, told by its suffix and by a look at its
content, and how it loads one. Each format is one `PolicyFormat` subclass in its loader's module,
registered once in `harness.policies.registry`; nothing else decides which loader reads a file.

The look (`Peek`) is the same for every format and cheap: the file's first bytes and, for a zip,
its member names, read from the central directory after checking that the directory is no larger
than a save's. A format that claims a file only by its suffix would be handed files it misreads
(a TorchScript `.pt` is no ML-Agents checkpoint), so every format checks the content too.
"""

from __future__ import annotations

import zipfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, ClassVar

from harness.errors import PolicyLoadError
from harness.files import read_start, regular_file_size
from harness.policies.base import ActionKind, PolicyNet
from harness.policies.policy_files import PLAIN, EnvSetup

HEAD_BYTES = 64
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first local header, or the end record of an empty one
# An SB3 save holds fewer than 10 members (data, policy.pth, the optimizer's, pytorch_variables.pth,
# provenance), a torch checkpoint a few dozen. zipfile builds an entry for each member its central
# directory lists, reading it to its end whatever count the end record gives (2.4 million empty
# members: 112 s, 5.1 GB), so both the count and the directory's size are bounded: 46 bytes an
# entry, plus its name and extras.
MAX_MEMBERS = 1000
MAX_DIRECTORY_BYTES = MAX_MEMBERS * 1024


@dataclass(frozen=True)
class PolicySpec:
    """What the user asked for and how to load it; the driver and every actor load from the same spec.

    `source` is a registry name, a path or hf://...: the policy's name in every result row. The
    rest says what the policy's own files may not: its environment (`env_id`, used where the
    policy declares none, or always with `env_overrides`, and then the files beside the policy
    are not read for one), and for an ONNX graph of no known layout the output to read and
    whether its actions are discrete or continuous.
    """

    source: str
    env_id: str | None = None
    env_source: str = ""  # the option that named env_id, e.g. "--env"
    env_overrides: bool = False
    onnx_output: str | None = None
    action_kind: ActionKind | None = None
    env_setup: EnvSetup = PLAIN  # how env_id is made, where the driver found that in the files


@dataclass(frozen=True)
class Peek:
    """A first look at a file: enough for each format to say whether the file is one of its own."""

    head: bytes
    zip_members: frozenset[str] | None  # None: not a zip

    @classmethod
    def of(cls, path: Path) -> Peek:
        if regular_file_size(path, "a policy file", PolicyLoadError) == 0:
            raise PolicyLoadError(path, "is empty (0 bytes)")
        head = read_start(path, HEAD_BYTES, "a policy file", PolicyLoadError)[:HEAD_BYTES]
        return cls(head, zip_members(path) if head.startswith(ZIP_MAGIC) else None)


def zip_members(path: Path) -> frozenset[str] | None:
    """The member names of zip `path`, its directory checked first (`check_zip_directory`);
    None where it only starts like a zip."""
    with open(path, "rb") as f:
        check_zip_directory(path, f)
        try:
            with zipfile.ZipFile(f) as zf:
                return frozenset(zf.namelist())
        except zipfile.BadZipFile:
            return None


def check_zip_directory(path: Path, f: BinaryIO) -> None:
    """Refuse a zip whose central directory is larger than a save's, before zipfile reads it:
    zipfile builds an entry for every member it lists, and a few hundred bytes can list millions.
    The end record is read by zipfile's own function, so what is checked is what zipfile then
    reads (Zip64 included); a file with none is left to zipfile to call no zip."""
    end = zipfile._EndRecData(f)  # type: ignore[attr-defined]
    if not end:
        return
    members, size = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]  # type: ignore[attr-defined]
    if members > MAX_MEMBERS:
        raise PolicyLoadError(path, f"zip lists {members} members, over the {MAX_MEMBERS} limit (a save has fewer than 10)")
    if size > MAX_DIRECTORY_BYTES:
        limit = f"over the {MAX_DIRECTORY_BYTES} byte limit for {MAX_MEMBERS} members"
        raise PolicyLoadError(path, f"zip's central directory is {size} bytes, {limit}")


class PolicyFormat(ABC):
    """One kind of policy file. Subclasses fill in the class attributes and the two methods."""

    name: ClassVar[str]  # the `source` recorded with every result: "sb3-zip", "onnx", ...
    suffixes: ClassVar[tuple[str, ...]]
    what: ClassVar[str]  # what the content check looks for, for messages

    @classmethod
    @abstractmethod
    def claims(cls, peek: Peek) -> bool:
        """Whether the content is this format's (the suffix has already matched)."""

    @classmethod
    @abstractmethod
    def load(cls, path: Path, spec: PolicySpec) -> PolicyNet:
        """A float32 PolicyNet from the file; PolicyLoadError (one line) for what cannot be."""
