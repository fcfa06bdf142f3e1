"""A DataFrame shaped for Spark's own Kafka sink, written by that sink
(`writeStream.format("kafka")`, spark-sql-kafka-0-10 on the test bed's classpath) and by
`durable_sink("kafka", ...)` in a streaming foreachBatch, from the same source: read back
from both topics by read_committed consumers, every partition holds the same records (key,
value, headers) in the same order."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.spark import durable_sink
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint
from tests.support.kafka_reads import read_committed
from tests.support.targets import create_topic, delete_with_progress

from .streams import source_stream, write_input

PARTITIONS = 2


def spark_columns(key_type: str, topic: str) -> list[str]:
    """Spark's Kafka columns from the source's `id` and `body`: null keys and values, several
    headers (a repeated name, a null value, a null array, an empty one), explicit partitions
    and, for keyed rows only, unset ones (placed by the key's hash); a `topic` column Spark's
    `topic` option overrides; `id`, a column both sinks ignore."""
    return [
        f"CAST(IF(id % 5 = 0, NULL, concat('k', id)) AS {key_type}) AS key",
        f"CAST(IF(id % 7 = 3, NULL, concat(body, ' é')) AS {key_type}) AS value",
        """CASE
             WHEN id % 4 = 0 THEN NULL
             WHEN id % 4 = 1 THEN array()
             ELSE array(
               named_struct('key', 'h1', 'value', CAST(concat('a', id) AS BINARY)),
               named_struct('key', 'h2', 'value', IF(id % 3 = 0, NULL, CAST(body AS BINARY))),
               named_struct('key', 'h1', 'value', X'00FF'))
           END AS headers""",
        "IF(id % 6 = 1 AND id % 5 != 0, NULL, CAST(id % 2 AS INT)) AS partition",
        f"'{topic}' AS topic",
        "id",
    ]


@pytest.fixture
def admin(kafka: KafkaEndpoint) -> AdminClient:
    return AdminClient(kafka.config())


@pytest.fixture
def topics(admin: AdminClient, unique: UniqueNames) -> Iterator[tuple[str, str]]:
    """Two fresh topics of PARTITIONS partitions: Spark's sink's and ours."""
    names = unique.name("spark"), unique.name("ours")
    for name in names:
        create_topic(admin, name, PARTITIONS)
    yield names
    for name in names:
        delete_with_progress(admin, name)


def by_partition(kafka: KafkaEndpoint, admin: AdminClient, topic: str) -> dict[int, list[Any]]:
    """(key, value, headers) of every committed record, per partition in offset order."""
    found: dict[int, list[Any]] = defaultdict(list)
    messages = read_committed(kafka, admin, topic)
    for m in sorted(messages, key=lambda m: (m.partition() or 0, m.offset() or 0)):
        partition = m.partition()
        assert partition is not None
        found[partition].append((m.key(), m.value(), m.headers()))
    return dict(found)


@pytest.mark.parametrize("key_type", ["STRING", "BINARY"])
def test_the_same_dataframe_lands_as_sparks_kafka_sink_writes_it(
    key_type: str,
    spark: Any,
    kafka: KafkaEndpoint,
    admin: AdminClient,
    topics: tuple[str, str],
    job_id: str,
    tmp_path: Path,
) -> None:
    spark_topic, our_topic = topics
    source = tmp_path / "in"
    for n in range(3):
        write_input(source, f"part-{n}.json", range(n * 12, n * 12 + 12))
    shaped = source_stream(spark, source).selectExpr(*spark_columns(key_type, our_topic))

    theirs = (
        shaped.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("topic", spark_topic)
        .option("checkpointLocation", str(tmp_path / "spark-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert theirs.awaitTermination(180), "Spark's Kafka sink did not finish"
    assert theirs.exception() is None

    writer = durable_sink(
        "kafka",
        bootstrap_servers=kafka.bootstrap_servers,
        topic=our_topic,
        job_id=job_id,
        decision_store=str(tmp_path / "decisions"),
        epoch_header=False,
    )
    ours = (
        shaped.writeStream.foreachBatch(writer)
        .option("checkpointLocation", str(tmp_path / "our-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert ours.awaitTermination(180), "the durable_sink query did not finish"
    assert ours.exception() is None
    assert writer.last_result is not None
    assert writer.last_result.epoch == 2  # one file per batch: three batches

    expected = by_partition(kafka, admin, spark_topic)
    assert sum(len(records) for records in expected.values()) == 36
    assert sorted(expected) == [0, 1]
    found = by_partition(kafka, admin, our_topic)
    assert found == expected
    # The records hold what the test meant them to: null keys and values, headers in order.
    flat = [record for records in expected.values() for record in records]
    assert (None, "row 0 é".encode(), None) in flat
    assert (b"k1", "row 1 é".encode(), None) in flat  # an empty header array
    assert (b"k3", None, [("h1", b"a3"), ("h2", None), ("h1", b"\x00\xff")]) in flat
