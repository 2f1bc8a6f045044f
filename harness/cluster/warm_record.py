"""Where `harness up` is running, recorded in a file (`recorded_file`) while it runs: `harness
down` reads it, `harness up` refuses to start over it, and a sweep or bench that joins its address
joins in its authentication mode. Nothing here imports Ray: Ray reads RAY_AUTH_MODE once, when it
is imported, so the mode is taken from the record before that (`adopt_auth`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


def recorded_file() -> Path:
    """Where `harness up` records its address and process while it runs: HARNESS_WARM_FILE, else
    one file per user in the temporary folder."""
    return Path(os.environ.get("HARNESS_WARM_FILE") or Path(tempfile.gettempdir()) / f"harness-warm-{os.getuid()}.json")


@dataclass(frozen=True)
class Recorded:
    address: str
    pid: int
    auth: str  # RAY_AUTH_MODE as the cluster started ("token": a client needs it too), "" where unset

    @classmethod
    def read(cls) -> Recorded | None:
        try:
            return cls(**json.loads(recorded_file().read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write(self) -> None:
        path = recorded_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self)))

    def alive(self) -> bool:
        """Its process is running and something answers at its address."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # another user's process of that id: it runs
        return answers(self.address)

    def forget(self) -> None:
        if Recorded.read() == self:
            recorded_file().unlink(missing_ok=True)


def answers(address: str, timeout_s: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError, OverflowError):  # nothing listens; not a host:port (a port past 65535)
        return False


def adopt_auth(address: str | None) -> None:
    """Join the warm cards at `address` (else RAY_ADDRESS) in the authentication mode their
    cluster started with, as `harness up` recorded it: a local Ray 2.60 cluster wants a token, and
    a client without RAY_AUTH_MODE=token is refused. A mode the user set is left as it is, and so is a process that
    imported Ray already (harness.sweep() called after Ray's import): there the refusal that
    follows says what to export."""
    recorded = Recorded.read()
    target = address or os.environ.get("RAY_ADDRESS")
    if recorded is None or not recorded.auth or recorded.address != target or "ray" in sys.modules:
        return
    os.environ.setdefault("RAY_AUTH_MODE", recorded.auth)
