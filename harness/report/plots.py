"""The sign-off page's figures, drawn with matplotlib on a bare Agg figure (no pyplot state, no
display) and handed back as SVG data URIs, so the page holds them and needs no file beside it.

Every figure takes rows as dicts (read from the views) and draws what they hold; a figure with
nothing to draw is never made: the caller leaves it out and says why in one line. Each card keeps
one colour on every figure of a page (`CardColours`).
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# The CPU reference in black; cards in the tab10 colours, in the order the run lists them.
REFERENCE_COLOUR = "#222222"
LIMIT_COLOUR = "#c62828"
STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.hashsalt": "harness",  # the same rows give the same bytes
}


@dataclass(frozen=True)
class CardColours:
    """One colour per device label, the same on every figure of a page."""

    order: tuple[str, ...]

    def __call__(self, label: str) -> str:
        if label in self.order:
            return f"C{self.order.index(label) % 10}"
        return REFERENCE_COLOUR  # the CPU reference (cpu, cpu-float64), or a device the run did not list


def figure(width: float, height: float, ncols: int = 1, nrows: int = 1) -> tuple[Figure, list[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def data_uri(fig: Figure) -> str:
    """The figure as an SVG data URI: crisp at any zoom, and text stays text."""
    import matplotlib

    buffer = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: smaller, and searchable
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _style() -> Any:
    import matplotlib

    return matplotlib.rc_context(STYLE)  # type: ignore[arg-type]  # STYLE's keys are rcParams names


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _power(value: float, base: float) -> str:
    """A tick of a log axis as plain text (10⁻³, 2¹⁶): mathtext labels cost a parser run each."""
    if value <= 0:
        return ""
    exponent = round(math.log(value, base))
    if abs(base**exponent - value) > 1e-9 * value:
        return f"{value:g}"
    if base == 10 and 0 <= exponent <= 3:
        return f"{value:g}"
    return f"{base:g}" + str(exponent).translate(_SUPERSCRIPT)


def _log_axis(ax: Axes, which: str, base: float = 10) -> None:
    """A log scale with its decades labelled and no minor ticks: minor tick labels cost most of a
    figure's drawing time and say nothing here."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(LogLocator(base=base, numticks=8))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda value, _: _power(value, base)))


def _grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return cols, math.ceil(n / cols)


def _floor_of(values: Iterable[float]) -> float:
    """Where exact zeros are drawn on a log axis: a decade under the smallest positive value."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return (min(positive) if positive else 1.0) / 10


# ---- the port rule -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RatioPoint:
    """One port-rule check: its card, where it sits (policy and dtype), and measured over limit."""

    output: str
    where: str  # "cartpole float32"
    card: str
    over_limit: float
    passed: bool


def port_rule(points: Sequence[RatioPoint], colours: CardColours, failing: set[str]) -> Figure:
    """Per output, each check's error over its limit (1 is the limit, log scale) per card, every
    card in its own column beside the others; cards that failed the rule stand apart on the right,
    past a gap, so a failing card is never read as part of the healthy ones' spread."""
    outputs = list(dict.fromkeys(p.output for p in points))
    cols, rows = _grid_shape(len(outputs), 2)
    with _style():
        fig, axes = figure(4.6 * cols, 3.3 * rows, cols, rows)
        floor = _floor_of(p.over_limit for p in points)
        for ax, output in zip(axes, outputs, strict=False):
            mine = [p for p in points if p.output == output]
            wheres = list(dict.fromkeys(p.where for p in mine))
            cards = sorted(dict.fromkeys(p.card for p in mine), key=lambda c: (c in failing, colours.order.index(c)))
            offsets = _offsets(cards, failing)
            for card in cards:
                xs, ys, passed = [], [], []
                for p in (p for p in mine if p.card == card):
                    xs.append(wheres.index(p.where) + offsets[card])
                    ys.append(max(p.over_limit, floor))
                    passed.append(p.passed)
                ok = np.array(passed)
                x, y = np.array(xs), np.array(ys)
                label = f"{card} (FAILED)" if card in failing else card
                ax.plot(x[ok], y[ok], "o", ms=4, alpha=0.75, color=colours(card), label=label)
                ax.plot(x[~ok], y[~ok], "X", ms=7, color=colours(card))
            ax.axhline(1.0, color=LIMIT_COLOUR, linestyle="--", linewidth=1)
            _log_axis(ax, "y")
            ax.set_xticks(range(len(wheres)), wheres, rotation=20, ha="right")
            ax.set_xlim(-0.6, len(wheres) - 0.4)
            ax.set_title(output)
            ax.set_ylabel("error / limit")
            ax.grid(True, axis="y", which="major", alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
        for ax in axes[len(outputs) :]:
            ax.set_visible(False)
    return fig


def _offsets(cards: list[str], failing: set[str]) -> dict[str, float]:
    """Each card's column within a category: healthy ones side by side, the failing ones after a gap."""
    slots = (
        [c for c in cards if c not in failing]
        + ["|"] * bool(failing and len(failing) < len(cards))
        + [c for c in cards if c in failing]
    )
    width = 0.8 / max(len(slots), 1)
    return {c: (i - (len(slots) - 1) / 2) * width for i, c in enumerate(slots) if c != "|"}


# ---- histograms of the rows' worst elements ---------------------------------------------------------


def has_inexact(by_card: dict[str, list[Any]]) -> bool:
    return any(v > 0 and math.isfinite(v) for vs in by_card.values() for v in vs)


def worst_element_histograms(ulps: dict[str, list[int]], abs_errors: dict[str, list[float]], colours: CardColours) -> Figure:
    """Left: each bit-for-bit check's largest ULP distance, per card; right: each port-rule check's
    largest absolute error against the golden, per card. Exact checks are counted in the title
    (a log axis has no zero); a panel with no inexact check is left out (`has_inexact`)."""
    every: list[tuple[dict[str, list[Any]], str, str, float]] = [
        ({k: list(v) for k, v in ulps.items()}, "cross_card: max ULP distance per check", "ULP (log2 bins)", 2.0),
        (
            {k: list(v) for k, v in abs_errors.items()},
            "cpu_reference: max |card - golden| per check",
            "absolute error (log bins)",
            10.0,
        ),
    ]
    panels = [p for p in every if has_inexact(p[0])]
    with _style():
        fig, axes = figure(4.8 * len(panels), 3.2, len(panels))
        for ax, (by_card, title, xlabel, base) in zip(axes, panels, strict=True):
            values = [v for vs in by_card.values() for v in vs]
            positive = [v for v in values if v > 0 and math.isfinite(v)]
            exact = sum(1 for v in values if v == 0)
            if positive:  # always, for a panel drawn
                lo, hi = math.floor(math.log(min(positive), base)), math.ceil(math.log(max(positive), base)) + 1
                bins = np.power(base, np.arange(lo, max(hi, lo + 1) + 1, dtype=float))
                cards = [c for c in by_card if any(v > 0 for v in by_card[c])]
                ax.hist(
                    [[v for v in by_card[c] if v > 0 and math.isfinite(v)] for c in cards],
                    bins=bins,
                    stacked=True,
                    color=[colours(c) for c in cards],
                    label=cards,
                )
                _log_axis(ax, "x", base)
                ax.legend(fontsize=7)
            ax.set_title(f"{title}\n{exact} of {len(values)} exact (not drawn)", fontsize=9)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("checks")
    return fig


# ---- episodes -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodePoint:
    panel: str  # "cartpole float32"
    mode: str  # deterministic, stochastic
    device: str
    seed: int
    episode_return: float
    parted_at: int | None  # the step its trajectory parted from the CPU's; None when identical


MODE_MARKERS = ("o", "s", "^", "D")


def episode_returns(points: Sequence[EpisodePoint], devices: Sequence[str], colours: CardColours) -> Figure:
    """Per policy and dtype: each seed's return on each device (the CPU reference first), one
    column per mode beside each other; a hollow marker where the trajectory parted from the CPU's."""
    panels = list(dict.fromkeys(p.panel for p in points))
    modes = list(dict.fromkeys(p.mode for p in points))
    cols, rows = _grid_shape(len(panels), 4)
    with _style():
        fig, axes = figure(3.3 * cols, 2.7 * rows, cols, rows)
        for ax, panel in zip(axes, panels, strict=False):
            mine = [p for p in points if p.panel == panel]
            shown = [d for d in devices if any(p.device == d for p in mine)]
            for device in shown:
                for m, mode in enumerate(modes):
                    on = [p for p in mine if p.device == device and p.mode == mode]
                    if not on:
                        continue
                    centre = shown.index(device) + (m - (len(modes) - 1) / 2) * 0.8 / len(modes)
                    x = centre + np.linspace(-0.08, 0.08, len(on)) if len(on) > 1 else np.array([centre])
                    y = np.array([p.episode_return for p in on])
                    parted = np.array([p.parted_at is not None for p in on])
                    marker = MODE_MARKERS[m % len(MODE_MARKERS)]
                    colour = colours(device)
                    ax.plot(x[~parted], y[~parted], marker, ms=4, color=colour, alpha=0.8, linestyle="none")
                    ax.plot(x[parted], y[parted], marker, ms=6, markerfacecolor="none", color=colour, linestyle="none")
                    ax.hlines(float(np.mean(y)), centre - 0.15, centre + 0.15, color=colour)
            ax.set_xticks(range(len(shown)), shown, rotation=20, ha="right")
            ax.set_title(panel)
            ax.set_ylabel("return")
            ax.grid(True, axis="y", alpha=0.3)
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
        for m, mode in enumerate(modes):
            axes[0].plot([], [], MODE_MARKERS[m % len(MODE_MARKERS)], color="k", ms=4, label=mode)
        axes[0].plot([], [], "o", color="k", ms=6, markerfacecolor="none", label="parted from the CPU's")
        axes[0].legend(fontsize=7)
    return fig


# ---- bench ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPoint:
    series: str  # "cartpole float32 batch 64 (device)"
    x: float
    y: float
    low: float | None
    high: float | None
    valid: bool


def bench_plot(
    points: Sequence[BenchPoint],
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    log_x: bool = False,
    log_y: bool = False,
    limit: float | None = None,
) -> Figure:
    """One series per key: valid points filled and joined, their 95% intervals drawn; invalid
    points hollow and never joined (an invalid figure is not a result). `log_y` where the
    figures span more than a decade (a batch of 1 beside a batch of 4096)."""
    with _style():
        fig, [ax] = figure(5.6, 3.6)
        series = list(dict.fromkeys(p.series for p in points))
        for i, key in enumerate(series):
            mine = sorted((p for p in points if p.series == key), key=lambda p: p.x)
            colour = f"C{i % 10}"
            shift = (i - (len(series) - 1) / 2) * (0.0 if log_x else 0.03)
            x = np.array([p.x + shift for p in mine])
            y = np.array([p.y for p in mine])
            valid = np.array([p.valid for p in mine])
            ax.plot(x, np.where(valid, y, np.nan), "-", color=colour, label=key)
            for p, xi in zip(mine, x, strict=True):
                if p.low is not None and p.high is not None:
                    ax.errorbar(
                        [xi],
                        [p.y],
                        yerr=[[p.y - p.low], [p.high - p.y]],
                        fmt="none",
                        ecolor=colour,
                        capsize=3,
                        alpha=0.8 if p.valid else 0.35,
                    )
            ax.plot(x[valid], y[valid], "o", color=colour, ms=5)
            ax.plot(x[~valid], y[~valid], "o", ms=7, markerfacecolor="white", markeredgecolor=colour, markeredgewidth=1.5)
        ax.plot([], [], "o", ms=7, markerfacecolor="white", markeredgecolor="grey", label="invalid: not a result")
        if limit is not None:
            ax.axhline(limit, color=LIMIT_COLOUR, linestyle="--", linewidth=1, label="the limit")
        if log_x:
            _log_axis(ax, "x", 2)
            xs = sorted({p.x for p in points})
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
        else:
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        positive = [p.y for p in points if p.y > 0]
        if log_y and positive and max(positive) > 10 * min(positive):
            _log_axis(ax, "y")
        else:
            if positive and max(positive) >= 1e4:
                from matplotlib.ticker import EngFormatter

                ax.yaxis.set_major_formatter(EngFormatter(sep=""))  # 1.5M, not 1.5 under a 1e6 offset
            ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return fig
