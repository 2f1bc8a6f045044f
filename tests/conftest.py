"""Shared test fixtures: the policy files the tests build (tests/builders.py), the third-party
cases beside the checkout where they are present, one Ray cluster for the whole session, and the
sweeps that several test modules read, each run once.

Nothing here fails a session for a missing optional thing: without ../shared/cases the tests
that need those exact bytes are skipped, saying why, and every other test runs on built files.

`harness` is imported first: it sets the device-backend guard before any test module can
import torch, so every test file also passes run alone where torch_npu is installed.
"""

from __future__ import annotations

import harness  # noqa: F401  (the device-backend guard, before torch)

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.policies import CARTPOLE_ZIP
from harness.store.schema import BenchRow
from harness.store.writer import write_rows
from tests import builders
from tests.helpers import REPO, cli, start_ray_node
from tests.helpers import harness as run_harness
from tests.third_party import ABSENT, CASES

SESSION_CARDS = 4


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    """The test process computes beside the Ray actors it starts, on 2 cores: one thread each."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def interruptible() -> None:
    """A suite started in the background by a script (`make test &`) inherits SIGINT ignored, as
    a shell without job control sets it, and passes that on to every process it starts; the tests
    that press Ctrl-C on a sweep need what a terminal gives it. A handler, unlike SIG_IGN, is not
    inherited: the processes started here get the default back."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def sb3_logs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """SB3's `learn` makes a log folder even when it logs nothing, by default a new /tmp/SB3-<time>
    each call, left behind; the session's own temporary folder takes them (SB3_LOGDIR), in this
    process and in the processes it starts."""
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3-logs"))


@pytest.fixture(scope="session")
def cases() -> Path:
    """../shared/cases, for the tests that need the third-party files' exact bytes; they are
    skipped where it is absent (a clone alone), and run in CI, which has it: there
    HARNESS_REQUIRE_CASES=1 (set by .ci/run) turns their absence into a failure, never a quiet skip."""
    if not CASES.is_dir():
        if os.environ.get("HARNESS_REQUIRE_CASES") == "1":
            pytest.fail(f"{ABSENT}, but HARNESS_REQUIRE_CASES=1 says they must be there")
        pytest.skip(ABSENT)
    return CASES


@pytest.fixture(scope="session")
def sb3_expert(tmp_path_factory: pytest.TempPathFactory) -> builders.SB3Expert:
    """The stand-in for the RL Zoo's CartPole-v1: an SB3 1.0rc0-format save in the RL Zoo layout."""
    return builders.sb3_expert(tmp_path_factory.mktemp("sb3-expert"))


@pytest.fixture(scope="session")
def mlagents_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in for ML-Agents 3DBall: an ML-Agents v3 export, 8 observations, 2 x 128 Swish."""
    return builders.mlagents_export(tmp_path_factory.mktemp("mlagents-export"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Head:
    """A `ray start --head` on 127.0.0.1: its GCS address, its dashboard (the job API) and the
    environment its client commands need."""

    address: str
    dashboard: str
    env: dict[str, str]


@pytest.fixture(scope="session")
def ray_head() -> Iterator[Head]:
    """One Ray cluster for every test that does not test starting one: 4 simulated cards, 2 CPUs,
    and the dashboard, so that `ray job submit` reaches it too. Stopped at the end of the session,
    and only it: `ray stop` would end every Ray on the machine, a user's own or a parallel run's.

    Its temporary folder is its own: a job's driver joins the cluster named in the temporary
    folder's `ray_current_cluster` file, which in the shared /tmp/ray names whichever cluster on
    the machine started last, another test run's as likely as this one's."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    port, dashboard = free_port(), free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    node = start_ray_node(
        [
            "--head",
            f"--temp-dir={temp_dir}",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--resources",
            json.dumps({"NPU": SESSION_CARDS}),
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--dashboard-agent-listen-port={free_port()}",
        ],
        env,
    )
    try:
        yield Head(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}", env)
    finally:
        node.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


# The default policies and the SB3 expert (its environment named by its args.yml), on a seed whose
# large float16 batches reach the fixed table's bound: the float16 false alarm.
CLEAN = (
    "--policy",
    "cartpole",
    "--policy",
    "huggy-arch",
    "--dtypes",
    "float32,float16",
    "--episodes",
    "2",
    "--batch-sizes",
    "1,8,4096",
    "--seed",
    "1",
    "--cards",
    "2",
)
# One fault per card; card 0 stays clean, so every other card is judged against an honest one.
FAULTS = (
    "--inject-fault",
    "card1:perturb-weight",
    "--inject-fault",
    "card2:mkl-avx2",
    "--inject-fault",
    "card3:corrupt-weight",
)
CLEAN_RUN, FAULTS_RUN = "clean", "faults"


@dataclass
class SharedSweeps:
    """Real `harness sweep` runs into one results folder on the session's cluster, each run id
    run once whichever test asks first."""

    results: Path
    head: Head
    expert: Path  # the SB3 expert's zip (tests/builders.py)
    mlagents: Path  # the ML-Agents export
    procs: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def run(self, run_id: str, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        if run_id not in self.procs:
            proc = run_harness(
                "sweep",
                *args,
                "--results",
                str(self.results),
                "--run-id",
                run_id,
                "--address",
                self.head.address,
                "--accelerator",
                "cpu",
                "--no-progress",
                env=self.head.env,
            )
            assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
            # Exit 1 is also what an uncaught exception gives: a failed check must not be a crash.
            assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
            self.procs[run_id] = proc
        return self.procs[run_id]

    def clean(self) -> Path:
        """cartpole, huggy-arch and the SB3 expert on 2 cards, float32 and float16: it passes."""
        self.run(CLEAN_RUN, *CLEAN, "--policy", str(self.expert))
        return self.results

    def faults(self) -> Path:
        """cartpole, huggy-arch and the ML-Agents export on 4 cards, a fault on each of cards 1-3;
        always run after the clean run, whichever test asks first: it is the latest run, the one
        `harness report` shows without a run id."""
        self.clean()
        # The clean run's seed and sizes, so that `report --compare` lines their float32 units up.
        self.run(
            FAULTS_RUN,
            "--policy",
            "cartpole",
            "--policy",
            "huggy-arch",
            "--policy",
            str(self.mlagents),
            "--dtypes",
            "float32",
            "--episodes",
            "2",
            "--batch-sizes",
            "1,8,4096",
            "--seed",
            "1",
            "--cards",
            "4",
            *FAULTS,
            "--junit-xml",
            str(self.faults_junit),
            expect=1,
        )
        return self.results

    @property
    def faults_junit(self) -> Path:
        """The faults run's checks as JUnit XML (--junit-xml)."""
        return self.results.parent / "faults.junit.xml"


@pytest.fixture(scope="session")
def shared_sweeps(
    ray_head: Head, sb3_expert: builders.SB3Expert, mlagents_export: Path, tmp_path_factory: pytest.TempPathFactory
) -> SharedSweeps:
    return SharedSweeps(tmp_path_factory.mktemp("shared") / "results", ray_head, sb3_expert.zip, mlagents_export)


# ---- runs the report tests read (tests/test_report.py, tests/test_report_browser.py) ---------------

SLOWER_RUN = "t-bench-slower"  # a bench-only run (no `runs` row) whose throughput is half the clean run's
INTERRUPTED_RUN, BENCH_RUN = "interrupted", "t1"


def hand_bench_rows(scale: float) -> list[BenchRow]:
    """Bench rows written by hand: valid float32 rows with intervals, invalid bfloat16 ones; the
    numbers a plot draws need not come from a timed run."""
    rows = [
        builders.bench_row(
            dtype=dtype, device=device, batch_size=b, p50_ms=0.05 + b * 4e-4, p95_ms=0.07 + b * 5e-4, p99_ms=0.09 + b * 6e-4
        )
        for dtype in ("float32", "bfloat16")
        for device in ("sim-cpu0", "sim-cpu1")
        for b in (1, 8, 4096)
    ]
    rows += [
        builders.bench_row(
            dtype=dtype,
            device="all",
            n_cards=k,
            batch_size=4096,
            mode="throughput",
            first_call_ms=None,
            p50_ms=None,
            p95_ms=None,
            p99_ms=None,
            mean_ms=None,
            decisions_per_s=scale * 1e6 * k * 0.9 ** (k - 1),
            scaling_efficiency=0.9 ** (k - 1),
            timing="end_to_end",
            valid=dtype == "float32",
            ci_of="decisions_per_s",
            ci_low=scale * 0.95e6 * k * 0.9 ** (k - 1),
            ci_high=scale * 1.05e6 * k * 0.9 ** (k - 1),
            scaling_ci_low=0.85 if k > 1 else None,
            scaling_ci_high=0.93 if k > 1 else None,
        )
        for dtype in ("float32", "bfloat16")
        for k in (1, 2)
    ]
    return rows


@pytest.fixture(scope="session")
def report_results(shared_sweeps: SharedSweeps, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared clean and faults sweeps, copied so that the bench rows added here (to the clean
    run, and a bench-only run at half its throughput) stay out of test_query's view."""
    shared_sweeps.clean()
    shared = shared_sweeps.faults()
    mine = tmp_path_factory.mktemp("report") / "results"
    shutil.copytree(shared, mine, ignore=shutil.ignore_patterns(".staging"))
    write_rows(mine, "bench", CLEAN_RUN, hand_bench_rows(1.0))
    write_rows(mine, "bench", SLOWER_RUN, hand_bench_rows(0.5))
    return mine


@pytest.fixture(scope="session")
def interrupted_run(ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real sweep stopped with Ctrl-C (SIGINT) once its first unit is staged: a run that has not
    finished, with some units done. Its units judge 4096-row batches, so the rest are still to
    come when the signal lands."""
    results = tmp_path_factory.mktemp("interrupted") / "results"
    staging = results / ".staging" / INTERRUPTED_RUN
    sweep = subprocess.Popen(
        [
            *(sys.executable, "-m", "harness", "sweep", "--policy", "huggy-arch", "--dtypes", "float32,float16"),
            *("--batch-sizes", "1,8,4096", "--cards", "2", "--accelerator", "cpu", "--no-progress"),
            *("--results", str(results), "--run-id", INTERRUPTED_RUN, "--address", ray_head.address),
        ],
        cwd=REPO,
        env=ray_head.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # Bounded by the test's timeout (pytest-timeout), not a clock here.
        while not any(staging.glob("*.done")):
            assert sweep.poll() is None, "the sweep ended before it could be interrupted:\n" + sweep.communicate()[1][-3000:]
            time.sleep(0.02)
        sweep.send_signal(signal.SIGINT)
        _, err = sweep.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sweep.pid, signal.SIGKILL)
    assert sweep.returncode != 0 and "Traceback" not in err, err[-3000:]
    return results


@dataclass(frozen=True)
class QuickBench:
    """A real quick-look bench (`--duration 0.05`, so every row is invalid and says so) of the
    shipped cartpole and a user's zip that names no environment, given one with --env: what
    tests/test_bench.py checks row by row, and the report tests title and draw."""

    results: Path
    model: Path  # the user's zip
    sizes: tuple[int, ...]
    proc: subprocess.CompletedProcess[str]


@pytest.fixture(scope="session")
def quick_bench(ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> QuickBench:
    folder = tmp_path_factory.mktemp("bench")
    results, model, sizes = folder / "results", Path(shutil.copy(CARTPOLE_ZIP, folder / "model.zip")), (1, 64)
    proc = cli(
        "bench",
        *("--policy", "cartpole", "--policy", str(model), "--env", "seals/CartPole-v0"),
        *("--card-counts", "1,2", "--batch-sizes", ",".join(map(str, sizes)), "--duration", "0.05"),
        *("--accelerator", "cpu", "--cards", "2", "--no-progress", "--results", str(results), "--run-id", BENCH_RUN),
        *("--address", ray_head.address),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return QuickBench(results, model, sizes, proc)


@pytest.fixture(scope="session")
def bench_run(quick_bench: QuickBench) -> Path:
    return quick_bench.results
