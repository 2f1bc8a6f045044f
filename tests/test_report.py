"""`harness report` and `--compare` on the session's real clean sweep and its real sweep with a
fault on each of three cards (tests/conftest.py, tests/test_sweep.py).

Bench rows are written with `harness.store.writer.write_rows` (real Parquet), since the numbers a
plot draws need not come from a timed run. The HTML page is parsed; its images must exist and load.
"""

from __future__ import annotations

import shutil
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import pytest

from harness.store.schema import CheckRow
from harness.store.writer import write_rows
from tests.builders import bench_row
from tests.conftest import CLEAN_RUN as CLEAN
from tests.conftest import FAULTS_RUN as FAULTY
from tests.conftest import SharedSweeps
from tests.helpers import assert_usage_error, cli

SLOWER = "t-bench-slower"  # a bench-only run whose throughput is half the clean run's
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def bench_rows(scale: float) -> list:
    rows = [
        bench_row(
            dtype=dtype, device=device, batch_size=b, p50_ms=0.05 + b * 4e-4, p95_ms=0.07 + b * 5e-4, p99_ms=0.09 + b * 6e-4
        )
        for dtype in ("float32", "bfloat16")
        for device in ("sim-cpu0", "sim-cpu1")
        for b in (1, 8, 4096)
    ]
    rows += [
        bench_row(
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


@pytest.fixture(scope="module")
def results(shared_sweeps: SharedSweeps, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared sweeps, copied so that the bench rows added here stay out of test_query's view."""
    shared_sweeps.clean()
    shared = shared_sweeps.faults()
    mine = tmp_path_factory.mktemp("report") / "results"
    shutil.copytree(shared, mine, ignore=shutil.ignore_patterns(".staging"))
    write_rows(mine, "bench", CLEAN, bench_rows(1.0))
    write_rows(mine, "bench", SLOWER, bench_rows(0.5))
    return mine


class Page(HTMLParser):
    """The parts of the page the tests look at: tables (header cells), images, outside links."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[str]] = []
        self.images: list[str] = []
        self.links: list[str] = []
        self.tags: set[str] = set()
        self._in_th = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        values = dict(attrs)
        if tag == "table":
            self.tables.append([])
        self._in_th = tag == "th"
        if tag == "img":
            self.images.append(values["src"] or "")
        self.links += [v for k, v in attrs if k in ("href", "src") and v]

    def handle_data(self, data: str) -> None:
        if self._in_th:
            self.tables[-1].append(data)

    def handle_endtag(self, tag: str) -> None:
        self._in_th = False


def parse_page(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


@pytest.mark.slow
def test_terminal_report_of_the_latest_run(results: Path) -> None:
    proc = cli("report", "--results", str(results))
    assert proc.returncode == 1, proc.stderr  # the latest run (by started_at) is the perturbed one
    out = proc.stdout
    assert out.startswith(f"run {FAULTY}: FAILED")
    assert "card1:perturb-weight,card2:mkl-avx2,card3:corrupt-weight" in out
    verdicts = out.split("Verdict per policy and dtype")[1].split("Failed checks")[0]
    assert "FAIL" in verdicts and "cpu_reference" in verdicts and "decisions" in verdicts
    failed = out.split("Failed checks")[1].split("Properties of the cards")[0]
    assert "cross_card" in failed and "sim-cpu1 vs sim-cpu0" in failed and "first mismatch at [" in failed
    assert "first layer off the golden" in failed
    properties = out.split("Properties of the cards")[1].split("Is the port right")[0]
    assert "batch invariance: sim-cpu0" in properties
    precision = out.split("Is the port right")[1].split("Benchmarks")[0]
    assert "error_ratio (max)" in precision and "limit (min)" in precision and "max_abs vs golden (max)" in precision
    assert "float32" in precision.split() and "logits" in precision and "mu" in precision


@pytest.mark.slow
def test_html_page_with_tables_and_plots(results: Path, tmp_path: Path) -> None:
    proc = cli("report", CLEAN, "--results", str(results), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped" not in proc.stdout
    page = parse_page(tmp_path / "report.html")
    headers = [set(t) for t in page.tables]
    assert any({"policy", "dtype", "check", "verdict"} <= h for h in headers)
    assert any({"error_ratio (max)", "max_ratio (max)", "verdict"} <= h for h in headers)
    assert any({"p50 ms", "decisions/s"} <= h for h in headers)
    assert sorted(page.images) == ["errors.png", "latency.png", "returns.png", "scaling.png", "throughput.png"]
    for image in page.images:
        assert_png(tmp_path / image)
    # Readable offline: no scripts, nothing fetched from elsewhere.
    assert "script" not in page.tags and "link" not in page.tags
    assert all("://" not in link for link in page.links)


@pytest.mark.slow
def test_plots_without_data_are_skipped_with_a_note(results: Path, tmp_path: Path) -> None:
    (tmp_path / "latency.png").write_bytes(b"an older run's plot")
    proc = cli("report", FAULTY, "--results", str(results), "--out", str(tmp_path))
    assert proc.returncode == 1
    assert "plot throughput.png skipped" in proc.stdout and "plot latency.png skipped" in proc.stdout
    assert "plot scaling.png skipped" in proc.stdout
    assert not (tmp_path / "latency.png").exists() and not (tmp_path / "throughput.png").exists()
    page = parse_page(tmp_path / "report.html")
    assert page.images == ["errors.png", "returns.png"]
    assert_png(tmp_path / "errors.png")
    assert "skipped: no bench rows with mode latency" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_compare_flags_the_perturbed_weight(results: Path) -> None:
    proc = cli("report", "--compare", CLEAN, FAULTY, "--results", str(results))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    newly_failed = proc.stdout.split("Checks that passed in A and fail in B")[1].split("Errors (max_abs)")[0]
    assert "cross_card" in newly_failed and "sim-cpu1 vs sim-cpu0" in newly_failed and "first mismatch at [" in newly_failed
    grew = proc.stdout.split("grew more than 2x")[1].split("Throughput")[0]
    assert "was exact" in grew
    assert "REGRESSED" in proc.stdout


@pytest.mark.slow
def test_compare_is_quiet_on_identical_runs(results: Path) -> None:
    proc = cli("report", "--compare", CLEAN, CLEAN, "--results", str(results))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no regression" in proc.stdout and "REGRESSED" not in proc.stdout


@pytest.mark.slow
def test_compare_throughput_threshold(results: Path) -> None:
    dropped = cli("report", "--compare", CLEAN, SLOWER, "--results", str(results))
    assert dropped.returncode == 1
    table = dropped.stdout.split("Throughput that dropped more than 10%")[1]
    assert table.count("50.0%") == 4  # 2 dtypes x 2 card counts at half the rate; latency rows unchanged
    assert cli("report", "--compare", CLEAN, SLOWER, "--drop-percent", "60", "--results", str(results)).returncode == 0


@pytest.mark.slow
def test_unknown_run_id_lists_the_latest(results: Path) -> None:
    proc = cli("report", "no-such-run", "--results", str(results))
    assert_usage_error(proc, "unknown run id 'no-such-run'", FAULTY, CLEAN)


def check_row(passed: bool, max_abs: float, gating: bool = True) -> CheckRow:
    return CheckRow(
        unit_id="u1",
        policy="cartpole",
        dtype="bfloat16",
        workload="normal-b8-s0",
        output="logits",
        kind="tolerance",
        device_a="npu1",
        device_b="cpu",
        input_sha256="ab" * 32,
        gating=gating,
        passed=passed,
        bitwise_equal=False,
        n_elements=16,
        n_mismatch=3,
        max_ulp=9,
        max_abs=max_abs,
        mean_abs=max_abs / 4,
        max_rel=0.01,
        cosine=0.99999,
        ref_max_abs=2.1,
        atol=0.05,
        rtol=0.02,
        min_cos=0.999,
        detail="" if passed else "max_abs 3 > 0.05 + 0.02 * 2.1",
    )


def test_compare_on_rows_altered_by_hand(tmp_path: Path) -> None:
    write_rows(tmp_path, "checks", "a", [check_row(True, 0.01)])
    write_rows(tmp_path, "checks", "b", [check_row(True, 0.019)])
    write_rows(tmp_path, "checks", "c", [check_row(False, 3.0)])
    assert cli("report", "--compare", "a", "b", "--results", str(tmp_path)).returncode == 0  # grew 1.9x: under 2x
    assert cli("report", "--compare", "a", "b", "--error-factor", "1.5", "--results", str(tmp_path)).returncode == 1
    regressed = cli("report", "--compare", "a", "c", "--results", str(tmp_path))
    assert regressed.returncode == 1 and "max_abs 3 > 0.05" in regressed.stdout and "300x" in regressed.stdout
    assert cli("report", "--compare", "c", "a", "--results", str(tmp_path)).returncode == 0  # a fix is no regression


def test_report_bad_input_is_exit_2(tmp_path: Path) -> None:
    write_rows(tmp_path, "checks", "a", [check_row(True, 0.01)])
    assert_usage_error(cli("report", "--compare", "a", "zz", "--results", str(tmp_path)), "unknown run id 'zz'", "a")
    assert_usage_error(
        cli("report", "--compare", "a", "a", "--error-factor", "0.5", "--results", str(tmp_path)), "--error-factor"
    )
    assert_usage_error(cli("report", "--results", str(tmp_path / "empty")), "does not exist")
