"""The report of a Spark benchmark that runs each variant at several batch sizes beside one
peer (benchmarks/delta_spark.py, benchmarks/iceberg_spark.py): per size, a table of each
variant's median addBatch with its ratios against the peer and the floor (also as the median of
the per-round ratios) and where our batches' time went; and one chart of every variant's time
relative to the peer's, a series per size."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from benchmarks.spark_end_to_end import Run, median_batch_ms, report_phases


@dataclass(frozen=True)
class Peer:
    """The yardstick variant, how the variants are labelled, and the report's wording."""

    variant: str
    #: The peer's name in the tables and the chart ("delta-spark").
    label: str
    #: Every variant's label, by variant.
    labels: Mapping[str, str]
    #: What the chart is of ("Delta in a Spark job (local[2])").
    subject: str
    #: The caption above our variants' phases.
    phases: str


def per_round(done: dict[str, list[Run]], variant: str, yardstick: str) -> float:
    """The median over rounds of (variant's median addBatch / yardstick's) in that round."""
    return statistics.median(
        statistics.median(a.batch_ms) / statistics.median(b.batch_ms)
        for a, b in zip(done[variant], done[yardstick], strict=True)
    )


def report(size: int, done: dict[str, list[Run]], args: argparse.Namespace, peer: Peer) -> None:
    """The table of one batch size, then our variants' phases."""
    print(
        f"\n{size:,} rows per micro-batch, {args.batches} micro-batches, {args.rounds} rounds, "
        f"local[2], driver heap {args.driver_memory}; Spark's addBatch per micro-batch"
    )
    print(f"\n| variant | addBatch median | vs {peer.label} (its time / ours) | vs floor |")
    print("|---|---|---|---|")
    for variant, runs in done.items():
        ms = median_batch_ms(runs)
        cells = [peer.labels[variant], f"{ms:,.0f} ms"]
        if peer.variant in done:
            theirs = median_batch_ms(done[peer.variant])
            ratio = 1 / per_round(done, variant, peer.variant)
            cells.append(f"{theirs / ms:.2f}x ({ratio:.2f}x)")
        else:
            cells.append("")
        if "floor" in done:
            floor = median_batch_ms(done["floor"])
            cells.append(f"{ms / floor:.2f}x ({per_round(done, variant, 'floor'):.2f}x)")
        else:
            cells.append("")
        print("| " + " | ".join(cells) + " |")
    print("(in brackets: the median of the per-round ratios)")
    report_phases(
        {variant: runs for variant, runs in done.items() if runs}, peer.phases, peer.labels
    )


def chart(runs: dict[int, dict[str, list[Run]]], args: argparse.Namespace, peer: Peer) -> None:
    """Each variant's median addBatch relative to the peer's, one series per batch size; our
    variants (named `...-ours...`) highlighted."""
    from benchmarks.charts import RATIO, grouped_bar_chart

    sizes = list(runs)
    variants = list(runs[sizes[0]])
    series = [
        (
            f"{size:,} rows per batch",
            [
                median_batch_ms(runs[size][v]) / median_batch_ms(runs[size][peer.variant])
                for v in variants
            ],
        )
        for size in sizes
    ]
    written = grouped_bar_chart(
        args.chart,
        f"{peer.subject}: time per micro-batch / {peer.label}'s\n"
        f"median of Spark's addBatch, {args.batches} batches x {args.rounds} rounds per size "
        "(lower is better)",
        [peer.labels[v] for v in variants],
        series,
        f"time per micro-batch / {peer.label}'s",
        highlight=[peer.labels[v] for v in variants if "-ours" in v],
        references=[(peer.label, 1.0)],
        value_format=RATIO,
    )
    print(f"chart: {written}")
