"""Shared test fixtures. The third-party cases live in ../shared/cases beside the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CASES = REPO.parent / "shared" / "cases"


@pytest.fixture(scope="session")
def cases() -> Path:
    if not CASES.is_dir():
        pytest.fail(f"{CASES} is missing: the tests read the shared cases from beside the checkout")
    return CASES
