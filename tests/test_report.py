"""`harness report` and `--compare` on the session's real clean sweep, its real sweep with a fault
on each of three cards, a real sweep stopped with Ctrl-C and a real quick-look bench
(tests/conftest.py). The verdict and exit code follow the run; the sign-off page is one file.
How the page looks in a browser is tests/test_report_browser.py.
"""

from __future__ import annotations

import shutil
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.judge.compare import ToleranceComparison
from harness.judge.outcome import EXIT_CODES, Gating, Verdict, run_verdict
from harness.report.run_page import first_mismatch
from harness.store.schema import CheckRow
from harness.store.writer import write_rows
from tests.conftest import BENCH_RUN, INTERRUPTED_RUN, Head
from tests.conftest import CLEAN_RUN as CLEAN
from tests.conftest import FAULTS_RUN as FAULTY
from tests.conftest import SLOWER_RUN as SLOWER
from tests.helpers import REPO, assert_usage_error, cli, read_table, staged_checks


@pytest.fixture(scope="module")
def results(report_results: Path) -> Path:
    return report_results


class Page(HTMLParser):
    """What a page refers to: its images' sources, its links, its tags and its elements' ids."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.tags: set[str] = set()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"] or "")
        if tag == "img":
            self.images.append(values["src"] or "")
        self.links += [v for k, v in attrs if k in ("href", "src") and v and tag != "img"]


def parse_page(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.mark.slow
def test_terminal_report_of_the_latest_run(results: Path) -> None:
    proc = cli("report", "--results", str(results))
    assert proc.returncode == 1, proc.stderr  # the latest run (by started_at) is the perturbed one
    out = proc.stdout
    assert out.startswith(f"run {FAULTY}: FAILED")
    assert "card1:perturb-weight,card2:mkl-avx2,card3:corrupt-weight" in out
    verdicts = out.split("Verdict per policy and dtype")[1].split("Failed checks")[0]
    assert "FAIL" in verdicts and "cpu_reference" in verdicts and "decisions" in verdicts
    failed = out.split("Failed checks (these gate the run)")[1].split("Findings (reported, not gating)")[0]
    assert "cross_card" in failed and "sim-cpu1 vs sim-cpu0" in failed and "first mismatch at [" in failed
    assert "first layer off the golden" in failed
    findings = out.split("Findings (reported, not gating)")[1].split("Properties of the cards")[0]
    assert "tolerance" in findings and "batch_invariance" not in findings
    properties = out.split("Properties of the cards")[1].split("Is the port right")[0]
    assert "batch invariance: sim-cpu0" in properties
    precision = out.split("Is the port right")[1]
    assert "error_ratio (max)" in precision and "limit (min)" in precision and "max_abs vs golden (max)" in precision
    assert "float32" in precision.split() and "logits" in precision and "mu" in precision
    assert "Benchmarks" not in out, "a sweep without bench rows shows no bench table"


@pytest.mark.slow
def test_the_sign_off_page_is_one_file_that_needs_nothing_else(bench_run: Path, tmp_path: Path) -> None:
    """Copied alone, the page shows everything: figures inline, no script, no link out of the file."""
    proc = cli("report", BENCH_RUN, "--results", str(bench_run), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page_file = tmp_path / f"report-{BENCH_RUN}.html"
    assert proc.stdout.rstrip().endswith(f"wrote {page_file}")
    assert sorted(tmp_path.iterdir()) == [page_file], "one file, nothing beside it"
    page = parse_page(page_file)
    assert len(page.images) >= 4 and all(src.startswith("data:image/svg+xml;base64,") for src in page.images)
    assert not page.tags & {"script", "link", "iframe", "object", "embed"}
    for link in page.links:
        assert link.startswith("#") and link[1:] in page.ids, link
    # A bench has no grid of verdicts and no failures: those parts are left out, not left empty.
    assert {"bench", "configuration", "devices"} <= page.ids and not page.ids & {"verdicts", "failures", "port-rule"}


@pytest.mark.slow
def test_the_first_mismatch_of_every_failed_row_is_found_in_its_detail(results: Path) -> None:
    """The page's "first mismatch" column, on the real failed rows of the faults run: the row's
    own first failing element, taken from its detail, whatever kind of check wrote it."""
    starts = {"cross_card": ("first mismatch at [", "seed "), "cpu_reference": ("largest error ",)}
    starts |= {"decisions": ("first at [",), "tolerance": ("at [",), "episode_return": ("seed ",)}
    rows = [r for r in read_table(results, "checks").to_pylist() if r["run_id"] == FAULTY and not r["passed"]]
    kinds = set()
    for r in rows:
        if r["kind"] in starts:
            found = first_mismatch(r["detail"])
            assert found in r["detail"] and found.startswith(starts[r["kind"]]), (r["kind"], found, r["detail"])
            kinds.add(r["kind"])
    assert {"cross_card", "cpu_reference", "decisions", "tolerance"} <= kinds


def test_run_verdicts_and_exit_codes() -> None:
    """The verdict of every kind of run, from its status and its rows."""
    cases = [
        # status, gating, failed, bench rows -> verdict
        (("passed", 10, 0, 0), Verdict.PASSED),
        (("failed", 10, 2, 0), Verdict.FAILED),
        (("failed", 0, 0, 0), Verdict.FAILED),  # a sweep that judged nothing ends failed
        (("error", 0, 0, 0), Verdict.INCOMPLETE),  # no harness writes it: a status not known is unfinished
        (("running", 10, 0, 0), Verdict.INCOMPLETE),  # its finished units passed: not a pass
        (("incomplete", 0, 0, 0), Verdict.INCOMPLETE),
        (("interrupted", 4, 0, 0), Verdict.INCOMPLETE),  # stopped by a signal: resumable
        (("running", 10, 1, 0), Verdict.FAILED),  # a failure found so far stands whatever comes
        (("bench", 0, 0, 18), Verdict.BENCH),
        (("bench", 24, 1, 18), Verdict.FAILED),  # the audit failed
        (("unknown", 0, 0, 6), Verdict.BENCH),  # bench rows without a runs row
        (("unknown", 3, 0, 0), Verdict.PASSED),
        (("unknown", 0, 0, 0), Verdict.NO_CHECKS),
        (("passed", 0, 0, 0), Verdict.NO_CHECKS),
    ]
    for (status, gating, failed, bench), verdict in cases:
        assert run_verdict(status, Gating(gating, failed), bench) == verdict, (status, gating, failed, bench)
    assert {v: EXIT_CODES[v] for v in Verdict} == {
        Verdict.PASSED: 0,
        Verdict.BENCH: 0,
        Verdict.FAILED: 1,
        Verdict.NO_CHECKS: 1,
        Verdict.INCOMPLETE: 3,
        Verdict.INTERRUPTED: 130,  # only the command whose run a signal stopped says it
    }


@pytest.mark.slow
def test_an_interrupted_run_is_incomplete_and_says_how_to_finish_it(interrupted_run: Path, ray_head: Head) -> None:
    staged = staged_checks(interrupted_run, INTERRUPTED_RUN)
    assert staged and all(r["passed"] for r in staged if r["gating"]), "its finished units passed"
    units = len({r["unit_id"] for r in staged})
    proc = cli("report", INTERRUPTED_RUN, "--results", str(interrupted_run))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    headline = proc.stdout.splitlines()[0]
    assert headline.startswith(f"run {INTERRUPTED_RUN}: INCOMPLETE (status "), headline
    assert f"not finished: {units} " in headline and f"{len(staged)} checks" in headline, headline
    resume = f"harness sweep --resume {INTERRUPTED_RUN} --results {interrupted_run} --address {ray_head.address}"
    assert proc.stderr.strip().endswith(f"finish it with: {resume}"), proc.stderr
    assert "PASSED" not in proc.stdout and "Verdict per policy and dtype" in proc.stdout
    # `harness query` sees only what is committed: nothing of this run yet.
    query = cli("query", "SELECT count(*) AS n FROM checks", "--results", str(interrupted_run), "--format", "csv")
    assert query.stdout.split() == ["n", "0"]


@pytest.mark.slow
def test_a_failure_in_the_finished_units_of_an_unfinished_run_fails_it(interrupted_run: Path, tmp_path: Path) -> None:
    """One staged gating row turned to failed by hand: FAILED (exit 1) though not finished, with
    the command that finishes it still said."""
    results = tmp_path / "results"
    shutil.copytree(interrupted_run, results)
    staging = results / ".staging" / INTERRUPTED_RUN
    unit = sorted(staging.glob("*.done"))[0].name.removesuffix(".done")
    path = staging / f"{unit}.checks.parquet"
    table = pq.read_table(path)
    first_gating = table.column("gating").to_pylist().index(True)
    passed = [i != first_gating and p for i, p in enumerate(table.column("passed").to_pylist())]
    pq.write_table(table.set_column(table.schema.get_field_index("passed"), "passed", [passed]), path)
    proc = cli("report", INTERRUPTED_RUN, "--results", str(results))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"run {INTERRUPTED_RUN}: FAILED (status ") and ", 1 failed so far)" in proc.stdout
    assert f"finish it with: harness sweep --resume {INTERRUPTED_RUN} --results {results}" in proc.stderr


@pytest.mark.slow
def test_a_bench_is_titled_by_how_many_of_its_rows_are_valid(bench_run: Path) -> None:
    rows = read_table(bench_run, "bench")
    assert rows.num_rows and not any(rows.column("valid").to_pylist()), "a quick look is never a result"
    proc = cli("report", BENCH_RUN, "--results", str(bench_run))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    audit = read_table(bench_run, "checks").num_rows
    assert proc.stdout.splitlines()[0] == (
        f"run {BENCH_RUN}: BENCH (status bench; 0 of {rows.num_rows} bench rows valid: none is a result; "
        f"audit passed ({audit} outputs sampled))"
    )
    assert "PASSED" not in proc.stdout


@pytest.mark.slow
def test_a_bench_whose_audit_failed_is_failed(bench_run: Path, tmp_path: Path) -> None:
    """One audit row of the real bench turned to failed by hand: FAILED, exit 1, still titled by its valid rows."""
    results = tmp_path / "results"
    shutil.copytree(bench_run, results)
    [path] = (results / "checks").glob("*/*.parquet")
    table = pq.read_table(path)
    passed = [i != 0 and p for i, p in enumerate(table.column("passed").to_pylist())]
    pq.write_table(table.set_column(table.schema.get_field_index("passed"), "passed", [passed]), path)
    proc = cli("report", BENCH_RUN, "--results", str(results))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    headline = proc.stdout.splitlines()[0]
    assert headline.startswith(f"run {BENCH_RUN}: FAILED (status bench; 0 of ") and "audit: 1 failed" in headline, headline


@pytest.mark.slow
def test_compare_says_how_the_runs_differ_before_matching_them(results: Path, tmp_path: Path) -> None:
    proc = cli("report", "--compare", CLEAN, FAULTY, "--results", str(results), "--out", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    differences = proc.stdout.split("the runs differ in")[1].split("checks matched")[0]
    lines = [line.split() for line in differences.splitlines()]
    for what, a, b in [
        (["dtypes"], ["float32,", "float16"], ["float32"]),
        (["inject", "fault"], ["none"], ["card1:perturb-weight,", "card2:mkl-avx2,", "card3:corrupt-weight"]),
        (["cards"], ["2"], ["4"]),
    ]:
        at = lines.index([*what, "A:", *a])
        assert lines[at + 1] == ["B:", *b], lines[at : at + 2]
    assert any(line[:2] == ["policies", "A:"] for line in lines)
    assert (tmp_path / f"compare-{CLEAN}-{FAULTY}.html").is_file()


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
    assert "the two runs were made alike (configuration, policies, versions, devices)" in proc.stdout


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


def check_row(passed: bool, max_abs: float, gating: bool = True, policy: str = "cartpole", detail: str = "") -> CheckRow:
    return CheckRow(
        unit_id="u1",
        policy=policy,
        dtype="bfloat16",
        workload="normal-b8-s0",
        output="logits",
        kind="tolerance",
        device_a="npu1",
        device_b="cpu",
        input_sha256="ab" * 32,
        gating=gating,
        result=ToleranceComparison(
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
            detail="" if passed else detail or "max_abs 3 > 0.05 + 0.02 * 2.1",
        ),
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


class Shown(HTMLParser):
    """A page's elements and its text as a reader sees it (entities decoded)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text += data


def test_a_policy_or_detail_holding_markup_is_shown_as_text(tmp_path: Path) -> None:
    """Fault injection for escaping: a policy named with `<script>` and `&`, and a failed row's
    detail holding a whole script, reach both pages as text, with no element of their own."""
    policy, detail = "<script>x & y", '<script>alert("detail")</script> & <b>bold</b>'
    write_rows(tmp_path, "checks", "a", [check_row(True, 0.01, policy=policy)])
    write_rows(tmp_path, "checks", "b", [check_row(False, 3.0, policy=policy, detail=detail)])
    pages = tmp_path / "pages"
    assert cli("report", "b", "--results", str(tmp_path), "--out", str(pages)).returncode == 1
    assert cli("report", "--compare", "a", "b", "--results", str(tmp_path), "--out", str(pages)).returncode == 1
    for page in (pages / "report-b.html", pages / "compare-a-b.html"):
        shown = Shown()
        shown.feed(page.read_text(encoding="utf-8"))
        assert "script" not in shown.tags and "<b>bold" not in page.read_text(), page.name
        assert policy in shown.text and detail in shown.text, page.name


def test_a_folder_the_system_refuses_is_one_line(tmp_path: Path) -> None:
    """/proc takes no folder: as root `os.access` says it may, and the page's write is where it
    fails; either way one line and exit 2, never a traceback."""
    write_rows(tmp_path, "checks", "a", [check_row(True, 0.01)])
    write_rows(tmp_path, "checks", "b", [check_row(False, 3.0)])
    for words in (["b"], ["--compare", "a", "b"]):
        proc = cli("report", *words, "--results", str(tmp_path), "--out", "/proc/harness-pages")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("harness: error: --out /proc/harness-pages"), proc.stderr


def test_an_installed_harness_has_every_template() -> None:
    """The pages are rendered from files beside the code: each is package data in pyproject.toml."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["harness"]
    package = REPO / "harness"
    templates = [p.relative_to(package) for p in (package / "report" / "templates").iterdir()]
    assert templates and all(any(t.match(g) for g in globs) for t in templates), (templates, globs)


def test_report_bad_input_is_exit_2(tmp_path: Path) -> None:
    write_rows(tmp_path, "checks", "a", [check_row(True, 0.01)])
    assert_usage_error(cli("report", "--compare", "a", "zz", "--results", str(tmp_path)), "unknown run id 'zz'", "a")
    assert_usage_error(
        cli("report", "--compare", "a", "a", "--error-factor", "0.5", "--results", str(tmp_path)), "--error-factor"
    )
    assert_usage_error(cli("report", "--results", str(tmp_path / "empty")), "does not exist")
