"""`durable_sink` in real Spark streaming queries, into the test bed's Postgres and Kafka."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import psycopg
import pyarrow.parquet as pq
import pytest

from durable_sinks import Delta, Files, Kafka, Postgres
from durable_sinks.coordinator import EpochOutcome
from durable_sinks.core.errors import ConfigError, EpochOrderError, SchemaMismatchError
from durable_sinks.spark import durable_sink, sink
from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from tests.support.s3_target import s3_sink_config

from .streams import (
    delta_epochs,
    delta_ids,
    kafka_ids,
    kafka_open_transactions,
    postgres_ids,
    prepared_transactions,
    run_available_now,
    s3_committed_ids,
    source_stream,
    write_input,
)


def test_one_line_postgres_job_lands_every_row_once_across_restarts_and_replays(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(3):
        write_input(source, f"part-{n}.json", range(n * 10, n * 10 + 10))

    writer = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id, create_table=True)
    run_available_now(source_stream(spark, source), writer, checkpoint)
    assert postgres_ids(dsn, table) == list(range(30))
    assert writer.last_result is not None
    assert writer.last_result.epoch == 2

    # Spark replays a batch it had already run (e.g. the driver died after fn returned but
    # before the commit log was written): the rows are not written again.
    replayed = spark.read.schema("id LONG, body STRING").json(str(source / "part-1.json"))
    writer(replayed, 1)
    assert writer.last_result.outcome is EpochOutcome.ALREADY_COMMITTED
    assert postgres_ids(dsn, table) == list(range(30))

    # A restarted query (new writer, same checkpoint and job id) goes on with batch 3.
    write_input(source, "part-3.json", range(30, 40))
    restarted = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id)
    run_available_now(source_stream(spark, source), restarted, checkpoint)
    assert postgres_ids(dsn, table) == list(range(40))
    assert restarted.last_result is not None
    assert restarted.last_result.epoch == 3
    assert prepared_transactions(dsn, job_id) == []


def test_postgres_and_kafka_in_one_job_commit_each_batch_atomically(
    spark: Any,
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    kafka_topic: str,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(4):
        write_input(source, f"part-{n}.json", range(n * 25, n * 25 + 25))
    # A typed configuration and a sink by kind, in one list.
    writer = durable_sink(
        [
            Postgres(dsn=dsn, table=table, create_table=True),
            sink("kafka", bootstrap_servers=kafka.bootstrap_servers, topic=kafka_topic),
        ],
        job_id=job_id,
    )
    run_available_now(source_stream(spark, source, files_per_batch=2), writer, checkpoint)

    assert postgres_ids(dsn, table) == list(range(100))
    assert kafka_ids(kafka, kafka_topic) == list(range(100))
    result = writer.last_result
    assert result is not None
    assert result.epoch == 1
    assert {h.sink for h in result.decision.handles} == {"postgres", "kafka"}
    assert result.decision.rows() == {"postgres": 50, "kafka": 50}
    assert result.decision.source is not None  # the Spark query id
    assert prepared_transactions(dsn, job_id) == []
    assert kafka_open_transactions(kafka, kafka_topic, f"{kafka_topic}-ds-progress") == []


def test_a_streamed_batch_arrives_partition_by_partition_and_lands_whole(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    write_input(source, "part-0.json", range(400))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        writer = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id, create_table=True)
        run_available_now(source_stream(spark, source).repartition(8), writer, checkpoint)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert postgres_ids(dsn, table) == list(range(400))
    result = writer.last_result
    assert result is not None
    # 8 partitions of ~50 rows, 20 rows per record batch: at least 3 record batches each.
    assert result.metrics.batches >= 24
    assert result.decision.rows() == {"postgres": 400}


def test_spark_default_record_batches_reach_the_sinks_joined_into_groups(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    write_input(source, "part-0.json", range(400))
    assert spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", None) is None
    writer = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id, create_table=True)
    run_available_now(source_stream(spark, source).repartition(8), writer, checkpoint)
    assert postgres_ids(dsn, table) == list(range(400))
    result = writer.last_result
    assert result is not None
    # 8 partitions, at least 8 record batches from Spark: one group of 400 rows, one COPY.
    assert result.metrics.batches == 1
    assert result.decision.rows() == {"postgres": 400}


def test_a_large_batch_is_read_in_bounded_chunks_and_lands_whole(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    write_input(source, "part-0.json", range(400))
    writer = durable_sink(
        "postgres",
        dsn=dsn,
        table=table,
        job_id=job_id,
        create_table=True,
        driver_read="chunked",
        max_rows_in_memory=70,
    )
    run_available_now(source_stream(spark, source).repartition(8), writer, checkpoint)
    assert postgres_ids(dsn, table) == list(range(400))
    result = writer.last_result
    assert result is not None
    # 8 partitions of ~50 rows, at most 70 rows per chunk: one Arrow batch per partition.
    assert result.metrics.batches >= 8
    assert result.decision.rows() == {"postgres": 400}


@pytest.mark.parametrize("execution", ["driver", "executor"])
def test_a_query_moved_to_a_new_checkpoint_continues_the_job_with_first_epoch(
    spark: Any,
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    kafka_topic: str,
    s3: S3Endpoint,
    s3_prefix: str,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    execution: str,
) -> None:
    """The query's checkpoint is deleted: the new query under the same job id starts its batch
    ids again at 0 and is refused, typed, with nothing written and the value to give; with
    `first_epoch` (docs/operations.md) it continues the job, also across its own restart, and
    every row of both streams is in Postgres, Kafka and S3 exactly once (executor mode: no
    Kafka, which executors cannot prepare)."""
    source, table = tmp_path / "in", f"{pg_schema}.events"
    path = f"s3://{s3.bucket}/{s3_prefix.rstrip('/')}"
    dsn = postgres.conninfo()
    for n in range(2):
        write_input(source, f"part-{n}.json", range(n * 10, n * 10 + 10))
    sinks: list[Any] = [Postgres(dsn=dsn, table=table, create_table=True), s3_sink_config(s3, path)]
    if execution == "driver":
        sinks.append(Kafka(bootstrap_servers=kafka.bootstrap_servers, topic=kafka_topic))

    def writer(**options: Any) -> Any:
        return durable_sink(sinks, **{"job_id": job_id, "execution": execution, **options})

    checkpoint = tmp_path / "checkpoint"
    run_available_now(source_stream(spark, source), writer(), checkpoint)
    shutil.rmtree(checkpoint)  # lost; the new stream reads new files only
    fresh = tmp_path / "fresh"
    write_input(fresh, "part-0.json", range(1000, 1010))

    with pytest.raises(Exception, match="another query writes under the same job id") as caught:
        run_available_now(source_stream(spark, fresh), writer(), checkpoint)
    assert "EpochOrderError" in str(caught.value) or isinstance(caught.value, EpochOrderError)
    assert "first_epoch=2" in str(caught.value)
    assert postgres_ids(dsn, table) == list(range(20))

    moved = writer(first_epoch=2)  # the refused query restarted (its batch 0 is replayed)
    run_available_now(source_stream(spark, fresh), moved, checkpoint)
    assert moved.last_result is not None
    assert moved.last_result.epoch == 2
    write_input(fresh, "part-1.json", range(1010, 1020))
    restarted = writer(first_epoch=2)  # the same checkpoint, restarted
    run_available_now(source_stream(spark, fresh), restarted, checkpoint)
    assert restarted.last_result is not None
    assert restarted.last_result.epoch == 3

    expected = [*range(20), *range(1000, 1020)]
    assert postgres_ids(dsn, table) == expected
    if execution == "driver":
        assert kafka_ids(kafka, kafka_topic) == expected
    assert s3_committed_ids(s3, path) == expected
    assert prepared_transactions(dsn, job_id) == []


def test_checkpoint_location_names_the_query_or_the_batch_is_refused(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    """Given, checkpoint_location must hold the running query's checkpoint: the query id read
    from it is the job's; another query's checkpoint, or none there, is a ConfigError before
    anything is written."""
    source, table = tmp_path / "in", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    write_input(source, "part-0.json", range(10))
    checkpoint = tmp_path / "checkpoint"
    told = durable_sink(
        "postgres",
        dsn=dsn,
        table=table,
        job_id=job_id,
        create_table=True,
        checkpoint_location=str(checkpoint),
    )
    run_available_now(source_stream(spark, source), told, checkpoint)
    assert told.last_result is not None
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    assert told.last_result.decision.source == query_id

    for wrong, says in [
        (tmp_path / "nowhere", "holds no streaming checkpoint"),
        (checkpoint, f"is the checkpoint of query {query_id}"),
    ]:
        write_input(tmp_path / f"in-{wrong.name}", "part-0.json", range(100, 110))
        writer = durable_sink(
            "postgres",
            dsn=dsn,
            table=f"{table}_{wrong.name}",
            job_id=f"{job_id}-{wrong.name}",
            create_table=True,
            checkpoint_location=str(wrong),
        )
        stream = source_stream(spark, tmp_path / f"in-{wrong.name}")
        with pytest.raises(Exception, match=says) as caught:
            run_available_now(stream, writer, tmp_path / f"checkpoint-{wrong.name}")
        assert "ConfigError" in str(caught.value) or isinstance(caught.value, ConfigError)
        with psycopg.connect(dsn, autocommit=True) as conn:
            name = f"{table}_{wrong.name}"
            found = conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()
            if found != (None,):  # (created when the job started)
                assert conn.execute(f"SELECT count(*) FROM {name}").fetchone() == (0,)


def test_the_password_never_shows_in_logs_reprs_or_decisions(
    spark: Any,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, table = tmp_path / "in", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    write_input(source, "part-0.json", range(5))
    caplog.set_level(logging.DEBUG, logger="durable_sinks")
    writer = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id, create_table=True)
    run_available_now(source_stream(spark, source), writer, tmp_path / "checkpoint")
    assert writer.last_result is not None
    decision = writer.last_result.decision.to_bytes().decode()
    assert postgres.password
    for text in (caplog.text, repr(writer), repr(writer.specs), decision):
        assert postgres.password not in text
    assert f"job={job_id}" in caplog.text


def test_executor_mode_prepares_each_partition_in_its_task_and_commits_them_atomically(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(2):
        write_input(source, f"part-{n}.json", range(n * 100, n * 100 + 100))
    # Typed configurations: built on the executors from their settings, as sink(...) are.
    writer = durable_sink(
        [Postgres(dsn=dsn, table=table, create_table=True), Files(path=str(tmp_path / "out"))],
        job_id=job_id,
        execution="executor",
    )
    run_available_now(source_stream(spark, source).repartition(4), writer, checkpoint)
    assert postgres_ids(dsn, table) == list(range(200))
    files = pq.read_table(tmp_path / "out", columns=["id"]).column("id").to_pylist()
    assert sorted(files) == list(range(200))
    result = writer.last_result
    assert result is not None
    assert result.epoch == 1
    assert result.decision.rows() == {"postgres": 100, "files": 100}
    parts = {h.participant.split(":")[4] for h in result.decision.handles_for("postgres")}
    assert len(parts) == 4  # one participant per partition, named by partition and task
    assert all(p.startswith("p") and "-t" in p for p in parts)
    assert prepared_transactions(dsn, job_id) == []

    # a replayed batch is not prepared again
    replayed = spark.read.schema("id LONG, body STRING").json(str(source / "part-1.json"))
    writer(replayed, 1)
    again = writer.last_result
    assert again is not None
    assert again.outcome is EpochOutcome.ALREADY_COMMITTED
    assert postgres_ids(dsn, table) == list(range(200))
    assert prepared_transactions(dsn, job_id) == []


def test_executor_mode_upsert_with_a_key_in_two_partitions_fails_typed_and_leaves_nothing(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    """Each partition merges in its own prepared transaction: a key in two partitions of one
    batch would wait on its sibling until the decision, which waits for it. The batch fails
    at once with the typed error driver mode gives for a key twice, and nothing is left; the
    query deduplicated by key then lands the batch."""
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    dsn, table = postgres.conninfo(), f"{pg_schema}.keyed"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, body text)")
    write_input(source, "part-0.json", range(10))
    write_input(source, "part-1.json", range(5, 6))  # one batch, two files: two partitions
    writer = durable_sink(
        "postgres",
        dsn=dsn,
        table=table,
        mode="upsert",
        key=("id",),
        job_id=job_id,
        execution="executor",
    )
    started = time.monotonic()
    with pytest.raises(Exception, match="two Spark partitions") as caught:
        run_available_now(source_stream(spark, source, files_per_batch=2), writer, checkpoint)
    assert time.monotonic() - started < 25  # the lock time-out (30 s) was not waited for
    assert "SchemaMismatchError" in str(caught.value) or isinstance(
        caught.value, SchemaMismatchError
    )
    assert "dropDuplicates(['id'])" in str(caught.value)
    assert prepared_transactions(dsn, job_id) == []
    assert postgres_ids(dsn, table) == []
    deduplicated = source_stream(spark, source, files_per_batch=2).dropDuplicates(["id"])
    run_available_now(deduplicated, writer, checkpoint)
    assert postgres_ids(dsn, table) == list(range(10))
    assert prepared_transactions(dsn, job_id) == []


def test_a_batch_over_max_result_size_is_read_again_partition_by_partition_and_lands_once(
    postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    """Streaming a batch larger than spark.driver.maxResultSize fails Spark's job; the writer
    rolls the epoch back, reads the batch again partition by partition, and keeps reading so.
    A Spark of its own (tests/spark/result_size_child.py): the limit is fixed per
    SparkContext."""
    source, table = tmp_path / "in", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(2):  # two batches of 3,000 rows, ~3 MB as Arrow each: over the 1 MiB limit
        write_input(source, f"part-{n}.json", range(n * 3000, n * 3000 + 3000))
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "dsn": dsn,
                "table": table,
                "job_id": job_id,
                "source": str(source),
                "checkpoint": str(tmp_path / "checkpoint"),
                "repeat": 100,
                "max_rows_in_memory": 500,
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.result_size_child", str(plan)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "larger than spark.driver.maxResultSize" in done.stdout, done.stdout[-3000:]
    assert done.stdout.count("larger than spark.driver.maxResultSize") == 1, done.stdout[-3000:]
    assert "read: partitions" in done.stdout, done.stdout[-3000:]
    assert postgres_ids(dsn, table) == list(range(6000))
    assert prepared_transactions(dsn, job_id) == []


@pytest.mark.parametrize("execution", ["driver", "executor"])
def test_background_commits_land_every_batch_once_and_all_of_them_when_the_writer_closes(
    spark: Any,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    execution: Literal["driver", "executor"],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Postgres, files and a Delta table, every one of which commits beside the next
    batch's writes."""
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(3):
        write_input(source, f"part-{n}.json", range(n * 10, n * 10 + 10))
    caplog.set_level(logging.WARNING, logger="durable_sinks")
    writer = durable_sink(
        [
            Postgres(dsn=dsn, table=table, create_table=True),
            Files(path=str(tmp_path / "out")),
            Delta(path=str(tmp_path / "delta"), create_table=True),
        ],
        job_id=job_id,
        execution=execution,
        background_commits=True,
    )
    stream = source_stream(spark, source)
    run_available_now(
        stream.repartition(2) if execution == "executor" else stream, writer, checkpoint
    )
    assert writer.last_result is not None
    assert writer.last_result.epoch == 2
    # Every batch before the last was visible before the next one's decision; the last one
    # is when the writer closes (or the process exits).
    assert set(postgres_ids(dsn, table)) >= set(range(20))
    writer.close()
    assert postgres_ids(dsn, table) == list(range(30))
    files = pq.read_table(tmp_path / "out", columns=["id"]).column("id").to_pylist()
    assert sorted(files) == list(range(30))
    assert delta_ids(tmp_path / "delta") == list(range(30))
    assert delta_epochs(tmp_path / "delta") == [0, 1, 2]
    assert prepared_transactions(dsn, job_id) == []
    assert "background_commits is off" not in caplog.text
