"""The bench's modes, in the order a bench runs them: a new mode is a module of its own
(harness/benches/modes.py says what it gives) and one line here. The server starts its search
from the latency mode's end-to-end measurements, so it comes after it."""

from __future__ import annotations

from typing import Any

from harness.benches import closed_loop, latency, server, throughput
from harness.benches.modes import Mode

MODES: tuple[Mode[Any], ...] = (latency.MODE, throughput.MODE, closed_loop.MODE, server.MODE)
