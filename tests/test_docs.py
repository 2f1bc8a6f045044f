"""The front door and the site behind it: a README short enough to read (and naming the test
command CI and the hooks expect), an mkdocs site that builds strictly, a broken link that fails
that build, and the generated parts (every command's options, every table's columns) present."""

from __future__ import annotations

import argparse
import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from harness.store.schema import SCHEMAS
from tests.fuzzing import EXAMPLES
from tests.helpers import REPO

README = (REPO / "README.md").read_text()
needs_mkdocs = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs and mkdocs-material are not installed (the dev extra has them)",
)


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(source: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(source / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=source,
        env={**os.environ, "PYTHONPATH": str(REPO), "NO_MKDOCS_2_WARNING": "1"},
    )


def copy_site(to: Path) -> Path:
    to.mkdir()
    shutil.copy(REPO / "mkdocs.yml", to / "mkdocs.yml")
    # The architecture page draws its layers from the import contracts in it.
    shutil.copy(REPO / "pyproject.toml", to / "pyproject.toml")
    shutil.copytree(REPO / "docs", to / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    return to


def text_of(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def options(parser: argparse.ArgumentParser) -> list[str]:
    return [name for action in parser._actions for name in action.option_strings]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(REPO, out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_readme_is_short_and_names_the_test_command() -> None:
    assert len(README.splitlines()) <= 250
    assert "make test" in README and "make sweep" in README


def test_the_readme_links_only_pages_that_exist() -> None:
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (REPO / target).is_file(), target


def test_every_command_has_its_generated_reference() -> None:
    module = hooks()
    reference = (REPO / "docs" / "reference.md").read_text()
    for name, parser in module.commands().items():
        assert f"<!-- harness-help {name} -->" in reference, name
        rendered = module.on_page_markdown(f"<!-- harness-help {name} -->")
        for option in options(parser):
            assert option in rendered, (name, option)


# A command's synopsis written out by hand: `harness repro RUN_ID [--check KIND] ...`.
HAND_USAGE = re.compile(r"harness [\w-]+ [^`\n]*\[--")


def test_no_page_copies_a_usage_by_hand() -> None:
    """A usage written out by hand drifts from the parser (one lost `--keep-float32`): pages show
    the generated one (`<!-- harness-usage COMMAND -->`, `<!-- harness-help COMMAND -->`)."""
    assert HAND_USAGE.search("`harness repro RUN_ID [--check KIND] [--card LABEL]` takes"), "the check sees one"
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        found = HAND_USAGE.search(page.read_text())
        assert found is None, (page.name, found and found.group(0))
    after = hooks().on_page_markdown((REPO / "docs" / "after-a-fail.md").read_text())
    assert "usage: harness diagnose [-h]" in after and "usage: harness repro [-h]" in after


def test_every_table_has_its_generated_columns() -> None:
    module = hooks()
    results = (REPO / "docs" / "results.md").read_text()
    for table, schema in SCHEMAS.items():
        assert f"<!-- harness-columns {table} -->" in results, table
        rendered = module.on_page_markdown(f"<!-- harness-columns {table} -->")
        for name in ["run_id", *schema.names]:
            assert f"| `{name}` |" in rendered, (table, name)


def test_every_fault_kind_has_its_generated_row() -> None:
    from harness.inference.fault_specs import FAULTS

    assert "<!-- harness-faults -->" in (REPO / "docs" / "fault-injection.md").read_text()
    rendered = hooks().on_page_markdown("<!-- harness-faults -->")
    for kind in FAULTS.values():
        assert f"| `{kind.spec()}` | {kind.strikes.value}" in rendered, kind.name


def test_an_unknown_marker_fails_the_build() -> None:
    module = hooks()
    with pytest.raises(KeyError, match="no command 'swep'"):
        module.on_page_markdown("<!-- harness-help swep -->")
    with pytest.raises(KeyError, match="no table 'chekcs'"):
        module.on_page_markdown("<!-- harness-columns chekcs -->")


def test_the_architecture_picture_is_the_import_contract(tmp_path: Path) -> None:
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    picture = hooks().layers_picture().splitlines()
    drawn = [line.removeprefix("↓ ").strip() for line in picture[1 : picture.index("```", 1)]]
    assert drawn == [" | ".join(part.strip() for part in layer.split("|")) for layer in layers]
    assert "harness.cluster" in drawn and "harness.run" not in " ".join(drawn)
    # Reordered in pyproject.toml, the picture follows; without a layers contract, the build fails.
    swapped = (
        (REPO / "pyproject.toml")
        .read_text()
        .replace('"harness.sweeps",\n', "")
        .replace('"harness.config",\n', '"harness.config",\n    "harness.sweeps",\n')
    )
    (tmp_path / "moved.toml").write_text(swapped)
    moved = hooks().layers_picture(str(tmp_path / "moved.toml"))
    assert moved.index("harness.config") < moved.index("harness.sweeps")
    (tmp_path / "none.toml").write_text('[tool.importlinter]\nroot_packages = ["harness"]\ncontracts = []\n')
    with pytest.raises(KeyError, match="no layers contract"):
        hooks().layers_picture(str(tmp_path / "none.toml"))


@needs_mkdocs
def test_the_site_builds_strictly_with_every_option_and_column(site: Path) -> None:
    reference = text_of(site / "reference" / "index.html")
    for name, parser in hooks().commands().items():
        assert f"usage: harness {name}" in reference, name
        for option in options(parser):
            assert option in reference, (name, option)
    results = text_of(site / "results" / "index.html")
    for schema in SCHEMAS.values():
        for name in schema.names:
            assert name in results, name
    assert "<!-- harness-" not in (site / "reference" / "index.html").read_text()
    architecture = text_of(site / "architecture" / "index.html")
    assert "↓ harness.sweeps" in architecture and "<!-- harness-" not in architecture


@needs_mkdocs
def test_a_broken_relative_link_fails_the_strict_build(tmp_path: Path) -> None:
    source = copy_site(tmp_path / "source")
    page = source / "docs" / "bench.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    done = build(source, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr


def test_the_fuzz_counts_the_ci_page_states_are_what_the_tests_draw() -> None:
    ci = (REPO / "docs" / "ci.md").read_text()
    commands = len(hooks().commands())
    if "HARNESS_FUZZ_EXAMPLES" in os.environ:
        pytest.skip("HARNESS_FUZZ_EXAMPLES asks for other counts than the page states")
    count = EXAMPLES
    for test, per, unit, total in (
        ("test_fuzz_cli.py", "examples per command", commands, "commands"),
        ("test_fuzz_policy_files.py", "mutants per\npolicy", 5, None),
    ):
        assert re.search(rf"{count} {per}".replace(" ", r"\s+"), ci), (test, count)
        in_all = f"{int(count) * unit} in all"
        assert in_all in ci.replace("\n", " "), (test, in_all)
        if total:
            assert f"{unit} {total}" in ci, (test, unit)
