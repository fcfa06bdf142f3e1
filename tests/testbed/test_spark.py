"""Spark from the pyspark wheel runs structured streaming with foreachBatch, numbers batches
0, 1, 2, ... and resumes from its checkpoint; the extra jars (JDBC, Kafka) load and work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from tests.services import KafkaEndpoint, PostgresEndpoint

SCHEMA = "id LONG, body STRING"


def _write_file(folder: Path, name: str, ids: range) -> None:
    lines = [json.dumps({"id": i, "body": f"row {i}"}) for i in ids]
    staging = folder.parent / f".{name}"
    staging.write_text("\n".join(lines) + "\n")
    staging.rename(folder / name)  # the file source must never see a half-written file


def _run_available_now(spark: Any, source: Path, checkpoint: Path) -> list[tuple[int, list[int]]]:
    """Run a query over every file not yet processed, one file per batch; return what
    foreachBatch saw: (batch_id, sorted ids)."""
    seen: list[tuple[int, list[int]]] = []

    def record(batch: Any, batch_id: int) -> None:
        seen.append((batch_id, sorted(row.id for row in batch.collect())))

    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the streaming query did not finish within 120 s"
    assert query.exception() is None
    return seen


def test_foreach_batch_sees_consecutive_batch_ids_and_resumes(spark: Any, tmp_path: Path) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    for n in range(3):
        _write_file(source, f"part-{n}.json", range(n * 10, n * 10 + 10))

    first = _run_available_now(spark, source, checkpoint)
    assert [batch_id for batch_id, _ in first] == [0, 1, 2]
    assert sorted(i for _, ids in first for i in ids) == list(range(30))
    assert all(len(ids) == 10 for _, ids in first)

    _write_file(source, "part-3.json", range(30, 40))
    resumed = _run_available_now(spark, source, checkpoint)
    assert resumed == [(3, list(range(30, 40)))]
    assert (checkpoint / "offsets" / "3").exists()
    assert (checkpoint / "commits" / "3").exists()


def test_jdbc_driver_writes_to_postgres(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str
) -> None:
    frame = spark.range(0, 1000).selectExpr("id", "concat('row ', id) AS body")
    frame.write.jdbc(
        postgres.jdbc_url(),
        f'"{pg_schema}".events',
        mode="overwrite",
        properties={
            "user": postgres.user,
            "password": postgres.password,
            "driver": "org.postgresql.Driver",
        },
    )
    with psycopg.connect(postgres.conninfo()) as conn:
        count = conn.execute(f'SELECT count(*), sum(id) FROM "{pg_schema}".events').fetchone()
    assert count == (1000, 999 * 1000 // 2)


def test_spark_kafka_connector_writes_records(
    spark: Any, kafka: KafkaEndpoint, kafka_topic: str
) -> None:
    frame = spark.range(0, 100).selectExpr(
        "CAST(id AS STRING) AS key", "concat('value ', id) AS value"
    )
    (
        frame.write.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("topic", kafka_topic)
        .save()
    )

    consumer = Consumer(
        kafka.config(
            {
                "group.id": f"check-{kafka_topic}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
    )
    try:
        consumer.assign([TopicPartition(kafka_topic, 0, 0)])
        values = set()
        for _ in range(60):
            for message in consumer.consume(200, timeout=0.5):
                assert message.error() is None
                values.add(message.value())
            if len(values) == 100:
                break
    finally:
        consumer.close()
    assert values == {f"value {i}".encode() for i in range(100)}
