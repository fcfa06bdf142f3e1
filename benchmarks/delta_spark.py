"""Delta in a Spark job: our sink (driver and executor mode) vs delta-spark's streaming sink.

    .venv/bin/python -m benchmarks.delta_spark --sizes 100000,1000000 --batches 3 --rounds 3 \\
        --chart docs/img/delta_sink.png

One `local[2]` session (driver heap `--driver-memory`, 1g by default) with delta-spark's
extension and catalog, `spark.databricks.delta.snapshotPartitions=2` and Spark's Parquet
writer at zstd level 1, the codec and level ours writes (benchmarks/spark_end_to_end.py
DELTA_CONF). For each batch size in `--sizes`, the same rows (bigint, text, float8,
timestamp; benchmarks/spark_end_to_end.py) are streamed from Parquet files in `--batches`
micro-batches (`availableNow`) into a fresh table by each variant, alternating for
`--rounds` rounds (forward, backward, ...):
- delta-ours-eo: `foreachBatch(durable_sink("delta", path=..., create_table=True))`, driver
  mode (each batch streamed to the driver as Arrow, written by one coordinator; the decision
  store in the table's folder, the default);
- delta-ours-executor: the same with `execution="executor"` (each partition written and
  prepared in its task, the commit on the driver);
- delta-spark: `writeStream.format("delta").start(path)`, exactly-once by its checkpoint and
  the table's application transaction;
- floor: a foreachBatch that only streams the batch to the driver as Arrow (what driver mode
  reads with) and drops it.
Each variant first runs once on one micro-batch of the first size (class loading, JIT).
Every run is checked (benchmarks/spark_end_to_end.py `check_delta`): Spark's progress shows
every batch, delta-rs reads the table back with exactly the rows written and distinct ids,
ours has one commit per epoch (its application transaction), delta-spark one streaming
commit per batch, and every data file is zstd. Reported per size: the median of Spark's
`addBatch` per micro-batch, the ratios delta-spark / ours (higher is better) and ours /
floor, each also as the median of the per-round ratios, and where our batches' time goes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.peer_sizes import Peer, chart, report
from benchmarks.spark_end_to_end import (
    DELTA_CONF,
    VARIANTS,
    Bench,
    Run,
    write_source,
)
from tests.services import up

DELTA_VARIANTS = ("delta-ours-eo", "delta-ours-executor", "delta-spark", "floor")
PEER = "delta-spark"
DELTA_SPARK = Peer(
    PEER,
    "delta-spark",
    VARIANTS,
    "Delta in a Spark job (local[2])",
    "\nours per micro-batch, median (ms): addBatch; our foreachBatch call; in it, outside the "
    "coordinator's phases; the sink's writes (driver mode: with waiting for Spark's record "
    "batches; executor mode: the tasks); the protocol",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="100000,1000000", help="rows per micro-batch, a list")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=1.0, help="seconds of rest before a run")
    parser.add_argument("--timeout", type=float, default=600.0, help="per query, seconds")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--variants", default=",".join(DELTA_VARIANTS))
    parser.add_argument("--chart", type=Path, help="also draw the per-batch ratios into this PNG")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    if set(variants) - set(DELTA_VARIANTS):
        parser.error(f"variants are among {', '.join(DELTA_VARIANTS)}")
    if any(size % 2 for size in sizes):
        parser.error("every size must be even (two input files per micro-batch)")

    testbed = up(["postgres", "kafka", "spark"])
    work = Path(tempfile.mkdtemp(prefix="ds-delta-spark-bench-"))
    began = time.perf_counter()
    for size in sizes:
        write_source(work / f"in-{size}", size, args.batches)
    write_source(work / "warmup", sizes[0], 1)
    spark = testbed.spark.session(
        "bench-delta", **DELTA_CONF, **{"spark.driver.memory": args.driver_memory}
    )
    spark.sparkContext.setLogLevel("ERROR")
    bench = Bench(
        spark,
        testbed.postgres.endpoint(),
        testbed.kafka.endpoint(),
        f"bench_delta_{uuid.uuid4().hex[:8]}",
        work,
        args.timeout,
    )
    runs: dict[int, dict[str, list[Run]]] = {s: {v: [] for v in variants} for s in sizes}
    try:
        for variant in variants:
            bench.run(variant, work / "warmup", sizes[0], 1)
        for size in sizes:
            for round_ in range(args.rounds):
                order = variants if round_ % 2 == 0 else variants[::-1]
                for variant in order:
                    time.sleep(args.settle)
                    run = bench.run(variant, work / f"in-{size}", size * args.batches, args.batches)
                    runs[size][variant].append(run)
                    print(
                        f"{size:>9,} rows/batch, round {round_ + 1}: {variant:20s} "
                        f"{run.seconds:6.2f} s, addBatch {statistics.median(run.batch_ms):6.0f} ms",
                        flush=True,
                    )
    finally:
        bench.close()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    for size in sizes:
        report(size, runs[size], args, DELTA_SPARK)
    if args.chart is not None:
        chart(runs, args, DELTA_SPARK)
    print(f"whole script: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
