"""The parts every page is made of: one HTML file with its style inline, figures as data URIs,
no script, nothing fetched, no link out of the file; long text folded in `<details>`.

The Python side says what a page holds (which rows, which verdicts, in what order) as the plain
records below; jinja2 templates under `templates/` lay it out, with autoescaping on, so every
value is escaped by the engine where it enters the markup and nothing by hand. `page.css` is
inlined at render time: the page is still one file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import jinja2
from markupsafe import Markup

from harness.report.plots import data_uri

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def verdict_class(verdict: str) -> str:
    """The CSS class of a verdict word: FAIL 3 -> fail, finding 2 -> finding, PASS -> pass-gating."""
    word = verdict.split(" ")[0]
    return {"PASS": "pass-gating", "pass": "pass"}.get(word, word.lower())


def fold_head(value: str, limit: int | None) -> str | None:
    """The start shown of text longer than `limit` characters (cut at a space where one is not
    too early), the rest folded; None where the text is shown as it is."""
    if limit is None or len(value) <= limit:
        return None
    cut = value.rfind(" ", 0, limit)
    return value[: cut if cut > 40 else limit] + " ..."


@dataclass(frozen=True)
class Cell:
    """A table cell that is more than its text: `parts.html.j2`'s `cell` lays it out."""

    text: str
    title: str | None = None  # shown on hover: a policy's full name under its short one
    class_: str | None = None  # a span of this class around the text
    fold: int | None = None  # text longer than this folded after its start
    detail: bool = False  # the whole text folded under "detail", as monospace
    code: bool = False
    block: bool = False  # a div, not a span (a column that wraps: the bench's "why")


# What a table cell holds: text as it is, a Cell, or several of them side by side.
Content = str | Cell | Sequence[str | Cell]


def as_text(value: object) -> str:
    """A value as a cell shows it; None as nothing."""
    return "" if value is None else str(value)


def policy_cell(name: str, label: str) -> Cell:
    """A policy by its short label, its full name on hover."""
    return Cell(label, title=name)


@dataclass(frozen=True)
class Table:
    columns: Sequence[str]
    rows: Sequence[Sequence[Content]]
    class_: str | None = None
    shown: int | None = None  # rows shown before the rest is folded under "N more"
    more: str = "more"  # what the folded rest is called after its count


@dataclass(frozen=True)
class Plot:
    """A figure drawn once, inline as a data URI."""

    src: str
    caption: str
    alt: str


def plot(fig: Figure, caption: str, alt: str) -> Plot:
    return Plot(data_uri(fig), caption, alt)


@dataclass
class PageSection:
    """A titled part of a page with an anchor; `lede` is one line saying what it shows. `macro` is
    the macro of the page's template that lays out `data`."""

    anchor: str
    title: str
    macro: str
    data: dict[str, Any] = field(default_factory=dict)
    lede: str = ""


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("harness.report", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["verdict_class"] = verdict_class
_ENV.filters["fold_head"] = fold_head
_ENV.tests["cell"] = lambda value: isinstance(value, Cell)


def document(
    template: str, title: str, sections: Sequence[PageSection], header: dict[str, Any], footer: dict[str, Any]
) -> str:
    """The whole page: `page.html.j2` around the header, sections and footer that `template`'s
    macros lay out. The navigation links are fragments of this page (`#anchor`), never files."""
    style = Markup(resources.files("harness.report").joinpath("templates/page.css").read_text(encoding="utf-8"))
    return _ENV.get_template("page.html.j2").render(
        page=template, title=title, sections=sections, style=style, header=header, footer=footer
    )
