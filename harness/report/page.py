"""The parts every page is made of: one HTML file with its style inline, figures as data URIs,
no script, nothing fetched, no link out of the file; long text folded in `<details>`.

Text is escaped where it enters (`text`); `Html` marks what is already markup, so a cell or a
section can hold either and nothing is escaped twice.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.report.plots import data_uri

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class Html(str):
    """Markup that is safe as it is."""


Content = str | Html


def text(value: object) -> Html:
    """Anything as escaped text; None as nothing."""
    if isinstance(value, Html):
        return value
    return Html("" if value is None else html.escape(str(value)))


def tag(name: str, body: Content = "", **attrs: object) -> Html:
    """`<name attrs>body</name>`; attribute names take `_` for `-` and a trailing `_` is dropped
    (`class_`, `data_verdict`); an attribute whose value is None is left out."""
    shown = "".join(
        f' {k.rstrip("_").replace("_", "-")}="{html.escape(str(v), quote=True)}"' for k, v in attrs.items() if v is not None
    )
    return Html(f"<{name}{shown}>{text(body)}</{name}>")


def join(parts: Iterable[Content], sep: str = "") -> Html:
    return Html(sep.join(text(p) for p in parts))


def verdict_class(verdict: str) -> str:
    """The CSS class of a verdict word: FAIL 3 -> fail, finding 2 -> finding, PASS -> pass-gating."""
    word = verdict.split(" ")[0]
    return {"PASS": "pass-gating", "pass": "pass"}.get(word, word.lower())


def table(columns: Sequence[str], rows: Iterable[Sequence[Content]], class_: str | None = None) -> Html:
    """A table that scrolls sideways inside its section where it is wider than the page."""
    head = join(tag("th", c) for c in columns)
    body = join(tag("tr", join(tag("td", cell) for cell in row)) for row in rows)
    return tag("div", tag("table", join([tag("thead", tag("tr", head)), tag("tbody", body)]), class_=class_), class_="wide")


def folded(summary: Content, body: Content, open_: bool = False) -> Html:
    return tag("details", join([tag("summary", summary), body]), open=("" if open_ else None))


def fold_long(value: str, limit: int = 120) -> Html:
    """Text up to `limit` characters as it is; longer, its start with the rest folded."""
    if len(value) <= limit:
        return text(value)
    cut = value.rfind(" ", 0, limit)
    return folded(text(value[: cut if cut > 40 else limit] + " ..."), tag("div", value, class_="detail"))


def figure(fig: Figure, caption: Content, alt: str) -> Html:
    return tag(
        "figure", join([Html(f'<img src="{data_uri(fig)}" alt="{html.escape(alt, quote=True)}">'), tag("figcaption", caption)])
    )


def code(value: str) -> Html:
    return tag("code", value)


@dataclass
class PageSection:
    """A titled part of a page with an anchor; `lede` is one line saying what it shows."""

    anchor: str
    title: str
    body: Content
    lede: Content = ""

    def render(self) -> Html:
        parts: list[Content] = [tag("h2", self.title)]
        if self.lede:
            parts.append(tag("p", self.lede, class_="lede"))
        parts.append(self.body)
        return tag("section", join(parts), id=self.anchor)


STYLE = """
:root { --fail: #b3261e; --fail-bg: #fdecea; --pass: #1b5e20; --pass-bg: #e8f5e9; --finding: #8a5a00;
        --finding-bg: #fff4e0; --muted: #5f6368; --line: #dadce0; --incomplete: #0b57d0; --incomplete-bg: #e8f0fe; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #202124; margin: 0;
       background: #f8f9fa; }
main { max-width: 1280px; margin: 0 auto; padding: 0 24px 48px; }
header.top { padding: 20px 24px 14px; border-bottom: 1px solid var(--line); background: #fff; }
header.top .inner { max-width: 1280px; margin: 0 auto; display: flex; gap: 20px; align-items: center; flex-wrap: wrap; }
header.top .inner > div:last-child { flex: 1; min-width: 0; }
.badge { font-weight: 700; font-size: 22px; letter-spacing: .04em; padding: 8px 18px; border-radius: 8px; }
.badge.failed, .badge.regressed { color: #fff; background: var(--fail); }
.badge.passed, .badge.no-regression { color: #fff; background: var(--pass); }
.badge.incomplete { color: #fff; background: var(--incomplete); }
.badge.bench, .badge.no-checks { color: #fff; background: #5f6368; }
h1 { font-size: 20px; margin: 0; font-weight: 600; }
h1 small { color: var(--muted); font-weight: 400; }
.sub { color: var(--muted); margin-top: 2px; }
.resume { margin: 6px 0 0; }
nav { max-width: 1280px; margin: 0 auto; padding: 8px 24px; font-size: 13px; }
nav a { color: var(--incomplete); text-decoration: none; margin-right: 14px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 18px 16px; margin: 16px 0; }
h2 { font-size: 17px; margin: 0 0 4px; }
h3 { font-size: 14px; margin: 16px 0 4px; }
p.lede { color: var(--muted); margin: 0 0 10px; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0 10px; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 10px 4px 0; text-align: left; vertical-align: top; }
th { font-weight: 600; color: var(--muted); border-bottom: 2px solid var(--line); white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.grid td, table.grid th { padding: 5px 8px; border: 1px solid var(--line); }
table.grid td.cell { text-align: center; min-width: 96px; }
table.grid td.cell b { display: block; font-size: 13px; }
table.grid td.cell span { color: var(--muted); font-size: 11px; }
td.fail { background: var(--fail-bg); color: var(--fail); }
td.pass-gating { background: var(--pass-bg); color: var(--pass); }
td.pass { color: var(--pass); }
td.finding, td.inconclusive { background: var(--finding-bg); color: var(--finding); }
td.none { color: #bbb; text-align: center; }
.v-fail { color: var(--fail); font-weight: 600; }
.v-pass-gating, .v-pass { color: var(--pass); }
.v-finding, .v-inconclusive { color: var(--finding); font-weight: 600; }
.mismatch { color: var(--fail); font-weight: 600; }
.parted { color: var(--finding); font-weight: 600; }
div.wide { overflow-x: auto; max-width: 100%; }
table.nowrap td { white-space: nowrap; }
table.nowrap td:last-child, table.nowrap td div.why { white-space: normal; min-width: 260px; }
table.invalid td div.why { color: #3c4043; max-width: 420px; }
footer code { word-break: break-all; white-space: normal; }
.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 4px 0 8px; }
.kv dt { color: var(--muted); }
.kv dd { margin: 0; }
.cols { display: grid; grid-template-columns: repeat(auto-fit, minmax(380px, 1fr)); gap: 8px 32px; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f1f3f4; padding: 1px 4px;
       border-radius: 3px; word-break: break-all; }
details > summary { cursor: pointer; color: #3c4043; }
div.detail { font: 12px ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap; color: #3c4043;
             background: #f8f9fa; padding: 6px 8px; margin: 4px 0; max-width: 900px; }
.cause { border-left: 4px solid var(--fail); padding: 2px 0 2px 12px; margin: 12px 0; }
.cause.finding { border-left-color: #f9ab00; }
figure { margin: 10px 0; }
div.figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 0 20px; }
table.invalid td { color: var(--muted); }
table.grid.partial td.cell {
  background-image: repeating-linear-gradient(135deg, transparent 0 6px, rgba(0,0,0,.04) 6px 12px); }
tbody th { border-bottom: 1px solid var(--line); color: #3c4043; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; background: #fff; }
figcaption { color: var(--muted); font-size: 12px; margin-top: 4px; max-width: 900px; }
ul.lines { margin: 4px 0; padding-left: 18px; }
footer { color: var(--muted); font-size: 12px; max-width: 1280px; margin: 0 auto; padding: 0 24px 24px; }
"""


def document(title: str, header: Content, sections: Sequence[PageSection], footer: Content) -> str:
    """The whole page. The navigation links are fragments of this page (`#anchor`), never files."""
    nav = join(tag("a", s.title.split(":")[0], href=f"#{s.anchor}") for s in sections)
    body = join(
        [
            tag("header", tag("div", header, class_="inner"), class_="top"),
            tag("nav", nav),
            tag("main", join(s.render() for s in sections)),
            tag("footer", footer),
        ]
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )
