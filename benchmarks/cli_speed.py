"""A mistake answered at once: the CPU seconds of `harness --help`, a usage error and a `harness
query`, each in a fresh interpreter as a user runs it, side by side with importing torch (what
they no longer do: tests/test_cli_imports.py checks that none of them imports it). CPU time, not
wall time, so that other processes on the machine do not count. Each is run REPEATS times,
alternating, and its median taken. Target: the slowest of the three under a quarter of torch's
import, and so under a second of CPU on a 2-core machine.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import Comparison
from harness.store.schema import SCHEMAS
from harness.store.writer import write_columns

REPEATS = 3
TARGET = 0.25


def cpu_seconds(args: list[str]) -> float:
    """User and system CPU of one child process running `args`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(args, capture_output=True, timeout=300, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run() -> Comparison:
    harness = [sys.executable, "-m", "harness"]
    with tempfile.TemporaryDirectory() as results:
        write_columns(Path(results), "runs", "r1", {f.name: [] for f in SCHEMAS["runs"]})  # an empty runs table
        commands = {
            "python -c 'import harness, torch'": [sys.executable, "-c", "import harness, torch"],
            "harness --help": [*harness, "--help"],
            "harness sweep --cards 0 (usage error)": [*harness, "sweep", "--cards", "0"],
            "harness query": [*harness, "query", "SELECT count(*) FROM runs", "--results", results],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(REPEATS):
            for name, args in commands.items():
                times[name].append(cpu_seconds(args))
    cpu = {name: statistics.median(seconds) for name, seconds in times.items()}
    torch_import, *ours = cpu
    slowest = max(ours, key=lambda name: cpu[name])
    return Comparison(
        name=f"CPU of the command's fast answers against importing torch (median of {REPEATS}, fresh processes)",
        measured={name: f"{seconds:.2f} s of CPU" for name, seconds in cpu.items()},
        ratio=cpu[slowest] / cpu[torch_import],
        ratio_label=f"slowest ({slowest}) / importing torch",
        target=TARGET,
        higher_is_better=False,
    )
