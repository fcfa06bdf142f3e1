"""PNG charts of benchmark results (matplotlib, drawn off-screen), for docs/benchmarks.md."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt  # after choosing the backend


def bar_chart(
    path: Path,
    title: str,
    bars: Sequence[tuple[str, float]],
    unit: str,
    *,
    highlight: Sequence[str] = (),
    reference: tuple[str, float] | None = None,
) -> Path:
    """One horizontal bar per (label, value), in the given order, its value written at its
    end; labels in `highlight` drawn in the accent colour; `reference` a labelled vertical
    line (e.g. a floor or a goal). Writes `path` (folders created) and returns it."""
    labels = [label for label, _ in bars]
    values = [value for _, value in bars]
    height = 0.9 + 0.42 * len(bars)
    figure, axes = plt.subplots(figsize=(9.5, height), dpi=110)
    colours = ["#d9822b" if label in highlight else "#4c72b0" for label in labels]
    positions = range(len(bars))
    axes.barh(list(positions), values, color=colours)
    axes.set_yticks(list(positions), labels, fontsize=8.5)
    axes.invert_yaxis()  # first bar on top
    axes.set_xlabel(unit)
    axes.set_title(title, fontsize=10)
    for position, value in zip(positions, values, strict=True):
        axes.text(value, position, f" {value:,.0f}", va="center", fontsize=8)
    if reference is not None:
        name, value = reference
        axes.axvline(value, color="#555555", linestyle="--", linewidth=1)
        axes.text(value, -0.6, f" {name}", fontsize=8, color="#555555", va="bottom")
    axes.set_xlim(0, max(values) * 1.15)
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path
