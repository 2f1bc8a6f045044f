"""The sign-off pages in a real browser: Debian's headless Chromium, driven through Selenium and
chromium-driver, never by parsing the HTML. Each kind of page (a passed run, a failed one, one
that has not finished, a bench, a comparison) must show every image, ask for nothing outside its
own file (the DevTools network log and the resource timings), link only inside itself, and show
in its grid the verdicts that the run's Parquet holds, read back here with pyarrow.

A screenshot of each page is kept under $HARNESS_ARTIFACTS/report-pages, or pytest's temporary
folder where that is not set; the folder is printed. Where Chromium or its driver is absent the
tests skip saying so, unless HARNESS_REQUIRE_BROWSER=1 (CI, which installs it with
scripts/install_browser.sh): then they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from tests.conftest import BENCH_RUN, CLEAN_RUN, FAULTS_RUN, INTERRUPTED_RUN
from tests.helpers import cli, read_table, staged_checks

pytestmark = pytest.mark.slow

# Headless, as root, with no network of its own: no sandbox (root), no GPU, /dev/shm unused, and
# none of the background fetches (updates, sync, component downloads) a first run makes.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
WIDTH = 1400


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    needed = {"chromium": chromium, "chromedriver": driver, "selenium": webdriver}
    missing = [name for name, found in needed.items() if not found]
    if missing:
        reason = f"headless Chromium is not here ({', '.join(missing)} missing; scripts/install_browser.sh installs it)"
        if os.environ.get("HARNESS_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason}, but HARNESS_REQUIRE_BROWSER=1 says it must be")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # the DevTools network events
    # The driver is named: Selenium Manager, which would look one up on the network, never runs.
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=str(driver)))
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Path:
    root = os.environ.get("HARNESS_ARTIFACTS")
    folder = Path(root) / "report-pages" if root else tmp_path_factory.mktemp("report-pages")
    folder.mkdir(parents=True, exist_ok=True)
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"sign-off page screenshots: {folder}")
    return folder


@dataclass
class Loaded:
    """A page as the browser shows it."""

    url: str
    badge: str
    images: list[dict[str, Any]]
    requests: list[str]  # every URL the page asked for (DevTools Network.requestWillBeSent)
    resources: list[str]  # performance.getEntriesByType("resource")
    links: list[str]
    ids: set[str]
    cells: list[dict[str, str]]  # the grid's cells: their data-* attributes and text
    browser: Any

    def texts(self, selector: str) -> list[str]:
        from selenium.webdriver.common.by import By

        return [e.text for e in self.browser.find_elements(By.CSS_SELECTOR, selector)]


def open_page(browser: Any, page: Path, artifacts: Path, name: str) -> Loaded:
    from selenium.webdriver.support.wait import WebDriverWait

    browser.get_log("performance")  # let go of the entries of pages opened before
    browser.set_window_size(WIDTH, 900)
    browser.get(page.as_uri())
    script = browser.execute_script
    WebDriverWait(browser, 60).until(lambda b: b.execute_script("return document.readyState") == "complete")
    events = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    loaded = Loaded(
        url=page.as_uri(),
        badge=script("return document.getElementById('verdict').innerText"),
        images=script("return Array.from(document.images, i => ({complete: i.complete, width: i.naturalWidth, src: i.src}))"),
        requests=[e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"],
        resources=script("return performance.getEntriesByType('resource').map(e => e.name)"),
        links=script("return Array.from(document.querySelectorAll('[href]'), a => a.getAttribute('href'))"),
        ids=set(script("return Array.from(document.querySelectorAll('[id]'), e => e.id)")),
        cells=script(
            "return Array.from(document.querySelectorAll('td[data-check]'), "
            "td => Object.assign({text: td.innerText}, td.dataset))"
        ),
        browser=browser,
    )
    height = script("return document.documentElement.scrollHeight")
    browser.set_window_size(WIDTH, min(height + 120, 30000))
    browser.save_screenshot(str(artifacts / f"{name}.png"))
    return loaded


def assert_whole_and_alone(page: Loaded, min_images: int) -> None:
    """Every image drawn, nothing asked for outside the file, every link inside the page."""
    assert len(page.images) >= min_images, page.images
    for image in page.images:
        assert image["complete"] and image["width"] > 0, f"broken image {image['src'][:60]}"
        assert image["src"].startswith("data:image/"), image["src"][:60]
    assert page.requests, "the DevTools log saw the page load"
    for url in page.requests:
        assert url == page.url or url.startswith("data:"), f"the page asked for {url[:100]}"
    assert all(url.startswith("data:") for url in page.resources), page.resources
    for link in page.links:
        assert link.startswith("#") and link[1:] in page.ids, link


def verdicts(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], str]:
    """What each (policy, dtype, check) cell must say, from the rows' own `gating` and `passed`:
    FAIL where a gating row failed, finding where only a non-gating one did, else PASS (gating) or pass."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["kind"] != "bench_audit":
            groups[r["policy"], r["dtype"], r["kind"]].append(r)
    expected = {}
    for key, mine in groups.items():
        if any(r["gating"] and not r["passed"] for r in mine):
            expected[key] = "FAIL"
        elif any(not r["passed"] for r in mine):
            expected[key] = "finding"
        else:
            expected[key] = "PASS" if any(r["gating"] for r in mine) else "pass"
    return expected


def parquet_checks(results: Path, run_id: str) -> list[dict[str, Any]]:
    checks = ds.dataset(results / "checks", format="parquet", partitioning="hive")
    return checks.to_table(filter=ds.field("run_id") == run_id).to_pylist()


def shown(page: Loaded, attribute: str = "verdict") -> dict[tuple[str, str, str], str]:
    return {(c["policy"], c["dtype"], c["check"]): c[attribute] for c in page.cells}


def write_page(results: Path, run_id: str, out: Path, code: int) -> Path:
    proc = cli("report", run_id, "--results", str(results), "--out", str(out))
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out / f"report-{run_id}.html"


def test_a_passed_run(browser: Any, artifacts: Path, report_results: Path, tmp_path: Path) -> None:
    page = open_page(browser, write_page(report_results, CLEAN_RUN, tmp_path, 0), artifacts, "passed")
    assert page.badge == "PASSED"
    # The port rule, the histogram of errors against the golden, the episodes, and the hand-written bench rows' plots.
    assert_whole_and_alone(page, min_images=6)
    assert shown(page) == verdicts(parquet_checks(report_results, CLEAN_RUN))
    assert {"verdicts", "configuration", "devices", "findings", "port-rule", "episodes", "bench"} <= page.ids
    assert "failures" not in page.ids, "nothing failed: no part about failures"
    invalid = [r for r in read_table(report_results, "bench").to_pylist() if r["run_id"] == CLEAN_RUN and not r["valid"]]
    assert len(page.texts("#bench table.invalid tbody tr")) == len(invalid) > 0


def test_a_failed_run(browser: Any, artifacts: Path, report_results: Path, tmp_path: Path) -> None:
    page = open_page(browser, write_page(report_results, FAULTS_RUN, tmp_path, 1), artifacts, "failed")
    assert page.badge == "FAILED"
    assert_whole_and_alone(page, min_images=3)
    expected = verdicts(parquet_checks(report_results, FAULTS_RUN))
    assert shown(page) == expected and "FAIL" in expected.values()
    # Failures grouped by cause: card 3's corrupted weight, named with its first diverging layer.
    causes = page.texts("#failures .cause > div:first-child")
    fault = "fault injected on this card: card3:corrupt-weight"
    assert any(c.startswith("sim-cpu3 · cpu_reference") and fault in c for c in causes), causes
    layers = page.texts("#failures .cause table tbody td:nth-child(5)")
    assert any(cell.startswith("body.0 Linear(") for cell in layers), layers[:5]
    # Findings sit under a heading that never says failed.
    assert "fail" not in page.texts("#findings h2")[0].lower()
    assert any("batch invariance" in line for line in page.texts("#findings li"))


def test_a_run_that_has_not_finished(browser: Any, artifacts: Path, interrupted_run: Path, tmp_path: Path) -> None:
    page = open_page(browser, write_page(interrupted_run, INTERRUPTED_RUN, tmp_path, 3), artifacts, "incomplete")
    assert page.badge == "INCOMPLETE"
    assert_whole_and_alone(page, min_images=1)
    assert shown(page) == verdicts(staged_checks(interrupted_run, INTERRUPTED_RUN))
    assert all(c["text"].split("\n")[0].endswith(" so far") for c in page.cells)
    [resume] = page.texts("header .resume code")
    assert resume.startswith(f"harness sweep --resume {INTERRUPTED_RUN} --results {interrupted_run}")


def test_a_bench(browser: Any, artifacts: Path, bench_run: Path, tmp_path: Path) -> None:
    page = open_page(browser, write_page(bench_run, BENCH_RUN, tmp_path, 0), artifacts, "bench")
    assert page.badge == "BENCH"
    assert_whole_and_alone(page, min_images=3)
    assert page.cells == [], "a bench has no grid of verdicts"
    rows = read_table(bench_run, "bench").to_pylist()
    assert len(page.texts("#bench table.invalid tbody tr")) == len(rows), "every row of a quick look is invalid"
    assert f"0 of {len(rows)} rows valid" in page.texts("#bench .lede")[0]
    assert page.texts("#bench p.v-pass-gating")[0].startswith("audit: ")


def test_a_comparison(browser: Any, artifacts: Path, report_results: Path, tmp_path: Path) -> None:
    proc = cli("report", "--compare", CLEAN_RUN, FAULTS_RUN, "--results", str(report_results), "--out", str(tmp_path))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    page = open_page(browser, tmp_path / f"compare-{CLEAN_RUN}-{FAULTS_RUN}.html", artifacts, "compare")
    assert page.badge == "REGRESSED"
    assert_whole_and_alone(page, min_images=0)
    a, b = (verdicts(parquet_checks(report_results, run)) for run in (CLEAN_RUN, FAULTS_RUN))
    assert {k: v for k, v in shown(page, "verdictA").items() if v != "absent"} == a
    assert {k: v for k, v in shown(page, "verdictB").items() if v != "absent"} == b
    differences = page.texts("#differences tbody tr")
    assert any(row.startswith("dtypes float32, float16 float32") for row in differences), differences
    assert any(row.startswith("inject fault none card1:perturb-weight") for row in differences), differences


def test_the_checks_above_see_a_broken_image_and_a_request_out(browser: Any, artifacts: Path, tmp_path: Path) -> None:
    """The page checks can fail: an image that does not decode, and one fetched from elsewhere
    (the network is closed: the request is made, and fails)."""
    broken = tmp_path / "broken.html"
    broken.write_text(
        '<!doctype html><html><body><div id="verdict">X</div><img src="data:image/png;base64,AAAA"></body></html>'
    )
    with pytest.raises(AssertionError, match="broken image"):
        assert_whole_and_alone(open_page(browser, broken, artifacts, "negative-broken"), min_images=1)
    outside = tmp_path / "outside.html"
    outside.write_text(
        '<!doctype html><html><body><div id="verdict">X</div><a href="#verdict">in</a>'
        '<link rel="stylesheet" href="http://127.0.0.1:9/style.css"></body></html>'
    )
    with pytest.raises(AssertionError, match=re.escape("the page asked for http://127.0.0.1:9/style.css")):
        assert_whole_and_alone(open_page(browser, outside, artifacts, "negative-outside"), min_images=0)
