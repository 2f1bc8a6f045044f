"""mkdocs hooks: the pages' generated parts, from the code itself, never copied by hand.

`<!-- harness-help COMMAND -->` becomes that command's `--help` (from `harness.cli.build_parser()`,
which imports no torch), `<!-- harness-usage COMMAND -->` its usage lines alone,
`<!-- harness-columns TABLE -->` a table of that Parquet table's columns (from
`harness.store.schema.SCHEMAS`), each with its type and, where the row's dataclass or the result
type that fills it says one, its meaning; `<!-- harness-faults -->` a table of the kinds of fault
`--inject-fault` takes (from their records, `harness.inference.fault_specs.FAULTS`);
`<!-- harness-layers -->` the picture of the layers from the import contracts in `pyproject.toml`,
the ones `lint-imports` holds. An unknown name fails the build.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import tomllib
from dataclasses import fields, is_dataclass
from typing import Any, get_args

HELP = re.compile(r"<!-- harness-help ([\w-]+) -->")
USAGE = re.compile(r"<!-- harness-usage ([\w-]+) -->")
COLUMNS = re.compile(r"<!-- harness-columns (\w+) -->")
LAYERS = "<!-- harness-layers -->"
PYPROJECT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
FAULTS = "<!-- harness-faults -->"
# A field's trailing comment in a dataclass body: `name: type  # what it is`.
FIELD_COMMENT = re.compile(r"^\s+(\w+): [^#\n]+?#\s*(.+)$", re.M)
WIDTH = "100"


def on_page_markdown(markdown: str, **_: Any) -> str:
    markdown = HELP.sub(lambda match: help_text(match.group(1)), markdown)
    markdown = USAGE.sub(lambda match: help_text(match.group(1), usage_only=True), markdown)
    if LAYERS in markdown:
        markdown = markdown.replace(LAYERS, layers_picture())
    markdown = markdown.replace(FAULTS, faults_table()) if FAULTS in markdown else markdown
    return COLUMNS.sub(lambda match: columns_table(match.group(1)), markdown)


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser by name, as `harness --help` lists them."""
    from harness.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise RuntimeError("harness's parser has no subcommands")


def help_text(command: str, usage_only: bool = False) -> str:
    """`harness COMMAND --help` (or its usage lines alone) as a fenced block, at a fixed width so
    the page does not depend on the terminal that built it."""
    parsers = commands()
    if command not in parsers:
        raise KeyError(f"harness-help: no command {command!r} (commands: {', '.join(parsers)})")
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        text = parsers[command].format_usage() if usage_only else parsers[command].format_help()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return f"```text\n{text.rstrip()}\n```"


def meanings() -> dict[str, dict[str, str]]:
    """The one-line meaning of each column, by table, from the comments of the row dataclasses
    and, for the result columns of `checks`, of the result types that fill them."""
    from harness.judge import results
    from harness.store import schema

    rows: dict[str, type] = {
        "runs": schema.RunRow,
        "checks": schema.CheckRow,
        "episodes": schema.EpisodeRow,
        "bench": schema.BenchRow,
        "bench_samples": schema.BenchSampleRow,
    }
    found = {table: field_comments(row) for table, row in rows.items()}
    found["runs"] |= field_comments(schema.RunSummary)
    # A column several result types hold takes the meaning of the first that declares it, or none.
    declared: set[str] = set(found["checks"])
    for result_type in get_args(results.Result):
        for name, text in field_comments(result_type).items():
            if name not in declared:
                found["checks"][name] = text
        declared.update(f.name for f in fields(result_type))
    for table in found:
        found[table].setdefault("run_id", "the run: the folder `run_id=<id>` (hive partitioning)")
    return found


def field_comments(row: type) -> dict[str, str]:
    if not is_dataclass(row):
        raise TypeError(f"{row} is no dataclass")
    names = {f.name for f in fields(row)}
    source = inspect.getsource(row)
    return {name: text.strip() for name, text in FIELD_COMMENT.findall(source) if name in names}


def columns_table(table: str) -> str:
    """`table`'s columns as a Markdown table: run_id (the partition) first, then the schema's."""
    from harness.store.schema import SCHEMAS

    if table not in SCHEMAS:
        raise KeyError(f"harness-columns: no table {table!r} (tables: {', '.join(SCHEMAS)})")
    meaning = meanings()[table]
    lines = ["| column | type | meaning |", "|---|---|---|", f"| `run_id` | string | {meaning['run_id']} |"]
    for field in SCHEMAS[table]:
        text = meaning.get(field.name, "").replace("|", "\\|")
        lines.append(f"| `{field.name}` | {field.type} | {text} |")
    return "\n".join(lines)


def layers_picture(pyproject: str = PYPROJECT) -> str:
    """The layers contract as a picture, top layer first: each may import those below it, never
    above; siblings on one line (`a | b`) import neither each other. Then each forbidden contract."""
    with open(pyproject, "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    lines: list[str] = []
    for contract in contracts:
        if contract["type"] == "layers":
            for i, layer in enumerate(contract["layers"]):
                lines.append(("↓ " if i else "  ") + " | ".join(part.strip() for part in layer.split("|")))
    forbidden = [
        f"- {contract['name']}: {', '.join(contract['source_modules'])} import none of "
        + ", ".join(contract["forbidden_modules"])
        for contract in contracts
        if contract["type"] == "forbidden"
    ]
    if not lines:
        raise KeyError("harness-layers: pyproject.toml has no layers contract")
    return "```text\n" + "\n".join(lines) + "\n```\n\n" + "\n".join(forbidden)


def faults_table() -> str:
    """Every kind of fault as a Markdown table: how a spec writes it, what it strikes, the dtype
    it acts on alone, and what it does."""
    from harness.inference.fault_specs import kinds

    lines = ["| kind | strikes | acts only on | what it does |", "|---|---|---|---|"]
    for kind in kinds():
        only = ", ".join(filter(None, (kind.dtype, "a masked policy" if kind.masked_only else None)))
        size = "" if kind.size is None else f" (SIZE {kind.size:g} where none is given)"
        once = " (once per run, across restarts)" if kind.once else ""
        what = f"{kind.what}{size}".replace("|", "\\|")
        lines.append(f"| `{kind.spec()}` | {kind.strikes.value}{once} | {only} | {what} |")
    return "\n".join(lines)
