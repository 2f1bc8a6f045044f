"""What the driver decides when a cluster fails it, without a cluster: the one-line reasons a
cluster refuses to be joined."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.run.place import join_refusal, token_refusal


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "requires a token and token authentication is off in this client (RAY_AUTH_MODE=unset): export RAY_AUTH_MODE"),
        ({"RAY_AUTH_MODE": "disabled"}, "token authentication is off in this client (RAY_AUTH_MODE=disabled)"),
        ({"RAY_AUTH_MODE": "token"}, "requires a token and this client has none: give it the cluster's token"),
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "x" * 32}, "refused this client's token (from RAY_AUTH_TOKEN)"),
    ],
)
def test_a_token_refusal_names_the_cause_and_the_fix(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    message = token_refusal("10.0.0.1:6379")
    assert message.startswith("the Ray cluster at 10.0.0.1:6379 ") and expected in message, message
    assert "`ray get-auth-token` on its head prints it" in message


def test_a_version_mismatch_names_both_versions_and_the_fix() -> None:
    exc: Any = RuntimeError(
        "Version mismatch: The cluster was started with:\n    Ray: 2.59.0\n    Python: 3.11.9\n"
        "This process on node 10.0.0.2 was started with:\n    Ray: 2.60.0\n    Python: 3.11.14\n"
    )
    assert join_refusal("10.0.0.1:6379", exc) == (
        "the Ray cluster at 10.0.0.1:6379 runs Ray 2.59.0 on Python 3.11.9, this client Ray 2.60.0 on Python 3.11.14: "
        "join it from an environment with the cluster's versions (pip install 'ray[default]==2.59.0' under Python "
        "3.11.9), or submit the sweep with `ray job submit` so it runs on the cluster's own"
    )
    assert (
        join_refusal("h:1", ConnectionError("Failed to connect\nmore"))
        == "cannot join the Ray cluster at h:1: Failed to connect"
    )
