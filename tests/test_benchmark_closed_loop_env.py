"""`python -m benchmarks closed_loop_env` runs, at a tiny size: every case is measured and the
ratios are numbers. How fast anything ran is the machine's, never asserted."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from benchmarks import closed_loop_env


@pytest.fixture(autouse=True)
def threads_kept() -> Iterator[None]:
    """The benchmark sets torch to one thread, as a sweep's actor runs; other tests get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_closed_loop_env_measures_both_environments_side_by_side():
    comparison = closed_loop_env.run(sizes=(2,), repeats=1)
    assert list(comparison.measured) == ["seals/CartPole-v0, 2 envs", "Pendulum-v1, 2 envs"]
    assert all("of the limit" in line for line in comparison.measured.values())
    assert math.isfinite(comparison.ratio) and comparison.ratio > 0
    assert "closed loop vs bare environment" in comparison.render()
