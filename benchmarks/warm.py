"""The default sweep as a user waits for it (`harness sweep`, a fresh interpreter each time) on a
cluster started for it (cold) and on the warm cards of `harness up` (warm), measured in one run:
the cold sweeps first, with no other cluster on the machine, then `harness up` and the warm ones.
The first warm sweep is the first the warm cards serve; the figure is the sweeps after it (the
median of each side's rounds). Warm rows are read back and compared with the cold ones.
Target (issue 38): a warm sweep within half a cold one's wall time.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.dataset as ds

from benchmarks import Comparison

ROUNDS = 2
TARGET = 0.5
REPO = Path(__file__).resolve().parents[1]


def harness(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=REPO, env=env)


def timed_sweep(env: dict[str, str], results: Path, *address: str) -> float:
    start = time.perf_counter()
    done = harness(env, "sweep", "--no-progress", "--results", str(results), *address)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"the default sweep ended {done.returncode}: {done.stderr[-2000:]}")
    return seconds


def rows(results: Path) -> list[list[tuple[object, ...]]]:
    """Every run's checks and episodes rows, without the run id, sorted: one list per table."""
    tables = []
    for table in ("checks", "episodes"):
        found = ds.dataset(results / table, format="parquet", partitioning="hive").to_table()
        tables.append(sorted((tuple(row.values()) for row in found.drop_columns(["run_id"]).to_pylist()), key=repr))
    return tables


def by_run(results: Path) -> list[list[list[tuple[object, ...]]]]:
    return [rows(run) for run in sorted(results.iterdir())]


def run() -> Comparison:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        env = {**os.environ, "HARNESS_WARM_FILE": str(tmp / "warm.json")}
        env.pop("RAY_ADDRESS", None)
        env.pop("RAY_AUTH_MODE", None)  # the sweeps and `harness down` take the warm cluster's from its record
        cold = [timed_sweep(env, tmp / "cold" / str(i)) for i in range(ROUNDS)]
        start = time.perf_counter()
        up = subprocess.Popen(
            [sys.executable, "-m", "harness", "up", "--idle-timeout", "600"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
        try:
            assert up.stdout is not None
            line = next((said for said in up.stdout if said.startswith("use them: ")), "")
            up_s = time.perf_counter() - start
            if not line:
                raise RuntimeError("harness up ended before its cards were up")
            address = line.split("--address ")[1].split()[0]
            first = timed_sweep(env, tmp / "warm" / "first", "--address", address)
            warm = [timed_sweep(env, tmp / "warm" / str(i), "--address", address) for i in range(ROUNDS)]
        finally:
            harness(env, "down")
            up.wait(timeout=120)
        equal = all(run == rows(tmp / "cold" / "0") for run in [*by_run(tmp / "cold"), *by_run(tmp / "warm")])
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)

    def each(seconds: list[float]) -> str:
        return f"median of {ROUNDS}: {', '.join(f'{s:.1f}' for s in seconds)}"

    return Comparison(
        name="a default sweep on warm cards (harness up) vs on a cluster of its own, as `harness sweep` runs it",
        measured={
            "cold sweep (its own Ray and actors)": f"{cold_s:.1f} s ({each(cold)})",
            "harness up (Ray, warm actors ready)": f"{up_s:.1f} s, once",
            "first sweep on the warm cards": f"{first:.1f} s",
            "warm sweep after it": f"{warm_s:.1f} s ({each(warm)})",
            "checks and episodes rows": "equal in every run" if equal else "NOT EQUAL between runs",
        },
        ratio=warm_s / cold_s if equal else float("inf"),
        ratio_label="warm sweep / cold sweep wall time" + ("" if equal else " (rows differ: not counted)"),
        target=TARGET,
        higher_is_better=False,
    )
