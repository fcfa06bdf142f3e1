"""Where an executor-mode Iceberg task spends its time, with and without the task brief.

    .venv/bin/python -m benchmarks.iceberg_task_profile [--rows-per-batch 1000000] [--batches 6]

Needs the test bed's Postgres and Spark (the main lane's). The rows of benchmarks/
spark_end_to_end.py (two Parquet files, so two tasks on `local[2]`) go as epochs 0, 1, ... into
an Iceberg table on pyiceberg's SQL catalog in the test bed's Postgres (a local warehouse;
format version 2, zstd level 1, as benchmarks/iceberg_spark.py's), through an executor-mode
coordinator whose tasks time each sink call (benchmarks/executor_profile.py's `timed_prepare`:
open, begin_epoch, write_batch, pre_commit, close, and the waits for Spark's record batches).
Per batch, in an alternating order after one warm-up batch of each:
- with the brief: the tasks get the driver's task brief (no catalog opened in a task);
- without: the tasks open the catalog and load the table themselves;
- executor floor: a `mapInArrow` whose tasks only read their partition.
Printed: the medians over batches of each part (the tasks' parts: median over the tasks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.driver_profile import source_frame
from benchmarks.executor_profile import Parts, executor_floor, job_parts, timed_epoch
from durable_sinks.coordinator import Coordinator
from durable_sinks.core import SinkConnector
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from tests.services import up
from tests.support.iceberg_target import IcebergCatalog

TABLE_PROPERTIES = {
    "format-version": "2",
    "write.parquet.compression-codec": "zstd",
    "write.parquet.compression-level": "1",
}
VARIANTS = ("with the brief", "without", "executor floor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows-per-batch", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=6)
    args = parser.parse_args()
    testbed = up(["postgres", "spark"])
    spark = testbed.spark.session("iceberg-task-profile")
    work = Path(tempfile.mkdtemp(prefix="ds-iceberg-task-profile-"))
    df = source_frame(spark, work, args.rows_per_batch)
    catalog = IcebergCatalog(testbed.postgres.endpoint(), work)
    catalog.create_namespace()
    schema = df.limit(1).toArrow().schema
    catalog.catalog().create_table(catalog.identifier(), schema=schema, properties=TABLE_PROPERTIES)
    options = catalog.sink_options()

    def build() -> SinkConnector:
        return create("iceberg", options)

    job = Coordinator(
        f"task-profile-{uuid.uuid4().hex[:6]}",
        [build()],
        LocalDirectoryStore(work / "store"),
        executor_mode=True,
    )
    job.start()
    epochs = iter(range(1_000_000))

    def ours(briefed: bool) -> Parts:
        return timed_epoch(job, next(epochs), df, build, job.task_briefs if briefed else None)

    def floor() -> Parts:
        started = time.time()
        rows = df.mapInArrow(executor_floor, "times string").collect()
        return job_parts(started, time.time(), [json.loads(r[0]) for r in rows])

    runs: dict[str, Any] = {
        "with the brief": lambda: ours(True),
        "without": lambda: ours(False),
        "executor floor": floor,
    }
    found: dict[str, list[Parts]] = {name: [] for name in VARIANTS}
    try:
        for batch in range(args.batches + 1):
            order = VARIANTS if batch % 2 else VARIANTS[::-1]
            for name in order:
                parts = runs[name]()
                if batch > 0:
                    found[name].append(parts)
    finally:
        job.close()
        catalog.drop()
    print(f"{args.rows_per_batch:,} rows per batch, {args.batches} batches, medians (ms)")
    for name in VARIANTS:
        keys = sorted({k for parts in found[name] for k in parts})
        medians = {k: round(statistics.median(p.get(k, 0.0) for p in found[name])) for k in keys}
        print(f"{name}: {medians}")


if __name__ == "__main__":
    main()
