"""Helpers of the Spark tests: a replayable file source, and the sinks read as their readers
would (Postgres committed rows, Kafka read_committed records, an Iceberg table's current
snapshot)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql

from durable_sinks.coordinator import EpochOutcome
from durable_sinks.core.naming import job_prefix
from durable_sinks.sinks.kafka.admin import list_offsets
from durable_sinks.sinks.s3 import committed_dataset
from tests.services import KafkaEndpoint, S3Endpoint
from tests.support.s3_target import s3_sink_config
from tests.support.targets import open_transactions

SCHEMA = "id LONG, body STRING"


def write_input(folder: Path, name: str, ids: range) -> None:
    """One JSON-lines file of the source, renamed into place (the file source must never see
    a half-written file)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": i, "body": f"row {i}"}) for i in ids]
    staging = folder.parent / f".{folder.name}-{name}"
    staging.write_text("\n".join(lines) + "\n")
    staging.rename(folder / name)


def source_stream(spark: Any, folder: Path, files_per_batch: int = 1) -> Any:
    """The files of `folder` as a stream, `files_per_batch` files per micro-batch: replayed
    batches hold the same rows (the file source logs which files each batch read)."""
    return (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", files_per_batch)
        .json(str(folder))
    )


def run_available_now(stream: Any, fn: Any, checkpoint: Path, timeout: float = 180) -> None:
    """Process every file not yet processed, then stop; raise the query's error if any."""
    query = (
        stream.writeStream.foreachBatch(fn)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    finished = query.awaitTermination(timeout)
    if not finished:
        query.stop()
        raise AssertionError(f"the streaming query did not finish within {timeout} s")


def restart_with_a_new_column(
    spark: Any, source: Path, checkpoint: Path, writer: Callable[[], Any]
) -> None:
    """Ids 0-9 as `id, body` in two micro-batches by a writer from `writer()`; then the query
    changed to carry `extra` (`e<id>`) for ids 10-19 and restarted from its checkpoint with a
    new writer, which must write epochs 2 and 3 and find epoch 1, replayed in the old schema,
    already committed."""

    def write_rows(name: str, rows: list[dict[str, Any]]) -> None:
        source.mkdir(parents=True, exist_ok=True)
        staging = source.parent / f".{source.name}-{name}"
        staging.write_text("".join(json.dumps(r) + "\n" for r in rows))
        staging.rename(source / name)

    def stream(schema: str) -> Any:
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(source))

    for n in range(2):
        write_rows(f"part-{n}.json", [{"id": i, "body": f"r{i}"} for i in range(n * 5, n * 5 + 5)])
    run_available_now(stream("id LONG, body STRING"), writer(), checkpoint)
    for n in range(2, 4):
        rows = [{"id": i, "body": f"r{i}", "extra": f"e{i}"} for i in range(n * 5, n * 5 + 5)]
        write_rows(f"part-{n}.json", rows)
    restarted = writer()
    run_available_now(stream("id LONG, body STRING, extra STRING"), restarted, checkpoint)
    assert restarted.last_result is not None
    assert restarted.last_result.epoch == 3
    # A batch of the old schema replayed after the restart is not written again.
    restarted(spark.read.schema("id LONG, body STRING").json(str(source / "part-1.json")), 1)
    assert restarted.last_result.outcome is EpochOutcome.ALREADY_COMMITTED


def postgres_ids(dsn: str, table: str) -> list[int]:
    schema, name = table.split(".")
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(schema, name))
        return [int(r[0]) for r in conn.execute(query).fetchall()]


def prepared_transactions(dsn: str, job_id: str) -> list[str]:
    """The job's prepared Postgres transactions (by its participant-name prefix: a long job
    id appears in them only as its hash)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s) ORDER BY gid",
            (job_prefix(job_id),),
        ).fetchall()
    return [str(r[0]) for r in rows]


def kafka_ids(endpoint: KafkaEndpoint, topic: str, partitions: int = 1) -> list[int]:
    """The `id` of every record a read_committed consumer sees, up to the last stable
    offsets (aborted and open transactions' records are invisible to it)."""
    admin = AdminClient(endpoint.config())
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    stable = list_offsets(admin, tps, IsolationLevel.READ_COMMITTED, 20)
    consumer = Consumer(
        endpoint.config(
            {
                "group.id": "spark-tests-reader",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
    )
    ids: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while True:
            positions = consumer.position(tps)
            if all(max(p.offset, 0) >= stable[tp] for p, tp in zip(positions, tps, strict=True)):
                return sorted(ids)
            if time.monotonic() > deadline:
                raise AssertionError(f"read_committed reader stuck at {positions}, LSO {stable}")
            for message in consumer.consume(num_messages=1000, timeout=0.1):
                assert message.error() is None, message.error()
                value = message.value()
                assert value is not None
                ids.append(int(json.loads(value)["id"]))
    finally:
        consumer.close()


def kafka_open_transactions(endpoint: KafkaEndpoint, *topics: str) -> list[str]:
    admin = AdminClient(endpoint.config())
    return open_transactions(admin, [TopicPartition(t, 0) for t in topics])


def published_file_ids(folder: Path) -> list[int]:
    """The `id` of every row the files sink published under `folder` (its committed epochs'
    Parquet files; staging is not read)."""
    ids: list[int] = []
    for file in folder.glob("epoch=*/part=*/*.parquet"):
        ids.extend(pq.read_table(file, columns=["id"]).column("id").to_pylist())
    return sorted(ids)


def s3_committed_ids(s3: S3Endpoint, s3_path: str) -> list[int]:
    """The `id` of every row of the S3 sink's committed epochs under `s3_path`, sorted."""
    table = committed_dataset(s3_path, s3_sink_config(s3, s3_path).connection).to_table(
        columns=["id"]
    )
    return sorted(table.column("id").to_pylist())


def delta_ids(path: Path) -> list[int]:
    """The ids in the Delta table at `path`, sorted, as delta-rs reads its newest version."""
    import pyarrow as pa
    from deltalake import DeltaTable

    return sorted(pa.table(DeltaTable(str(path)).to_pyarrow_table()).column("id").to_pylist())


def delta_epochs(path: Path) -> list[int]:
    """The epochs of the durable-sinks commits in the table's log, one per commit."""
    from tests.support.delta_target import log_epochs

    return log_epochs(path)


def delta_leftovers(path: Path) -> list[str]:
    """Journals, staged rows and data files of no committed version under the table."""
    from tests.support.delta_target import folder_leftovers

    return folder_leftovers(path)


def _iceberg_table(options: Mapping[str, Any]) -> Any:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(options["catalog_name"], **options["catalog"])
    return catalog.load_table((options["namespace"], options["table"]))


def iceberg_ids(options: Mapping[str, Any]) -> list[int]:
    """The ids in the Iceberg table the sink `options` name (`catalog`, `catalog_name`,
    `namespace`, `table`), sorted, as a reader of its current snapshot sees them (pyiceberg's
    scan). The one place the Spark tests read an Iceberg table back."""
    scanned = _iceberg_table(options).scan(selected_fields=("id",)).to_arrow()
    return sorted(scanned.column("id").to_pylist())


def iceberg_orphans(options: Mapping[str, Any], job_id: str, sink: str = "iceberg") -> list[str]:
    """The data files of the job's sink under the table's data folder that its current
    snapshot does not hold (a participant neither committed nor rolled back)."""
    from durable_sinks.sinks.iceberg import _pyiceberg
    from durable_sinks.sinks.iceberg.layout import Layout

    table = _iceberg_table(options)
    held = {str(task.file.file_path) for task in table.scan().plan_files()}
    layout = Layout(job_id, sink)
    listed = _pyiceberg.list_files(table, table.location().rstrip("/") + "/data")
    return sorted(p for p in listed if layout.parse(p) is not None and p not in held)


def iceberg_epochs(options: Mapping[str, Any], job_id: str) -> list[int]:
    """The epochs of the job's commits in the table's snapshots, one per commit, oldest
    first."""
    from durable_sinks.sinks.iceberg.layout import SUMMARY_EPOCH, SUMMARY_JOB

    return [
        int(s.summary[SUMMARY_EPOCH])
        for s in _iceberg_table(options).snapshots()
        if s.summary is not None and s.summary.get(SUMMARY_JOB) == job_id
    ]
