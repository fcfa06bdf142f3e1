"""Whole Spark streaming queries: our sinks vs what a Spark user would write instead.

    .venv/bin/python -m benchmarks.spark_end_to_end [--rows-per-batch 100000] [--batches 10]

Needs the test bed's Postgres, Kafka and Spark (`python -m tests.services up postgres kafka
spark`). The rows (bigint, text, float8, timestamp) are written once as Parquet files, two per
micro-batch (one input split per core); every run is a streaming query over those files with
`maxFilesPerTrigger=2` and `trigger(availableNow=True)`, in one `local[2]` session, into a
fresh table or topic with a fresh job id and checkpoint. Timed: from building the sink's
function (our writers validate and start their coordinator there) through `start()` to
`awaitTermination()` returning, nothing subtracted; per micro-batch, Spark's own `addBatch`
duration from the query's progress reports.

Variants:
- postgres, ours: `foreachBatch(durable_sink("postgres", ..., create_table=True))`, exactly-once
  (default) and at-least-once; exactly-once with `driver_read="chunked"`; exactly-once in
  executor mode; decision store: the default (the sink's database).
- postgres, JDBC: `foreachBatch(lambda df, _: df.write.jdbc(url, table, "append", ...))` with
  the Postgres JDBC driver, `batchsize=10000`, with and without `reWriteBatchedInserts=true`
  on the URL (the table created by Spark on the first batch, as `append` does); the ratio is
  taken against the faster of the two.
- kafka, ours: `foreachBatch(durable_sink("kafka", ..., decision_store=<temp dir>))`, the value
  a JSON object of the columns (the default), exactly-once and at-least-once; exactly-once
  with `epoch_header=True` (a `ds-epoch` header on every record); exactly-once with
  `compression.type=none` (the sink's default is lz4; Spark's sink, with the Kafka client's
  defaults, compresses nothing); and, exactly-once, with the
  value made by Spark (`to_json(struct(*)) AS value`, `value_column="value"`), the same
  bytes-building as the next variant, with or without the header; exactly-once with
  `produce_in_bulk=False` (a `produce()` call per record instead of librdkafka's batch call,
  `kafka-ours-eo-perrecord`).
- kafka, ours, value built in the executors (`kafka-ours-eo-execjson`): the sink's own JSON
  value computed by `mapInArrow` in Spark's Python workers, `value_column="value"`.
- kafka, Spark: `selectExpr("to_json(struct(*)) AS value").writeStream.format("kafka")` (the
  connector's defaults: idempotent producer, acks=all, no transactions).
- `<variant>-8parts` (ours, Spark's Kafka sink, the floor): the same rows in micro-batches of
  8 files, each read as an input partition of its own (`--files-per-batch` sets the usual
  count, 2), to see whether the driver's writes overlap Spark's later tasks.
- delta (on request, `--variants delta-ours-eo,...`; benchmarks/delta_spark.py runs them at
  several batch sizes): ours in driver and executor mode, delta-spark's streaming sink
  (`format("delta")`), with the session settings of DELTA_CONF.
- floor: a foreachBatch that only streams the batch to the driver as Arrow record batches
  (`durable_sinks.spark._arrow.socket_batches`, what our driver mode reads with) and drops
  them: the least any writer fed through the driver's Python pays. Its ratio to JDBC bounds
  what such a writer can reach.
Topics have two partitions. Each variant first runs once on one micro-batch (class loading,
JIT, connections), then all variants alternate for `--rounds` rounds (forward, backward,
forward, ...), each run after `--settle` seconds of rest and a Postgres CHECKPOINT; best and
median of each are reported, and each ratio also as the median of its per-round ratios (the
machine drifts between rounds). For ours, each micro-batch is split into reading it from
Spark, the sink's writes and the protocol (from the coordinator's epoch metrics).
With `--master cluster` the session's executors run on the test bed's Spark standalone
cluster (`python -m tests.services up spark-cluster`: two workers of one core each), on
`--cluster-workers` 1 or 2 of them (`spark.cores.max`): executor mode's scaling.
With `--connect` every query runs on the test bed's Spark Connect server (`python -m
tests.services up connect`: `local[2]`, the same conf) from a remote session: foreachBatch
runs server-side, so our per-phase split is not reported, and the floor reads the batch as
Connect's driver mode does (`chunked_batches`: persist, count, `toArrow()`), there being no
public Arrow stream under Connect.
Every run is checked: Spark's progress reports must show every batch with its rows, and the
table's row count, or the topic's end offsets (plus at most one commit marker per partition
per batch for ours), must equal the rows written; for ours exactly-once into Kafka, the audit
`durable-sinks verify` runs (sinks/kafka/operations.py `holdings`) must also count each
epoch's committed records, once, equal to its batch's rows. Anything else raises.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql

from benchmarks.postgres_sink import make_rows
from durable_sinks.sinks.kafka.admin import list_offsets
from durable_sinks.sinks.kafka.operations import holdings
from durable_sinks.sinks.kafka.progress import progress_key
from durable_sinks.spark import _arrow, durable_sink, sink
from durable_sinks.spark._arrow import chunked_batches, socket_batches
from durable_sinks.spark._options import DEFAULT_MAX_ROWS_IN_MEMORY
from durable_sinks.spark._session import is_connect
from tests.services import KafkaEndpoint, PostgresEndpoint, up
from tests.support.targets import create_topic

SPARK_SCHEMA = "id BIGINT, body STRING, score DOUBLE, at TIMESTAMP"
FILES_PER_BATCH = 2
PARTITIONS = 2
JDBC_BATCH_SIZE = "10000"
#: With a Delta variant: delta-spark's extension and catalog (static settings); its log
#: replay on 2 partitions, as many as the cores (its default, 50, costs ~1.7 s per batch
#: here); and zstd at level 1 for Spark's Parquet writer, the codec and level ours writes
#: (pyarrow's default level), so both sides compress alike.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.parquet.compression.codec": "zstd",
    "spark.hadoop.parquet.compression.codec.zstd.level": "1",
}

VARIANTS = {
    "pg-ours-eo": "postgres, ours exactly-once",
    "pg-ours-alo": "postgres, ours at-least-once",
    "pg-ours-eo-serial": "postgres, ours exactly-once, concurrent_writes=False",
    "pg-ours-eo-ungrouped": "postgres, ours exactly-once, Spark's record batches not grouped",
    "pg-ours-chunked": "postgres, ours exactly-once, driver_read='chunked'",
    "pg-ours-executor": "postgres, ours exactly-once, executor mode",
    "pg-jdbc": "postgres, df.write.jdbc",
    "pg-jdbc-rewrite": "postgres, df.write.jdbc + reWriteBatchedInserts",
    "kafka-ours-eo": "kafka, ours exactly-once",
    "kafka-ours-alo": "kafka, ours at-least-once",
    "kafka-ours-eo-tojson": "kafka, ours exactly-once, value by Spark's to_json",
    "kafka-ours-eo-header": "kafka, ours exactly-once, epoch_header=True",
    "kafka-ours-eo-uncompressed": "kafka, ours exactly-once, compression.type=none",
    "kafka-ours-eo-perrecord": "kafka, ours exactly-once, produce_in_bulk=False",
    "kafka-ours-eo-tojson-header": "kafka, ours exactly-once, value by to_json, epoch_header=True",
    "kafka-ours-eo-execjson": "kafka, ours exactly-once, value built by the executors' Python",
    "pg-kafka-ours-eo": "postgres + kafka in one job, ours exactly-once",
    "pg-kafka-ours-eo-serial": "postgres + kafka in one job, ours, concurrent_writes=False",
    "pg-kafka-ours-eo-ungrouped": "postgres + kafka in one job, ours, record batches not grouped",
    "kafka-ours-eo-ungrouped": "kafka, ours exactly-once, Spark's record batches not grouped",
    "kafka-spark": "kafka, Spark's Kafka sink",
    "delta-ours-eo": "delta, ours exactly-once",
    "delta-ours-executor": "delta, ours exactly-once, executor mode",
    "delta-spark": "delta, delta-spark's streaming sink",
    "floor": "floor: foreachBatch streaming the batch as Arrow only",
}
#: Variants run on input of more, smaller partitions: VARIANT-<n>parts reads micro-batches of
#: <n> Parquet files (input partitions) instead of --files-per-batch, in the same run.
MORE_PARTS = (8,)
for _parts in MORE_PARTS:
    for _name in ("kafka-ours-eo", "kafka-spark", "floor"):
        VARIANTS[f"{_name}-{_parts}parts"] = f"{VARIANTS[_name]}, {_parts} input partitions"


#: Spark packs small files into one input partition up to its split size, counting each file
#: this many bytes more; at the split size itself, each file is a partition of its own.
OPEN_COST = "spark.sql.files.openCostInBytes"
SPLIT_SIZE = "spark.sql.files.maxPartitionBytes"


@contextmanager
def one_file_per_partition(spark: Any) -> Iterator[None]:
    """Queries started inside read each input file as a partition of its own."""
    saved = spark.conf.get(OPEN_COST, None)
    spark.conf.set(OPEN_COST, str(spark.conf.get(SPLIT_SIZE)))
    try:
        yield
    finally:
        if saved is None:
            spark.conf.unset(OPEN_COST)
        else:
            spark.conf.set(OPEN_COST, saved)


def input_partitions(spark: Any, folder: Path, files: int) -> int:
    """The partitions Spark reads the first `files` Parquet files of `folder` in, one file
    per partition (what a micro-batch of the `-<n>parts` variants reads)."""
    paths = sorted(str(p) for p in folder.glob("*.parquet"))[:files]
    with one_file_per_partition(spark):
        return int(spark.read.schema(SPARK_SCHEMA).parquet(*paths).rdd.getNumPartitions())


def parts_of(variant: str) -> tuple[str, int | None]:
    """The variant without its `-<n>parts` suffix, and n (None without one)."""
    head, _, tail = variant.rpartition("-")
    if head and tail.endswith("parts") and tail.removesuffix("parts").isdigit():
        return head, int(tail.removesuffix("parts"))
    return variant, None


@dataclass
class Run:
    seconds: float
    batch_ms: list[float]  # Spark's addBatch duration of each micro-batch
    # Ours, per micro-batch (ms): the whole foreachBatch call; the call minus the
    # coordinator's phases (streamed read: starting Spark's job; chunked: persist, count and
    # the chunks' toArrow); the sink's writes (streamed: including waiting for Spark's record
    # batches); the protocol (pre_commit + decision + commit).
    parts: dict[str, list[float]] = field(default_factory=dict)


PARTS = ("call", "read", "write", "protocol")


def median_batch_ms(done: list[Run]) -> float:
    """The median of Spark's addBatch over every micro-batch of every run of a variant."""
    return statistics.median(ms for r in done for ms in r.batch_ms)


def write_source(
    folder: Path, rows_per_batch: int, batches: int, files: int = FILES_PER_BATCH
) -> None:
    """`batches` x `files` Parquet files (one row group each), written before any query
    looks."""
    folder.mkdir(parents=True)
    per_file = rows_per_batch // files
    table = make_rows(per_file * files * batches)
    for n in range(batches * files):
        pq.write_table(table.slice(n * per_file, per_file), folder / f"part-{n:05d}.parquet")


class Bench:
    """The session, the servers and the input; one method per variant, each returning a
    checked Run."""

    def __init__(
        self,
        spark: Any,
        pg: PostgresEndpoint,
        kafka: KafkaEndpoint,
        schema: str,
        work: Path,
        timeout: float,
        files_per_batch: int = FILES_PER_BATCH,
    ) -> None:
        self.spark = spark
        self.pg = pg
        self.dsn = pg.conninfo()
        self.kafka = kafka
        self.admin = AdminClient(kafka.config({"log_level": 4}))  # no notices of deleted topics
        self.schema = schema
        self.work = work
        self.timeout = timeout
        self.files_per_batch = files_per_batch
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))

    def close(self) -> None:
        drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema))
        self.conn.execute(drop)
        self.conn.close()

    def run(self, variant: str, source: Path, rows: int, batches: int) -> Run:
        self.conn.execute("CHECKPOINT")  # no other run's dirty pages flushed during this one
        base, parts = parts_of(variant)
        if parts is not None:
            saved, self.files_per_batch = self.files_per_batch, parts
            try:
                return self.run(
                    base, source.with_name(f"{source.name}-{parts}parts"), rows, batches
                )
            finally:
                self.files_per_batch = saved
        if variant == "pg-ours-executor":
            return self.pg_ours(source, rows, batches, "exactly_once", execution="executor")
        if variant.startswith("pg-kafka-ours-eo"):
            serial = variant.endswith("-serial")
            return self.pg_kafka_ours(source, rows, batches, concurrent_writes=not serial)
        if variant.endswith("-ungrouped"):
            # Diagnostic: each of Spark's record batches handed to the sinks as it is (for
            # Postgres its own COPY), as before driver mode grouped them (_arrow.grouped).
            saved, _arrow.GROUP_ROWS = _arrow.GROUP_ROWS, 0
            try:
                return self.run(variant.removesuffix("-ungrouped"), source, rows, batches)
            finally:
                _arrow.GROUP_ROWS = saved
        if variant == "pg-ours-eo-serial":
            return self.pg_ours(source, rows, batches, "exactly_once", concurrent_writes=False)
        if variant == "pg-ours-chunked":
            return self.pg_ours(source, rows, batches, "exactly_once", driver_read="chunked")
        if variant.startswith("pg-ours-"):
            return self.pg_ours(source, rows, batches, _guarantee(variant))
        if variant.startswith("pg-jdbc"):
            return self.pg_jdbc(source, rows, batches, rewrite=variant.endswith("-rewrite"))
        if variant == "kafka-ours-eo-header":
            return self.kafka_ours(source, rows, batches, "exactly_once", epoch_header=True)
        if variant == "kafka-ours-eo-uncompressed":
            return self.kafka_ours(source, rows, batches, "exactly_once", compression="none")
        if variant == "kafka-ours-eo-execjson":
            return self.kafka_ours(source, rows, batches, "exactly_once", executor_json=True)
        if variant == "kafka-ours-eo-perrecord":
            return self.kafka_ours(source, rows, batches, "exactly_once", in_bulk=False)
        if variant.startswith("kafka-ours-eo-tojson"):
            header = True if variant.endswith("-header") else None
            return self.kafka_ours(
                source, rows, batches, "exactly_once", spark_json=True, epoch_header=header
            )
        if variant.startswith("kafka-ours-"):
            return self.kafka_ours(source, rows, batches, _guarantee(variant))
        if variant == "kafka-spark":
            return self.kafka_spark(source, rows, batches)
        if variant == "delta-ours-eo":
            return self.delta_ours(source, rows, batches, "driver")
        if variant == "delta-ours-executor":
            return self.delta_ours(source, rows, batches, "executor")
        if variant == "delta-spark":
            return self.delta_spark(source, rows, batches)
        if variant == "floor":
            return self.floor(source, rows, batches)
        raise ValueError(variant)

    # -- one query ------------------------------------------------------------------------------
    def query(
        self,
        source: Path,
        rows: int,
        batches: int,
        start: Callable[[Any], Any],
        select: Callable[[Any], Any] = lambda stream: stream,
    ) -> Run:
        """Stream `source` (through `select`) into `start(DataStreamWriter)`, which builds the
        sink and returns the started query; time it; check every micro-batch's rows."""
        checkpoint = self.work / f"checkpoint-{uuid.uuid4().hex[:12]}"
        stream = (
            self.spark.readStream.schema(SPARK_SCHEMA)
            .option("maxFilesPerTrigger", self.files_per_batch)
            .parquet(str(source))
        )
        writer = (
            select(stream)
            .writeStream.option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
        )
        started = time.perf_counter()
        query = start(writer)
        finished = query.awaitTermination(self.timeout)  # raises the query's error, if any
        elapsed = time.perf_counter() - started
        if not finished:
            query.stop()
            raise RuntimeError(f"the query did not finish within {self.timeout} s")
        progress = [p for p in query.recentProgress if _progress(p, "numInputRows") > 0]
        seen = sum(int(_progress(p, "numInputRows")) for p in progress)
        if len(progress) != batches or seen != rows:
            raise RuntimeError(
                f"expected {batches} batches, {rows} rows; Spark reports {len(progress)}, {seen}"
            )
        shutil.rmtree(checkpoint, ignore_errors=True)
        return Run(elapsed, [float(_progress(p, "durationMs")["addBatch"]) for p in progress])

    def ours(
        self,
        source: Path,
        rows: int,
        batches: int,
        kind: str | list[Any],
        select: Callable[[Any], Any] = lambda stream: stream,
        job_id: str | None = None,
        **options: Any,
    ) -> Run:
        """A durable_sink of `kind` in foreachBatch; the writer is built inside the clock."""
        parts: dict[str, list[float]] = {name: [] for name in PARTS}
        writers: list[Any] = []
        job = job_id or f"bench-spark-{uuid.uuid4().hex[:12]}"

        def start(stream_writer: Any) -> Any:
            writer = durable_sink(kind, job_id=job, **options)
            writers.append(writer)

            def fn(df: Any, batch_id: int) -> None:
                timed_call(writer, df, batch_id, parts)

            return stream_writer.foreachBatch(fn).start()

        try:
            run = self.query(source, rows, batches, start, select)
        finally:
            for writer in writers:
                writer.close()
        # (Under Spark Connect `fn` ran on the server, on a copy of `parts`.)
        run.parts = {} if is_connect(self.spark) else parts
        return run

    # -- Postgres -------------------------------------------------------------------------------
    def table(self, prefix: str) -> str:
        return f"{self.schema}.{prefix}_{uuid.uuid4().hex[:12]}"

    def check_table(self, table: str, rows: int) -> None:
        ident = sql.Identifier(*table.split("."))
        row = self.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(ident)).fetchone()
        found = int(row[0]) if row else -1
        if found != rows:
            raise RuntimeError(f"{table}: {found} rows, {rows} written")
        held = self.conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
        mine = [str(gid) for (gid,) in held if "bench-spark-" in str(gid)]
        if mine:  # every epoch decided and finished: none may stay prepared
            raise RuntimeError(f"{table}: prepared transactions left behind: {mine}")
        self.conn.execute(sql.SQL("DROP TABLE {}").format(ident))

    def pg_ours(
        self,
        source: Path,
        rows: int,
        batches: int,
        guarantee: str,
        execution: str = "driver",
        driver_read: str = "stream",
        concurrent_writes: bool = True,
    ) -> Run:
        table = self.table("ours")
        run = self.ours(
            source,
            rows,
            batches,
            "postgres",
            dsn=self.dsn,
            table=table,
            create_table=True,
            guarantee=guarantee,
            execution=execution,
            driver_read=driver_read,
            concurrent_writes=concurrent_writes,
        )
        self.check_table(table, rows)
        return run

    def pg_kafka_ours(
        self, source: Path, rows: int, batches: int, *, concurrent_writes: bool
    ) -> Run:
        """Postgres and Kafka in one job (two-phase: Kafka the last resource, the decision in
        the Postgres database)."""
        table, topic = self.table("both"), self.topic()
        sinks = [
            sink("postgres", dsn=self.dsn, table=table, create_table=True),
            sink("kafka", bootstrap_servers=self.kafka.bootstrap_servers, topic=topic),
        ]
        run = self.ours(source, rows, batches, sinks, concurrent_writes=concurrent_writes)
        self.check_table(table, rows)
        self.check_topic(topic, rows, markers=PARTITIONS * batches)
        return run

    def pg_jdbc(self, source: Path, rows: int, batches: int, *, rewrite: bool) -> Run:
        table = self.table("jdbc")
        url = self.pg.jdbc_url() + ("&reWriteBatchedInserts=true" if rewrite else "")
        properties = {
            "user": self.pg.user,
            "password": self.pg.password,
            "driver": "org.postgresql.Driver",
            "batchsize": JDBC_BATCH_SIZE,
        }

        def fn(df: Any, batch_id: int) -> None:
            df.write.jdbc(url, table, mode="append", properties=properties)

        run = self.query(source, rows, batches, lambda w: w.foreachBatch(fn).start())
        self.check_table(table, rows)
        return run

    # -- Kafka ----------------------------------------------------------------------------------
    def topic(self) -> str:
        name = f"bench-spark-{uuid.uuid4().hex[:12]}"
        create_topic(self.admin, name, PARTITIONS)
        return name

    def check_topic(self, topic: str, rows: int, markers: int) -> None:
        """The topic's end offsets must sum to the records written plus at most `markers`
        transaction markers (one per partition per transaction), then it is deleted."""
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        level = IsolationLevel.READ_COMMITTED if markers else IsolationLevel.READ_UNCOMMITTED
        offsets = sum(list_offsets(self.admin, partitions, level, 30).values())
        if not rows <= offsets <= rows + markers:
            raise RuntimeError(f"{topic}: offsets sum to {offsets}, {rows} records written")
        existing = set(self.admin.list_topics(timeout=30).topics)
        doomed = [t for t in (topic, f"{topic}-ds-progress") if t in existing]
        for future in self.admin.delete_topics(doomed, request_timeout=30).values():
            future.result(timeout=30)

    def audit_topic(self, topic: str, job: str, rows: int, batches: int, header: bool) -> None:
        """What `durable-sinks verify` checks, per epoch: each of the run's epochs has one
        progress record and its committed records, counted (by offset range, or by header),
        equal the epoch's rows; anything else raises."""
        held = holdings(
            {"bootstrap.servers": self.kafka.bootstrap_servers},
            self.admin,
            topic,
            f"{topic}-ds-progress",
            progress_key(job, "kafka"),
            header,
            0,
            batches,
            30,
        )
        wrong = {
            epoch: h
            for epoch, h in held.items()
            if not (h.marker and h.counted and h.rows == rows and not h.problems)
            or len(h.participants) != 1
        }
        if sorted(held) != list(range(batches)) or wrong:
            raise RuntimeError(f"{topic}: epochs {sorted(held)} held, wrong: {wrong}")

    def kafka_ours(
        self,
        source: Path,
        rows: int,
        batches: int,
        guarantee: str,
        *,
        spark_json: bool = False,
        executor_json: bool = False,
        epoch_header: bool | None = None,
        compression: str | None = None,
        in_bulk: bool | None = None,
    ) -> Run:
        topic = self.topic()
        store = self.work / f"store-{uuid.uuid4().hex[:12]}"
        options: dict[str, Any] = {}
        if spark_json:
            options = {"select": _to_json, "value_column": "value"}
        if executor_json:
            options = {"select": _executor_json, "value_column": "value"}
        if epoch_header is not None:
            options["epoch_header"] = epoch_header
        if compression is not None:
            options["producer_config"] = {"compression.type": compression}
        if in_bulk is not None:
            options["produce_in_bulk"] = in_bulk
        job = f"bench-spark-{uuid.uuid4().hex[:12]}"
        run = self.ours(
            source,
            rows,
            batches,
            "kafka",
            job_id=job,
            **options,
            bootstrap_servers=self.kafka.bootstrap_servers,
            topic=topic,
            decision_store=str(store),
            guarantee=guarantee,
        )
        if guarantee == "exactly_once":
            self.audit_topic(topic, job, rows // batches, batches, bool(epoch_header))
        # At-least-once may or may not use transactions: allow the markers either way.
        self.check_topic(topic, rows, markers=PARTITIONS * batches)
        shutil.rmtree(store, ignore_errors=True)
        return run

    def kafka_spark(self, source: Path, rows: int, batches: int) -> Run:
        topic = self.topic()

        def start(writer: Any) -> Any:
            return (
                writer.format("kafka")
                .option("kafka.bootstrap.servers", self.kafka.bootstrap_servers)
                .option("topic", topic)
                .start()
            )

        run = self.query(
            source,
            rows,
            batches,
            start,
            select=_to_json,
        )
        self.check_topic(topic, rows, markers=0)
        return run

    # -- Delta ----------------------------------------------------------------------------------
    def delta_ours(self, source: Path, rows: int, batches: int, execution: str) -> Run:
        """Our Delta sink (zstd), its decisions in the table's folder (the default)."""
        path = self.work / f"delta-ours-{uuid.uuid4().hex[:12]}"
        run = self.ours(
            source,
            rows,
            batches,
            "delta",
            path=str(path),
            create_table=True,
            compression="zstd",
            execution=execution,
        )
        self.check_delta(path, rows, batches, ours=True)
        return run

    def delta_spark(self, source: Path, rows: int, batches: int) -> Run:
        """delta-spark's streaming sink (`format("delta")`, its own exactly-once through the
        checkpoint and the table's txn action), zstd at the level ours writes (DELTA_CONF)."""
        path = self.work / f"delta-spark-{uuid.uuid4().hex[:12]}"
        run = self.query(
            source, rows, batches, lambda w: w.format("delta").outputMode("append").start(str(path))
        )
        self.check_delta(path, rows, batches, ours=False)
        return run

    def check_delta(self, path: Path, rows: int, batches: int, *, ours: bool) -> None:
        """The table read back with delta-rs: `rows` distinct ids, one commit per micro-batch
        (plus the creating one for delta-spark's first, if separate); ours: each epoch's
        application transaction in its commit. Then the table is deleted."""
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        table = DeltaTable(str(path))
        ids = table.to_pyarrow_table(columns=["id"]).column("id")
        if len(ids) != rows or pc.count_distinct(ids).as_py() != rows:
            raise RuntimeError(f"{path}: {len(ids)} rows, {rows} distinct written")
        history = table.history()
        if ours:
            epochs = sorted(
                int(str(h["durable_sinks.epoch"])) for h in history if "durable_sinks.epoch" in h
            )
            if epochs != list(range(batches)):
                raise RuntimeError(f"{path}: commits by epoch {epochs}")
        else:
            streamed = [h for h in history if h.get("operation") == "STREAMING UPDATE"]
            if len(streamed) != batches:
                raise RuntimeError(f"{path}: {len(streamed)} streaming commits, {batches} batches")
        codecs = {
            pq.ParquetFile(uri.removeprefix("file://")).metadata.row_group(0).column(0).compression
            for uri in table.file_uris()
        }
        if codecs != {"ZSTD"}:
            raise RuntimeError(f"{path}: data files compressed with {codecs}, not ZSTD alone")
        shutil.rmtree(path, ignore_errors=True)

    # -- floor ----------------------------------------------------------------------------------
    def floor(self, source: Path, rows: int, batches: int) -> Run:
        def fn(df: Any, batch_id: int) -> None:
            if is_connect(df):
                read = chunked_batches(df, DEFAULT_MAX_ROWS_IN_MEMORY, job="floor", epoch=batch_id)
            else:
                read = socket_batches(df, job="floor", epoch=batch_id)
            for _ in read:
                pass

        return self.query(source, rows, batches, lambda w: w.foreachBatch(fn).start())


def timed_call(writer: Any, df: Any, batch_id: int, parts: dict[str, list[float]]) -> Any:
    """Call `writer` with the batch; append to `parts` (ms) the whole call, what it spent
    outside the coordinator's phases ("read"), the sink's writes and the protocol. Returns the
    epoch's metrics."""
    started = time.perf_counter()
    writer(df, batch_id)
    call = time.perf_counter() - started
    result = writer.last_result
    assert result is not None
    metrics = result.metrics
    parts["call"].append(call * 1e3)
    parts["read"].append((call - metrics.total_seconds) * 1e3)
    parts["write"].append(metrics.seconds["write"] * 1e3)
    parts["protocol"].append(metrics.protocol_seconds * 1e3)
    return metrics


def _to_json(stream: Any) -> Any:
    return stream.selectExpr("to_json(struct(*)) AS value")


def _executor_json(stream: Any) -> Any:
    """The sink's default JSON value (every column as one JSON object, byte for byte), built
    in the executors' Python workers by `mapInArrow` as part of the batch's own computation,
    so that the driver only produces."""
    names = list(stream.columns)

    def encode(batches: Any) -> Any:
        import pyarrow as pa

        from durable_sinks.sinks.kafka.records import _json_values

        for batch in batches:
            value = _json_values(batch, names)
            yield pa.RecordBatch.from_arrays([value], names=["value"])

    return stream.mapInArrow(encode, "value binary")


def _guarantee(variant: str) -> str:
    return "at_least_once" if variant.endswith("-alo") else "exactly_once"


def _progress(progress: Any, name: str) -> Any:
    """A field of a StreamingQueryProgress (an object in PySpark 4, a dict before)."""
    return progress[name] if isinstance(progress, dict) else getattr(progress, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows-per-batch", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chart", type=Path, help="also draw the per-batch times into this PNG")
    parser.add_argument(
        "--files-per-batch",
        type=int,
        default=FILES_PER_BATCH,
        help="Parquet files (one row group each, so input partitions) per micro-batch",
    )
    parser.add_argument("--settle", type=float, default=1.0, help="seconds of rest before a run")
    parser.add_argument("--timeout", type=float, default=600.0, help="per query, seconds")
    parser.add_argument(
        "--variants",
        default=",".join(v for v in VARIANTS if not v.startswith("delta-")),
        help="comma-separated subset to run (default: all but the Delta ones, which "
        "benchmarks/delta_spark.py runs)",
    )
    parser.add_argument(
        "--connect", action="store_true", help="run the queries on the test bed's Connect server"
    )
    parser.add_argument(
        "--master",
        default="local[2]",
        help="local[2] (default), or `cluster`: the test bed's Spark standalone cluster",
    )
    parser.add_argument(
        "--cluster-workers",
        type=int,
        default=2,
        choices=[1, 2],
        help="with --master cluster: executors on this many of its workers (1 core each)",
    )
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.rows_per_batch % args.files_per_batch:
        parser.error(f"--rows-per-batch must be a multiple of {args.files_per_batch}")
    rows = args.rows_per_batch * args.batches

    if args.master not in ("local[2]", "cluster"):
        parser.error("--master is local[2] or cluster")
    if args.connect and any(v.startswith("delta-") for v in variants):
        parser.error("the Delta variants need delta-spark's session settings: no --connect")
    if args.connect and args.master == "cluster":
        parser.error("--connect runs on the Connect server's own local[2]: no --master cluster")
    servers = ["postgres", "kafka", "spark"]
    servers += ["connect"] if args.connect else []
    servers += ["spark-cluster"] if args.master == "cluster" else []
    testbed = up(servers)
    work = Path(tempfile.mkdtemp(prefix="ds-spark-bench-"))
    began = time.perf_counter()
    write_source(work / "in", args.rows_per_batch, args.batches, args.files_per_batch)
    write_source(work / "warmup", args.rows_per_batch, 1, args.files_per_batch)
    for parts in sorted({n for n in (parts_of(v)[1] for v in variants) if n is not None}):
        write_source(work / f"in-{parts}parts", args.rows_per_batch, args.batches, parts)
        write_source(work / f"warmup-{parts}parts", args.rows_per_batch, 1, parts)
    if args.connect:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(testbed.connect.url).getOrCreate()
    else:
        conf: dict[str, str] = {}
        if args.master == "cluster":
            conf = testbed.spark_cluster.driver_conf()
            os.environ.update(testbed.spark_cluster.driver_env())
            conf["spark.cores.max"] = str(args.cluster_workers)
        if any(v.startswith("delta-") for v in variants):
            conf.update(DELTA_CONF)
        spark = testbed.spark.session("bench", **conf)
        spark.sparkContext.setLogLevel("ERROR")  # not the cached producer on deleted topics
    for parts in sorted({n for n in (parts_of(v)[1] for v in variants) if n is not None}):
        found = input_partitions(spark, work / f"in-{parts}parts", parts)
        if found != parts:
            raise RuntimeError(f"{parts} files per batch are read as {found} partitions")
    bench = Bench(
        spark,
        testbed.postgres.endpoint(),
        testbed.kafka.endpoint(),
        f"bench_spark_{uuid.uuid4().hex[:8]}",
        work,
        args.timeout,
        args.files_per_batch,
    )
    runs: dict[str, list[Run]] = {v: [] for v in variants}
    try:
        for variant in variants:
            bench.run(variant, work / "warmup", args.rows_per_batch, 1)
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else variants[::-1]
            for variant in order:
                time.sleep(args.settle)
                run = bench.run(variant, work / "in", rows, args.batches)
                runs[variant].append(run)
                print(f"round {round_ + 1} {variant:16s} {run.seconds:6.2f} s", flush=True)
    finally:
        bench.close()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(runs, rows, args)
    if args.chart is not None:
        chart(runs, rows, args)
    print(f"whole script: {time.perf_counter() - began:.0f} s")


def chart(runs: dict[str, list[Run]], rows: int, args: argparse.Namespace) -> None:
    """Median per-batch time (Spark's addBatch) of each variant, the floor as a line."""
    from benchmarks.charts import bar_chart

    median = {v: median_batch_ms(done) for v, done in runs.items()}
    floor = [("floor", median["floor"])] if "floor" in median else []
    written = bar_chart(
        args.chart,
        f"Per micro-batch of {args.rows_per_batch:,} rows ({rows:,} in all), {where(args)}\n"
        f"median of Spark's addBatch over {args.rounds} rounds",
        [(VARIANTS[v], ms) for v, ms in median.items()],
        "ms per micro-batch (lower is better)",
        highlight=[VARIANTS[v] for v in median if "-ours-" in v],
        references=floor,
    )
    print(f"chart: {written}")


def where(args: argparse.Namespace) -> str:
    if args.master == "cluster":
        return f"Spark standalone cluster, executors on {args.cluster_workers} worker(s) of 1 core"
    return "local[2]"


def report_phases(
    runs: dict[str, list[Run]], title: str, labels: Mapping[str, str] = VARIANTS
) -> None:
    """The table of our variants' per-batch phases (medians over every batch of every run),
    each named by `labels`."""
    ours = [v for v, done in runs.items() if done[0].parts]
    if not ours:
        return
    print(title)
    print("\n| variant | addBatch | call | outside phases | sink write | protocol |")
    print("|---|---|---|---|---|---|")
    for variant in ours:
        done = runs[variant]
        cells = [median_batch_ms(done)]
        cells += [statistics.median(ms for r in done for ms in r.parts[p]) for p in PARTS]
        print(f"| {labels[variant]} | " + " | ".join(f"{c:,.0f}" for c in cells) + " |")


def report(runs: dict[str, list[Run]], rows: int, args: argparse.Namespace) -> None:
    print(
        f"\n{rows:,} rows (bigint, text, float8, timestamp) in {args.batches} micro-batches of "
        f"{args.rows_per_batch:,} from Parquet files, availableNow, {where(args)}"
        f"{' on a Spark Connect server' if args.connect else ''}; "
        f"{args.rounds} rounds"
    )
    print("\n| variant | best | rows/s (best) | median | addBatch per batch | runs (s) |")
    print("|---|---|---|---|---|---|")
    for variant, done in runs.items():
        best = min(r.seconds for r in done)
        middle = statistics.median(r.seconds for r in done)
        batch = median_batch_ms(done)
        print(
            f"| {VARIANTS[variant]} | {best:.2f} s | {rows / best:,.0f} | {middle:.2f} s "
            f"| {batch:.0f} ms | {', '.join(f'{r.seconds:.2f}' for r in done)} |"
        )

    report_phases(
        runs,
        "\nours per micro-batch, median over all rounds (ms): Spark's addBatch; our "
        "foreachBatch call; in it, outside the coordinator's phases (streamed: starting the "
        "job; chunked: persist, count, toArrow), the sink's writes (streamed: with waiting "
        "for Spark's record batches), the protocol (pre_commit + decision + commit)",
    )

    jdbc: list[str] = [v for v in ("pg-jdbc", "pg-jdbc-rewrite") if v in runs]
    best_jdbc = min(jdbc, key=lambda v: min(r.seconds for r in runs[v])) if jdbc else None
    ratios: list[tuple[str, str | None, str, float]] = [
        ("pg-ours-eo", best_jdbc, "postgres: ours exactly-once / best JDBC", 2.0),
        (
            "pg-ours-executor",
            best_jdbc,
            "postgres: ours exactly-once, executor mode / best JDBC",
            2.0,
        ),
        ("kafka-ours-eo", "kafka-spark", "kafka: ours exactly-once / Spark's Kafka sink", 1.5),
        (
            "kafka-ours-eo-tojson",
            "kafka-spark",
            "kafka: ours exactly-once, value by Spark's to_json / Spark's Kafka sink",
            1.0,
        ),
        ("pg-ours-eo", "pg-ours-alo", "postgres: ours exactly-once / at-least-once", 0.95),
        ("kafka-ours-eo", "kafka-ours-alo", "kafka: ours exactly-once / at-least-once", 0.95),
    ]
    ratios += [
        ("kafka-ours-eo-header", "kafka-spark", "kafka: ours, epoch_header=True / Spark's", 1.0),
        ("pg-ours-eo", "pg-ours-eo-serial", "postgres: concurrent writes / in turn (A/B)", 1.0),
        ("pg-kafka-ours-eo", "pg-kafka-ours-eo-serial", "pg + kafka: concurrent / in turn", 1.0),
        ("pg-ours-executor", "pg-ours-eo", "postgres: executor mode / driver mode", 1.0),
    ]
    if best_jdbc is not None and "floor" in runs:
        # No foreachBatch writer that brings the batch to the driver can beat the floor.
        ratios.append(("floor", best_jdbc, "ceiling: floor / best JDBC", 2.0))
    print("\nthroughput ratios (best / median / median of the per-round ratios; goal):")
    for mine, other, label, goal in ratios:
        if mine not in runs or other is None or other not in runs:
            continue
        a, b = [r.seconds for r in runs[mine]], [r.seconds for r in runs[other]]
        per_round = statistics.median(y / x for x, y in zip(a, b, strict=True))
        middle = statistics.median(b) / statistics.median(a)
        suffix = f" ({VARIANTS[other]})" if other == best_jdbc else ""
        print(
            f"  {label}{suffix}: {min(b) / min(a):.2f}x / {middle:.2f}x / {per_round:.2f}x "
            f"(goal >= {goal}x)"
        )
    report_batch_ratios(runs)


def report_batch_ratios(runs: dict[str, list[Run]]) -> None:
    """Per-batch time (Spark's addBatch; median over every batch of every round, and the
    median of the per-round ratios) against a yardstick, lower is better."""

    def median_ms(variant: str) -> float:
        return median_batch_ms(runs[variant])

    def per_round(variant: str, yardstick: Callable[[int], float]) -> float:
        return statistics.median(
            statistics.median(r.batch_ms) / yardstick(i) for i, r in enumerate(runs[variant])
        )

    def round_ms(variant: str) -> Callable[[int], float]:
        return lambda i: statistics.median(runs[variant][i].batch_ms)

    print("\nper-batch time ratios (median addBatch / yardstick; median of per-round; goal):")
    if "pg-ours-eo" in runs and "floor" in runs:
        ratio = median_ms("pg-ours-eo") / median_ms("floor")
        rounds = per_round("pg-ours-eo", round_ms("floor"))
        print(f"  postgres exactly-once / floor: {ratio:.2f}x / {rounds:.2f}x (goal <= 1.3x)")
    jdbc = [v for v in ("pg-jdbc", "pg-jdbc-rewrite") if v in runs]
    if jdbc:
        best = min(jdbc, key=median_ms)
        print(f"  per batch, {VARIANTS[best]} / x (higher is better; goal >= 2x for ours):")
        for variant in (
            "pg-ours-eo",
            "pg-ours-eo-ungrouped",
            "pg-ours-eo-serial",
            "pg-ours-executor",
            "floor",
        ):
            if variant in runs:
                ratio = median_ms(best) / median_ms(variant)
                rounds = 1 / per_round(variant, round_ms(best))
                print(f"    {VARIANTS[variant]}: {ratio:.2f}x / {rounds:.2f}x")
    for both in ("pg-kafka-ours-eo", "pg-kafka-ours-eo-serial", "pg-kafka-ours-eo-ungrouped"):
        suffix = "-ungrouped" if both.endswith("-ungrouped") else ""
        alone = [v + suffix for v in ("pg-ours-eo", "kafka-ours-eo") if v + suffix in runs]
        if both not in runs or len(alone) < 2:
            continue
        ratio = median_ms(both) / max(median_ms(v) for v in alone)
        slower = [round_ms(v) for v in alone]
        rounds = per_round(both, lambda i: max(ms(i) for ms in slower))  # noqa: B023 - used now
        print(
            f"  {VARIANTS[both]} / the slower sink alone: {ratio:.2f}x / {rounds:.2f}x "
            "(goal <= 1.15x)"
        )

    def peer_over_ours(label: str, peer: str, ours: list[str], goal: float) -> None:
        if not ours or peer not in runs:
            return
        print(f"  {label}, {VARIANTS[peer]} per batch / ours (higher is better; goal >= {goal}x):")
        for variant in ours:
            ratio = median_ms(peer) / median_ms(variant)
            rounds = 1 / per_round(variant, round_ms(peer))
            print(f"    {VARIANTS[variant]}: {ratio:.2f}x / {rounds:.2f}x")

    delta: list[str] = [v for v in ("delta-ours-eo", "delta-ours-executor") if v in runs]
    peer_over_ours("delta", "delta-spark", delta, 1.0)
    if delta and "floor" in runs:
        for variant in delta:
            ratio = median_ms(variant) / median_ms("floor")
            rounds = per_round(variant, round_ms("floor"))
            print(f"  {VARIANTS[variant]} / floor: {ratio:.2f}x / {rounds:.2f}x")
    for parts in (None, *MORE_PARTS):
        suffix = "" if parts is None else f"-{parts}parts"
        kafka = [v for v in runs if v.startswith("kafka-ours-eo") and parts_of(v)[1] == parts]
        peer_over_ours("kafka", f"kafka-spark{suffix}", kafka, 1.5)
        floor = f"floor{suffix}"
        if kafka and floor in runs:
            print(f"  kafka, per batch / {VARIANTS[floor]} (lower is better):")
            spark = [f"kafka-spark{suffix}"] if f"kafka-spark{suffix}" in runs else []
            for variant in [*kafka, *spark]:
                ratio = median_ms(variant) / median_ms(floor)
                rounds = per_round(variant, round_ms(floor))
                print(f"    {VARIANTS[variant]}: {ratio:.2f}x / {rounds:.2f}x")


if __name__ == "__main__":
    main()
