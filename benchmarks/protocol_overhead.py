"""Per-epoch cost of the exactly-once protocol itself, with a sink that does no I/O.

    .venv/bin/python -m benchmarks.protocol_overhead [--epochs 1000] [--history 10000] [--dir D]
        [--chart PNG]

A no-op sink and the local-directory decision store (fsync on) isolate what the coordinator
and the store add to every epoch: pre_commit + decision persist + commit ("protocol"), and the
whole epoch including lookup, begin and finish ("epoch"). Measured over `--epochs` epochs on a
fresh store and on one with `--history` epochs of history, interleaved epoch by epoch with the
baseline: the cheapest durable step there is, one create-only file written and fsynced with
its folder.
Goals: protocol p50 <= 5 ms, p99 <= 20 ms, history adding < 10 %.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa

from durable_sinks.coordinator import Coordinator
from durable_sinks.core import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.durable_fs import create_exclusive
from durable_sinks.manifest import LocalDirectoryStore


class NullSink:
    """Accepts everything, stores nothing: a two-phase sink whose phases cost nothing."""

    name = "null"

    def __init__(self) -> None:
        self._context: OpenContext | None = None
        self._attempt = 0

    def open(self, context: OpenContext) -> None:
        self._context = context

    def begin_epoch(self, epoch: int) -> None:
        self._attempt += 1

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        return WriteResult(batch.num_rows, batch.nbytes)

    def pre_commit(self, epoch: int) -> CommitHandle:
        assert self._context is not None
        name = self._context.participant(epoch, self._attempt)
        return CommitHandle(self.name, epoch, str(name), 0, 0, "")

    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        return CommitOutcome.COMMITTED

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        return None

    def recover_prepared(self) -> list[CommitHandle]:
        return []

    def last_committed_epoch(self) -> int | None:
        return None

    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(exactly_once=True, two_phase_commit=True, resumable_prepare=True)

    def schema(self) -> pa.Schema | None:
        return None

    def health_check(self) -> None:
        return None

    def metrics(self) -> Mapping[str, float]:
        return {}

    def close(self) -> None:
        return None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Timed:
    """One coordinator with its own store, and the timings of the epochs it ran."""

    def __init__(self, root: Path, job: str) -> None:
        self.coordinator = Coordinator(job, [NullSink()], LocalDirectoryStore(root / job))
        self.coordinator.start()
        self.next_epoch = 0
        self.protocol: list[float] = []
        self.whole: list[float] = []
        self._batch = pa.record_batch({"x": [1]})

    def run(self, record: bool = True) -> None:
        started = time.perf_counter()
        result = self.coordinator.run_epoch(self.next_epoch, [self._batch])
        if record:
            self.whole.append(time.perf_counter() - started)
            self.protocol.append(result.metrics.protocol_seconds)
        self.next_epoch += 1


def ms(value: float) -> str:
    return f"{value * 1e3:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--history", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None, help="where the stores live")
    parser.add_argument("--chart", type=Path, help="also draw the p50/p99 table into this PNG")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ds-bench-", dir=args.dir))

    aged = Timed(root, "aged")
    started = time.perf_counter()
    for _ in range(args.history):
        aged.run(record=False)
    filling = time.perf_counter() - started
    fresh = Timed(root, "fresh")
    for _ in range(300):  # warm-up: imports, caches, first allocations
        fresh.run(record=False)
    fresh = Timed(root, "fresh-measured")

    # Interleaved, so drift in the machine's fsync latency hits all three alike.
    (root / "baseline").mkdir()
    fsync_once: list[float] = []
    for i in range(args.epochs):
        started = time.perf_counter()
        create_exclusive(root / "baseline" / str(i), b"x" * 600)
        fsync_once.append(time.perf_counter() - started)
        fresh.run()
        aged.run()

    print(f"stores in {root}; {args.epochs} epochs measured on each, interleaved")
    print(
        f"baseline: one create-only fsynced file: p50 {ms(percentile(fsync_once, 0.5))}, "
        f"p99 {ms(percentile(fsync_once, 0.99))}"
    )
    print(f"{'':<24} {'protocol p50':>13} {'protocol p99':>13} {'epoch p50':>10} {'epoch p99':>10}")
    for label, timed in (("fresh store", fresh), (f"after {args.history} epochs", aged)):
        print(
            f"{label:<24} {ms(percentile(timed.protocol, 0.5)):>13} "
            f"{ms(percentile(timed.protocol, 0.99)):>13} {ms(percentile(timed.whole, 0.5)):>10} "
            f"{ms(percentile(timed.whole, 0.99)):>10}"
        )
    growth = statistics.median(aged.protocol) / statistics.median(fresh.protocol) - 1
    ratio = statistics.median(fresh.protocol) / statistics.median(fsync_once)
    print(f"history cost (protocol p50): {growth * 100:+.1f} %")
    print(f"protocol p50 / baseline p50: {ratio:.2f}x")
    print(f"(filling {args.history} epochs of history took {filling:.1f} s)")
    if args.chart is not None:
        chart(args, fresh, aged, fsync_once, ratio)


def chart(
    args: argparse.Namespace, fresh: Timed, aged: Timed, baseline: list[float], ratio: float
) -> None:
    """The p50/p99 table as grouped bars: the fresh store, the aged one, the baseline."""
    from benchmarks.charts import grouped_bar_chart

    def row(timed: Timed) -> list[float | None]:
        return [
            percentile(values, q) * 1e3
            for values in (timed.protocol, timed.whole)
            for q in (0.5, 0.99)
        ]

    written = grouped_bar_chart(
        args.chart,
        f"Exactly-once protocol per epoch, no-op sink, local-directory store with fsync\n"
        f"{args.epochs:,} epochs each, interleaved; protocol p50 = {ratio:.2f}x the baseline's",
        ["protocol p50", "protocol p99", "epoch p50", "epoch p99"],
        [
            ("fresh store", row(fresh)),
            (f"after {args.history:,} epochs", row(aged)),
            (
                "baseline: one fsynced create",
                [percentile(baseline, 0.5) * 1e3, percentile(baseline, 0.99) * 1e3, None, None],
            ),
        ],
        "ms (lower is better)",
        value_format="{:.2f}",
    )
    print(f"chart: {written}")


if __name__ == "__main__":
    main()
