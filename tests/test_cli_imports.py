"""A mistake is answered at once: `harness --help`, every usage error and `harness query` run
without importing torch, onnx or Ray (each takes seconds of CPU to import, tens of seconds on a
loaded machine). Each case runs in a fresh interpreter, as a user runs the command, and reads
`sys.modules` as the process ends; how long they take is `python -m benchmarks cli_speed`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.store.writer import write_rows
from tests.builders import bench_row
from tests.helpers import REPO

HEAVY = ("torch", "onnx", "ray")

# The command as `harness ARGS` runs it, then the heavy modules it loaded, as JSON on stderr's last line.
RUN_AND_REPORT = """
import atexit, json, runpy, sys
atexit.register(lambda: print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)), file=sys.stderr))
sys.argv = ["harness", *sys.argv[1:]]
runpy.run_module("harness", run_name="__main__")
"""


def heavy_modules(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AND_REPORT.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    *_, loaded = proc.stderr.strip().splitlines()
    return proc, json.loads(loaded)


def test_importing_the_command_line_loads_no_torch() -> None:
    code = f"import sys, harness.cli; print([m for m in {HEAVY} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--help"], 0, "exit codes"),
        (["sweep", "--help"], 0, "--inject-fault SPEC"),
        (["bench", "--help"], 0, "--env-impl {auto,numpy,gymnasium}"),
        (["sweep", "--bogus"], 2, "unrecognized arguments: --bogus"),
        (["sweep", "--cards", "0"], 2, "--cards 0: must be at least 1"),
        (["sweep", "--inject-fault", "card5:corrupt-weight", "--cards", "2"], 2, "the run has 2 card(s) (--cards 2)"),
        (["bench", "--inject-fault", "card0:fp16-accumulate"], 2, "it acts only on float16"),
        (["sweep", "--tolerance", "float16=0.1"], 2, "expected DTYPE=ATOL,RTOL"),
    ],
)
def test_help_and_usage_errors_import_no_torch(args: list[str], code: int, says: str) -> None:
    proc, loaded = heavy_modules(*args)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert says in proc.stdout + proc.stderr
    assert loaded == [], f"harness {' '.join(args)} imported {loaded}"


def test_a_query_imports_no_torch(tmp_path: Path) -> None:
    write_rows(tmp_path, "bench", "r1", [bench_row(), bench_row(batch_size=1, p50_ms=0.37)])
    proc, loaded = heavy_modules("query", "SELECT count(*) AS n FROM bench", "--results", str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == [{"n": 2}]
    assert loaded == []
    # and its mistakes
    bad, loaded = heavy_modules("query", "SELECT 1; SELECT 2", "--results", str(tmp_path))
    assert bad.returncode == 2 and loaded == []
