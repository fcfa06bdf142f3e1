"""Driver mode's reads on every tested pyspark: the socket read (the probed fast path) against
the public partitions read (its fallback, and Spark Connect's read), side by side in one Spark
session per version, with `toArrow()` (a whole batch gathered at once, pyspark 4 only) as the
peer a user would write instead and a count of the same DataFrame as the floor (Spark computes
the batch; nothing reaches the driver).

    .venv/bin/python -m benchmarks.driver_reads [--rows N] [--rounds 3] [--lanes main,oldest,newest]

Each version runs in its own interpreter: the main lane's (.venv, pyspark 4.2) and the
compatibility lanes' virtualenvs (tests/services/compat.py: Python 3.10 + pyspark 3.5.0,
Python 3.13 + pyspark 4.3.0), the checkout's wheel installed into them first. The batch is
`range(rows)` with a string, a double and a timestamp column in 2 partitions, computed again
by every read (as a micro-batch is); each read's median over the rounds, in rows per second,
and its time against the socket read's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

READS = ("floor: count()", "socket read", "partitions read", "toArrow()")


def _measure(rows: int, rounds: int) -> dict[str, Any]:
    """In this interpreter: each read's median seconds over `rounds`."""
    import pyspark

    from durable_sinks.spark._arrow import partition_batches, socket_batches, socket_read_problem
    from tests.services import Testbed

    spark = Testbed.create().spark.session("durable-sinks-bench-driver-reads")
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(0, rows, 1, 2).selectExpr(
        "id",
        "concat('order-', cast(id AS string)) AS name",
        "id * 0.25 AS amount",
        "timestamp_seconds(1700000000 + id) AS at",
    )

    def count(reader: Iterator[Any]) -> int:
        return sum(batch.num_rows for batch in reader)

    reads: dict[str, Callable[[], int]] = {
        "floor: count()": df.count,
        "socket read": lambda: count(socket_batches(df, job="bench")),
        "partitions read": lambda: count(partition_batches(df)),
    }
    if hasattr(df, "toArrow"):
        reads["toArrow()"] = lambda: int(df.toArrow().num_rows)
    problem = socket_read_problem(spark)
    seconds: dict[str, list[float]] = {name: [] for name in reads}
    for name, read in reads.items():
        assert read() == rows, name  # warm-up: Python workers started, code compiled
    for _ in range(rounds):
        for name, read in reads.items():
            started = time.perf_counter()
            got = read()
            seconds[name].append(time.perf_counter() - started)
            assert got == rows, (name, got)
    spark.stop()
    return {
        "python": sys.version.split()[0],
        "pyspark": pyspark.__version__,
        "socket_problem": problem,
        "median_s": {name: statistics.median(values) for name, values in seconds.items()},
    }


def _interpreters(lanes: list[str]) -> list[tuple[str, Path]]:
    """Each lane's interpreter: the main lane's is this one; the compatibility lanes' get the
    checkout's wheel installed first."""
    from tests.services import Testbed, up
    from tests.services.compat import install_wheel, lane
    from tests.support.venvs import build_wheel

    others = [name for name in lanes if name != "main"]
    pythons = {"main": Path(sys.executable)}
    if others:
        testbed = Testbed.create()
        up(["compat"], testbed)
        with tempfile.TemporaryDirectory(prefix="ds-bench-") as scratch:
            wheel = build_wheel(Path(scratch) / "clone", Path(scratch) / "dist")
            for name in others:
                pythons[name] = testbed.compat.python(lane(name))
                install_wheel(pythons[name], wheel)
    return [(name, pythons[name]) for name in lanes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.driver_reads")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lanes", default="main,oldest,newest")
    parser.add_argument("--chart", type=Path, default=None)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(_measure(args.rows, args.rounds)), flush=True)
        return 0
    results = []
    for name, python in _interpreters(args.lanes.split(",")):
        done = subprocess.run(
            [
                str(python),
                "-m",
                "benchmarks.driver_reads",
                "--measure",
                "--rows",
                str(args.rows),
                "--rounds",
                str(args.rounds),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            print(f"{name}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        results.append((name, json.loads(lines[-1])))
    print(
        f"driver-mode reads of {args.rows:,} rows (median of {args.rounds}), rows/s and time "
        "against the socket read:"
    )
    print(f"{'lane':<8} {'Python':<8} {'pyspark':<8} " + " ".join(f"{r:>24}" for r in READS))
    for name, result in results:
        median = result["median_s"]
        socket = median["socket read"]
        cells = [
            f"{args.rows / median[r]:>12,.0f} ({median[r] / socket:4.2f}x)"
            if r in median
            else f"{'-':>24}"
            for r in READS
        ]
        print(f"{name:<8} {result['python']:<8} {result['pyspark']:<8} " + " ".join(cells))
        if result["socket_problem"]:
            print(f"         (the probe refused the socket read: {result['socket_problem']})")
    if args.chart is not None:
        from benchmarks.charts import grouped_bar_chart

        groups = [f"{n}: pyspark {r['pyspark']}" for n, r in results]
        series = [
            (read, [args.rows / r["median_s"].get(read, float("inf")) for _, r in results])
            for read in READS
        ]
        grouped_bar_chart(
            args.chart, f"Driver-mode reads, {args.rows:,} rows", groups, series, "rows/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
