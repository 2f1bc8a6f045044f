"""`Kind`: an accelerator's name, checked against the registry (harness/devices/registry.py)."""

from typing import NewType

Kind = NewType("Kind", str)
"""An accelerator's registered name (`npu`, `cuda`, `cpu`, ...): made by `as_kind` and
`resolve_accelerator`, so a plain string never reaches code that needs a kind."""
