"""Iceberg in a Spark job: our sink vs Spark's own Iceberg streaming sink, in one session.

    .venv/bin/python -m benchmarks.iceberg_spark --sizes 100000,1000000 --batches 4 \\
        --rounds 3 --chart docs/img/iceberg_spark.png

Spark's Iceberg runtime (`iceberg-spark-runtime-4.1_2.13`) has no build for the main lane's
Spark 4.2, so the script runs in the pyspark 4.1 interpreter of tests/services/iceberg_spark.py:
started from any other, it builds the checkout's wheel, installs it there (dependencies
untouched) and runs itself in that interpreter.

One `local[2]` session (driver heap `--driver-memory`, 1g by default) with Spark's Iceberg
catalog on pyiceberg's SQL catalog in the test bed's Postgres (a schema of its own, a local
warehouse; Iceberg's JdbcCatalog and pyiceberg's SqlCatalog share it under one catalog name).
Every run writes into a fresh table created by Spark SQL with the same properties
(TABLE_PROPERTIES: Parquet, zstd level 1, 512 MiB target file size, format version 2). The
same rows (bigint, text, float8, timestamp; benchmarks/spark_end_to_end.py) are streamed from
Parquet files, for each size in `--sizes` that many rows per micro-batch, `--batches`
micro-batches (`availableNow`), by each variant, alternating for `--rounds` rounds (forward,
backward, ...):
- iceberg-ours: `foreachBatch(durable_sink("iceberg", ...))`, driver mode (each batch streamed
  to the driver as Arrow, written by pyiceberg's Parquet writer, one Iceberg commit per epoch;
  the decision store: a local folder);
- iceberg-ours-executor: the same in executor mode (`execution="executor"`: each task writes
  its partition's data files and hands the driver its handle; the driver decides and makes
  the epoch's one Iceberg commit);
- iceberg-spark: `writeStream.format("iceberg").toTable(...)` (Spark's Iceberg streaming
  sink: each task writes its partition's files, the driver commits one snapshot per batch,
  skipping epochs its snapshots already record);
- floor: a foreachBatch that only streams the batch to the driver as Arrow (what driver mode
  reads with) and drops it;
- iceberg-ours-whole-batch (diagnostic, on request): ours with driver mode handing the sink
  the whole batch as one group (the sink writes each group it is handed as data files of
  their own; by default a group is about 32,768 rows).
Each variant first runs once on one micro-batch of the first size (class loading, JIT).
Every run is checked: Spark's progress shows every batch and its rows; Spark's Iceberg reader
reads back exactly the rows written, distinct ids; one snapshot per batch (ours: each naming
its epoch, 0, 1, ...); every data file is zstd. Reported per size: the median of Spark's
`addBatch` per micro-batch, the ratios iceberg-spark / ours (higher is better) and ours /
floor, each also as the median of the per-round ratios, and where our batches' time goes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.peer_sizes import Peer, chart, report
from benchmarks.spark_end_to_end import (
    Bench,
    Run,
    write_source,
)
from durable_sinks.spark import _arrow

#: The Iceberg table properties both sinks write under.
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.format.default": "parquet",
    "write.parquet.compression-codec": "zstd",
    "write.parquet.compression-level": "1",
    "write.target-file-size-bytes": str(512 * 1024 * 1024),
}
ICEBERG_VARIANTS = {
    "iceberg-ours": "iceberg, ours exactly-once (driver mode)",
    "iceberg-ours-executor": "iceberg, ours exactly-once (executor mode)",
    "iceberg-ours-whole-batch": "iceberg, ours, the batch handed to the sink as one group",
    "iceberg-spark": "iceberg, Spark's Iceberg streaming sink",
    "floor": "floor: foreachBatch streaming the batch as Arrow only",
}
#: What runs unless `--variants` says otherwise (the rest are diagnostics).
DEFAULT_VARIANTS = ("iceberg-ours", "iceberg-ours-executor", "iceberg-spark", "floor")
PEER = "iceberg-spark"
ICEBERG_SPARK = Peer(
    PEER,
    "Spark's Iceberg sink",
    ICEBERG_VARIANTS,
    "Iceberg in a Spark job (local[2])",
    "\nours per micro-batch, median (ms): addBatch; our foreachBatch call; in it, outside the "
    "coordinator's phases; the sink's writes (driver mode: with waiting for Spark's record "
    "batches; executor mode: the tasks); the protocol (prepare, decision, the Iceberg commit)",
)
OURS = "iceberg-ours"
NAMESPACE = "bench"


def in_iceberg_interpreter() -> bool:
    import pyspark

    return pyspark.__version__.startswith("4.1.")


def relaunch(argv: list[str]) -> int:
    """Run this script again in the Iceberg interpreter, with the checkout's wheel installed."""
    from tests.services import up
    from tests.services._layout import REPO_ROOT
    from tests.services.compat import install_wheel
    from tests.support.venvs import build_wheel

    testbed = up(["iceberg-spark"])
    python = testbed.iceberg_spark.python()
    with tempfile.TemporaryDirectory(prefix="ds-iceberg-spark-wheel-") as scratch:
        wheel = build_wheel(Path(scratch) / "clone", Path(scratch) / "dist")
        install_wheel(python, wheel)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    print(f"running in {python} (pyspark 4.1, Spark's Iceberg runtime)", flush=True)
    command = [str(python), "-m", "benchmarks.iceberg_spark", *argv]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, check=False).returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="100000,1000000", help="rows per micro-batch, a list")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=1.0, help="seconds of rest before a run")
    parser.add_argument("--timeout", type=float, default=600.0, help="per query, seconds")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    parser.add_argument("--chart", type=Path, help="also draw the per-batch ratios into this PNG")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if set(variants) - set(ICEBERG_VARIANTS):
        parser.error(f"variants are among {', '.join(ICEBERG_VARIANTS)}")
    if args.chart is not None and PEER not in variants:
        parser.error(f"the chart is relative to {PEER}: include it in --variants")
    args.sizes = [int(size) for size in args.sizes.split(",") if size]
    if not args.sizes or any(size % 2 for size in args.sizes):
        parser.error("every size must be even (two input files per micro-batch)")
    if not in_iceberg_interpreter():
        sys.exit(relaunch(sys.argv[1:]))
    run(args, variants)


def run(args: argparse.Namespace, variants: list[str]) -> None:
    from tests.services import up

    testbed = up(["postgres", "kafka", "spark"])
    work = Path(tempfile.mkdtemp(prefix="ds-iceberg-spark-bench-"))
    began = time.perf_counter()
    sizes: list[int] = args.sizes
    for size in sizes:
        write_source(work / f"in-{size}", size, args.batches)
    write_source(work / "warmup", sizes[0], 1)
    bench = IcebergBench(testbed, work, args)
    runs: dict[int, dict[str, list[Run]]] = {size: {v: [] for v in variants} for size in sizes}
    try:
        for variant in variants:
            bench.run(variant, work / "warmup", sizes[0], 1)
        for size in sizes:
            for round_ in range(args.rounds):
                order = variants if round_ % 2 == 0 else variants[::-1]
                for variant in order:
                    time.sleep(args.settle)
                    done = bench.run(
                        variant, work / f"in-{size}", size * args.batches, args.batches
                    )
                    runs[size][variant].append(done)
                    ms = statistics.median(done.batch_ms)
                    print(
                        f"{size:>9,} rows/batch, round {round_ + 1}: {variant:14s} "
                        f"{done.seconds:6.2f} s, addBatch {ms:6.0f} ms",
                        flush=True,
                    )
    finally:
        bench.close()
        shutil.rmtree(work, ignore_errors=True)
    for size in sizes:
        report(size, runs[size], args, ICEBERG_SPARK)
        files = {v: bench.files.get((size, v)) for v in variants if v != "floor"}
        print(
            "data files per micro-batch, median over runs: "
            + ", ".join(f"{v} {statistics.median(n):.1f}" for v, n in files.items() if n)
        )
    if args.chart is not None:
        chart(runs, args, ICEBERG_SPARK)
    print(f"whole script: {time.perf_counter() - began:.0f} s")


class IcebergBench:
    """The session with Spark's Iceberg catalog, the SQL catalog it shares with pyiceberg, and
    one method per variant, each returning a checked Run."""

    def __init__(self, testbed: Any, work: Path, args: argparse.Namespace) -> None:
        from tests.support.iceberg_spark_reader import spark_catalog_settings
        from tests.support.iceberg_target import IcebergCatalog

        self.catalog = IcebergCatalog(testbed.postgres.endpoint(), work)
        self.catalog.namespace = NAMESPACE
        self.catalog.create_namespace()
        self.work = work
        settings = {
            "spark.sql.extensions": (
                "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
            ),
            "spark.driver.memory": args.driver_memory,
            **spark_catalog_settings(self.catalog.name, self.catalog.properties()),
            # Each check reads what pyiceberg committed, not the table Spark loaded when it
            # created it (Spark's catalog caches loaded tables by default).
            f"spark.sql.catalog.{self.catalog.name}.cache-enabled": "false",
        }
        self.spark = testbed.spark.session(
            "bench-iceberg", **testbed.iceberg_spark.session_conf(**settings)
        )
        #: Data files per micro-batch of each run, by (rows per micro-batch, variant).
        self.files: dict[tuple[int, str], list[float]] = {}
        self.spark.sparkContext.setLogLevel("ERROR")
        self.bench = Bench(
            self.spark,
            testbed.postgres.endpoint(),
            testbed.kafka.endpoint(),
            f"bench_iceberg_{uuid.uuid4().hex[:8]}",
            work,
            args.timeout,
        )

    def close(self) -> None:
        self.bench.close()
        self.spark.stop()
        self.catalog.drop()

    def run(self, variant: str, source: Path, rows: int, batches: int) -> Run:
        if variant == "floor":
            return self.bench.floor(source, rows, batches)
        table = f"t_{uuid.uuid4().hex[:12]}"
        name = f"{self.catalog.name}.{NAMESPACE}.{table}"
        properties = ", ".join(f"'{k}'='{v}'" for k, v in TABLE_PROPERTIES.items())
        self.spark.sql(
            f"CREATE TABLE {name} (id BIGINT, body STRING, score DOUBLE, at TIMESTAMP) "
            f"USING iceberg TBLPROPERTIES ({properties})"
        )
        if variant in (OURS, "iceberg-ours-executor", "iceberg-ours-whole-batch"):
            # The diagnostic whole-batch variant: driver mode hands the sink the whole batch
            # as one group (one write_batch) instead of groups of GROUP_ROWS rows.
            saved = _arrow.GROUP_ROWS, _arrow.GROUP_BYTES
            if variant == "iceberg-ours-whole-batch":
                _arrow.GROUP_ROWS, _arrow.GROUP_BYTES = 2**40, 2**40
            try:
                done = self.bench.ours(
                    source,
                    rows,
                    batches,
                    "iceberg",
                    decision_store=str(self.work / f"decisions-{table}"),
                    execution="executor" if variant == "iceberg-ours-executor" else "driver",
                    **self.catalog.sink_options(table),
                )
            finally:
                _arrow.GROUP_ROWS, _arrow.GROUP_BYTES = saved
        elif variant == PEER:
            checkpoint = self.work / f"checkpoint-{table}"
            done = self.bench.query(
                source,
                rows,
                batches,
                lambda w: (
                    w.format("iceberg")
                    .outputMode("append")
                    .option("checkpointLocation", str(checkpoint))
                    .toTable(name)
                ),
            )
        else:
            raise ValueError(variant)
        count = self.check(name, rows, batches, ours=variant != PEER)
        self.files.setdefault((rows // batches, variant), []).append(count / batches)
        self.spark.sql(f"DROP TABLE {name} PURGE")
        return done

    def check(self, name: str, rows: int, batches: int, *, ours: bool) -> int:
        """Spark's Iceberg reader: `rows` distinct ids, one snapshot per micro-batch (ours:
        each naming its epoch), every data file zstd. Returns the number of data files."""
        import pyarrow.parquet as pq

        counted = self.spark.sql(f"SELECT count(*) AS n, count(DISTINCT id) AS d FROM {name}")
        found = counted.collect()[0]
        if found.n != rows or found.d != rows:
            raise RuntimeError(f"{name}: {found.n} rows, {found.d} distinct; {rows} written")
        summaries = [
            dict(r.summary)
            for r in self.spark.sql(
                f"SELECT summary FROM {name}.snapshots ORDER BY committed_at"
            ).collect()
        ]
        if len(summaries) != batches:
            raise RuntimeError(f"{name}: {len(summaries)} snapshots, {batches} batches")
        if ours:
            epochs = [s.get("durable-sinks.epoch") for s in summaries]
            if epochs != [str(n) for n in range(batches)]:
                raise RuntimeError(f"{name}: snapshots by epoch {epochs}")
        listed = self.spark.sql(f"SELECT file_path FROM {name}.files").collect()
        files = [str(r.file_path) for r in listed]
        codecs = {
            pq.ParquetFile(f.removeprefix("file:").removeprefix("//"))
            .metadata.row_group(0)
            .column(0)
            .compression
            for f in files
        }
        if codecs != {"ZSTD"}:
            raise RuntimeError(f"{name}: data files compressed with {codecs}, not ZSTD alone")
        return len(files)


if __name__ == "__main__":
    main()
