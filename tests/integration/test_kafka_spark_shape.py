"""Spark's Kafka record shape against the test bed's real Kafka, read by read_committed
consumers: key and value bytes, headers in order, explicit partitions; rows the sink cannot
write refused with nothing visible; the JSON shape still chosen on request."""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Message
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.errors import SchemaMismatchError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint
from tests.support.kafka_reads import assert_nothing_visible, read_committed

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def job(
    kafka: KafkaEndpoint, topic: str, unique: UniqueNames, tmp_path: Any, **options: Any
) -> Coordinator:
    config = Kafka(kafka.bootstrap_servers, topic, request_timeout_s=20, **options)
    coordinator = Coordinator(unique.job_id, [KafkaSink(config)], LocalDirectoryStore(tmp_path))
    coordinator.start()
    return coordinator


def spark_rows(topic: str) -> pa.RecordBatch:
    """Spark's Kafka columns with nulls, string and binary values, several headers, explicit
    and unset partitions, and a column Spark ignores."""
    return pa.record_batch(
        {
            "key": pa.array(["k0", None, "k2", "k3"], pa.string()),
            "value": pa.array([b"\x00\xffv0", b"v1", None, b""], pa.binary()),
            "headers": pa.array(
                [
                    [{"key": "h1", "value": b"a"}, {"key": "h2", "value": None}],
                    None,
                    [{"key": "h1", "value": b"c"}, {"key": "h1", "value": b"d"}],
                    [],
                ],
                HEADERS,
            ),
            "partition": pa.array([1, 0, 1, None], pa.int32()),
            "topic": pa.array([topic, None, topic, topic], pa.string()),
            "offset": pa.array([10, 11, 12, 13], pa.int64()),
        }
    )


def records(messages: list[Message]) -> list[tuple[Any, ...]]:
    """(partition, key, value, headers) of each record, by partition then offset."""
    ordered = sorted(messages, key=lambda m: (m.partition(), m.offset()))
    return [(m.partition(), m.key(), m.value(), m.headers()) for m in ordered]


def test_spark_shaped_rows_become_records_with_their_bytes_headers_and_partitions(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    coordinator = job(kafka, topic, unique, tmp_path, epoch_header=True)
    assert coordinator.run_epoch(3, [spark_rows(topic)]).outcome is EpochOutcome.COMMITTED
    coordinator.close()
    found = records(read_committed(kafka, admin, topic))
    epoch = ("ds-epoch", b"3")
    unset = [r for r in found if r[1] == b"k3"]  # the partitioner placed it
    assert len(unset) == 1
    assert unset[0][2:] == (b"", [epoch])
    assert [r for r in found if r[1] != b"k3"] == [
        (0, None, b"v1", [epoch]),
        (1, b"k0", b"\x00\xffv0", [("h1", b"a"), ("h2", None), epoch]),
        (1, b"k2", None, [("h1", b"c"), ("h1", b"d"), epoch]),
    ]


def test_without_the_epoch_header_the_records_carry_only_sparks_headers(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    coordinator = job(kafka, topic, unique, tmp_path, epoch_header=False)
    string_values = pa.record_batch(
        {"value": pa.array(["é", None], pa.string()), "partition": pa.array([0, 1], pa.int32())}
    )
    coordinator.run_epoch(0, [spark_rows(topic), string_values])
    coordinator.close()
    found = [r for r in records(read_committed(kafka, admin, topic)) if r[1] != b"k3"]
    assert found == [
        (0, None, b"v1", None),
        (0, None, "é".encode(), None),
        (1, b"k0", b"\x00\xffv0", [("h1", b"a"), ("h2", None)]),
        (1, b"k2", None, [("h1", b"c"), ("h1", b"d")]),
        (1, None, None, None),
    ]


def test_the_json_shape_stays_available_for_a_batch_with_a_value_column(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    batch = pa.record_batch({"value": pa.array([1, 2], pa.int64()), "id": ["a", "b"]})
    coordinator = job(kafka, topic, unique, tmp_path, record_shape="json")
    coordinator.run_epoch(0, [batch])
    coordinator.close()
    values = sorted(
        json.loads(m.value() or b"")["value"] for m in read_committed(kafka, admin, topic)
    )
    assert values == [1, 2]


BAD_BATCHES = {
    "value of another type": (
        pa.record_batch({"value": pa.array([1], pa.int64())}),
        "column 'value' is int64; Spark's Kafka record shape needs string or binary",
        "record_shape='json'",
    ),
    "partition as a string": (
        pa.record_batch({"value": ["v"], "partition": pa.array(["1"])}),
        "column 'partition' is string; Spark's Kafka record shape needs int",
        "partition int",
    ),
    "headers of another struct": (
        pa.record_batch({"value": ["v"], "headers": pa.array([[{"k": "a", "v": b"1"}]])}),
        "column 'headers' is list<item: struct<k: string, v: binary>>; Spark's Kafka record "
        "shape needs array<struct<key:string,value:binary>>",
        "headers array<struct<key:string,value:binary>>",
    ),
    "a partition the topic does not have": (
        pa.record_batch({"value": ["v", "w"], "partition": pa.array([1, 2], pa.int32())}),
        "invalid_value (column 'partition'): 1 row (first: row 1: partition 2, but topic",
        "modulo the topic's partition count",
    ),
    "a header without a key": (
        pa.record_batch({"value": ["v"], "headers": pa.array([[{"value": b"1"}]], HEADERS)}),
        "row 0: a header with a null key in 'headers'",
        "give every header a key",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_a_batch_the_sink_cannot_write_fails_the_epoch_with_nothing_visible(
    case: str,
    kafka: KafkaEndpoint,
    admin: AdminClient,
    topic: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    """The refused batch comes after a good one of the same epoch: the good one was produced
    into the epoch's transaction, which is aborted."""
    bad, message, fix = BAD_BATCHES[case]
    if "topic" in bad.schema.names:
        column = [t.replace("{topic}", topic) for t in bad.column("topic").to_pylist()]
        bad = bad.set_column(bad.schema.get_field_index("topic"), "topic", pa.array(column))
    good = pa.record_batch({"value": ["first"], "partition": pa.array([0], pa.int32())})
    coordinator = job(kafka, topic, unique, tmp_path)
    try:
        with pytest.raises(SchemaMismatchError, match=re.escape(message)) as raised:
            coordinator.run_epoch(0, [good, bad])
        assert fix in (raised.value.fix or "")
        assert raised.value.epoch == 0
        assert_nothing_visible(kafka, admin, topic, coordinator)
    finally:
        coordinator.close()
