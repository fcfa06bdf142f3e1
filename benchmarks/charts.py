"""PNG charts of benchmark results (matplotlib, drawn off-screen), for docs/benchmarks.md.

One drawing function, `grouped_bar_chart`; `bar_chart` is its one-series case. Times and
ratios alike: `value_format` says how a bar's value is written ("{:.2f}x" for a ratio) and
`references` draws labelled vertical lines (a floor, a baseline at 1x, a goal).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt  # after choosing the backend

#: A labelled vertical line: (label, value).
Reference = tuple[str, float]
#: One series of a grouped chart: (its name in the legend, one value per label; None: no bar).
Series = tuple[str, Sequence[float | None]]

ACCENT = "#d9822b"
PALETTE = ("#4c72b0", ACCENT, "#55a868", "#8172b2", "#937860", "#c44e52")
RATIO = "{:.2f}x"  # value_format of a ratio chart
TITLE_WIDTH = 100  # characters per title line (longer lines are wrapped)
LABEL_WIDTH = 55  # characters per line of a bar's label


def bar_chart(
    path: Path,
    title: str,
    bars: Sequence[tuple[str, float]],
    unit: str,
    *,
    highlight: Sequence[str] = (),
    references: Sequence[Reference] = (),
    value_format: str = "{:,.0f}",
) -> Path:
    """One horizontal bar per (label, value), in the given order, its value written at its
    end; labels in `highlight` drawn in the accent colour; `references` labelled vertical
    lines (e.g. a floor or a goal). Writes `path` (folders created) and returns it."""
    return grouped_bar_chart(
        path,
        title,
        [label for label, _ in bars],
        [("", [value for _, value in bars])],
        unit,
        highlight=highlight,
        references=references,
        value_format=value_format,
    )


def grouped_bar_chart(
    path: Path,
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    unit: str,
    *,
    highlight: Sequence[str] = (),
    references: Sequence[Reference] = (),
    value_format: str = "{:,.0f}",
) -> Path:
    """Per label (top to bottom) one horizontal bar per series, each value written at its
    bar's end, a legend when there is more than one series. `highlight`: with one series,
    those labels' bars in the accent colour; with several, those labels in bold. Writes
    `path` (folders created) and returns it."""
    if not labels or not series:
        raise ValueError("a chart needs at least one label and one series")
    for name, values in series:
        if len(values) != len(labels):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(labels)} labels")
    count = len(series)
    thickness = 0.8 / count
    legend = 0.3 if count > 1 else 0.0  # inches under the axes for the legend
    lines = sum(len(textwrap.wrap(line, TITLE_WIDTH)) or 1 for line in title.split("\n"))
    height = 0.75 + 0.17 * lines + legend + len(labels) * (0.22 + 0.2 * count)
    figure, axes = plt.subplots(figsize=(9.5, height), dpi=110)
    drawn: list[float] = []
    for index, (name, values) in enumerate(series):
        offset = (index - (count - 1) / 2) * thickness
        at = [(row, value) for row, value in enumerate(values) if value is not None]
        if count == 1:
            colours = [ACCENT if labels[row] in highlight else PALETTE[0] for row, _ in at]
        else:
            colours = [PALETTE[index % len(PALETTE)]] * len(at)
        ys = [row + offset for row, _ in at]
        widths = [value for _, value in at]
        axes.barh(ys, widths, height=thickness * 0.92, color=colours, label=name)
        for y, value in zip(ys, widths, strict=True):
            axes.text(value, y, " " + value_format.format(value), va="center", fontsize=7.5)
        drawn += widths
    shown = [textwrap.fill(label, LABEL_WIDTH) for label in labels]
    axes.set_yticks(list(range(len(labels))), shown, fontsize=8.5)
    if count > 1:
        for label, tick in zip(labels, axes.get_yticklabels(), strict=True):
            if label in highlight:
                tick.set_fontweight("bold")
        figure.legend(fontsize=8, loc="lower center", ncol=count, frameon=False)
    # First label on top; room above (and below) the bars for the reference lines' labels.
    above = 0.6 if references else 0.0
    below = 0.6 if len(references) > 1 else 0.0
    axes.set_ylim(len(labels) - 0.5 + below, -0.5 - above)
    axes.set_xlabel(unit)
    wrapped = "\n".join(textwrap.fill(line, TITLE_WIDTH) for line in title.split("\n"))
    axes.set_title(wrapped, fontsize=10)
    for number, (name, value) in enumerate(references):
        axes.axvline(value, color="#555555", linestyle="--", linewidth=1)
        # Alternate the labels above the first and below the last row, so near lines stay legible.
        y, align = (-0.55, "bottom") if number % 2 == 0 else (len(labels) - 0.45, "top")
        axes.text(value, y, f" {name}", fontsize=8, color="#555555", va=align)
    axes.set_xlim(0, max(drawn + [value for _, value in references]) * 1.18)
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout(rect=(0, legend / height, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path
