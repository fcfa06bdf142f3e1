"""Spark's Kafka record shape, pure logic: which shape a batch is written in, its columns'
types and rows checked against Spark's rules, and the records built from them (no broker)."""

from __future__ import annotations

import datetime as dt
import zlib
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks.core.bad_rows import RefusalReason
from durable_sinks.core.errors import ConfigError
from durable_sinks.sinks.kafka import Kafka
from durable_sinks.sinks.kafka.config import JSON_SHAPE, SPARK_SHAPE
from durable_sinks.sinks.kafka.spark_shape import (
    build_spark_records,
    row_refusals,
    schema_problems,
)

HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
HEADERS = pa.list_(HEADER)
UTC = dt.timezone.utc


def spark_batch() -> pa.RecordBatch:
    """Every Spark column, with nulls, and one column Spark ignores."""
    return pa.record_batch(
        {
            "key": pa.array(["k0", None, "k2"], pa.string()),
            "value": pa.array([b"\x00v0", b"", None], pa.binary()),
            "headers": pa.array(
                [
                    [{"key": "a", "value": b"1"}, {"key": "b", "value": None}],
                    None,
                    [],
                ],
                HEADERS,
            ),
            "partition": pa.array([1, None, 0], pa.int32()),
            "topic": pa.array(["events", None, "events"], pa.string()),
            "timestamp": pa.array(
                [dt.datetime(2026, 1, 1, 0, 0, 0, 1999, tzinfo=UTC), None, None],
                pa.timestamp("us", "UTC"),
            ),
            "ignored": pa.array([1, 2, 3], pa.int64()),
        }
    )


def config(**options: Any) -> Kafka:
    return Kafka("127.0.0.1:9092", "events", **options)


# -- which shape -----------------------------------------------------------------------------
def test_a_value_column_chooses_the_spark_shape_unless_column_options_are_set() -> None:
    with_value = pa.schema([("value", pa.string()), ("n", pa.int64())])
    without = pa.schema([("id", pa.string()), ("n", pa.int64())])
    assert config().record_shape_for(with_value) == SPARK_SHAPE
    assert config().record_shape_for(without) == JSON_SHAPE
    assert config(key_column="id").record_shape_for(with_value) == JSON_SHAPE
    assert config(header_columns=("n",)).record_shape_for(with_value) == JSON_SHAPE
    assert config(record_shape="json").record_shape_for(with_value) == JSON_SHAPE
    assert config(record_shape="spark").record_shape_for(without) == SPARK_SHAPE


def test_an_unknown_shape_or_column_options_with_the_spark_shape_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="'avro' is not a record shape") as unknown:
        config(record_shape="avro")
    assert "record_shape='spark'" in (unknown.value.fix or "")
    with pytest.raises(ConfigError, match=r"\['key_column', 'value_column'\]") as mixed:
        config(record_shape="spark", value_column="v", key_column="k")
    assert "record_shape='json'" in (mixed.value.fix or "")
    config(record_shape="json", value_column="v", key_column="k")  # the JSON shape keeps them


# -- records ---------------------------------------------------------------------------------
def test_rows_become_the_records_sparks_kafka_sink_writes() -> None:
    records = build_spark_records(spark_batch(), 7)
    assert records.values == [b"\x00v0", b"", None]  # a null value: a tombstone
    assert records.keys == ["k0", None, "k2"]  # a null key: no key
    assert records.headers == [[("a", b"1"), ("b", None)], [], []]  # in order
    assert records.partitions == [1, -1, 0]  # null: the partitioner's choice
    assert records.timestamps == [1_767_225_600_001, 0, 0]  # micros dropped; null: now
    assert records.own_headers_first
    # value + key + header keys and values
    assert records.sizes.to_pylist() == [3 + 2 + 1 + 1 + 1, 0, 0 + 2]
    assert records.checksum == zlib.crc32(b"k0k2", zlib.crc32(b"\x00v0", 7))


def test_only_value_is_needed_and_strings_are_sent_as_utf8() -> None:
    batch = pa.record_batch({"value": pa.array(["é", None], pa.large_string())})
    records = build_spark_records(batch, 0)
    assert records.values == ["é", None]  # the producer encodes str as UTF-8
    assert (records.keys, records.headers, records.partitions, records.timestamps) == (
        None,
        None,
        None,
        None,
    )
    assert records.sizes.to_pylist() == [2, 0]
    assert records.checksum == zlib.crc32("é".encode())


def test_large_arrow_types_are_the_same_spark_types() -> None:
    large_header = pa.struct([("key", pa.large_string()), ("value", pa.large_binary())])
    batch = pa.record_batch(
        {
            "value": pa.array([b"v"], pa.large_binary()),
            "key": pa.array(["k"], pa.large_string()),
            "headers": pa.array([[{"key": "h", "value": b"x"}]], pa.large_list(large_header)),
        }
    )
    assert schema_problems(batch.schema) == []
    assert problems(batch, "events") == []
    records = build_spark_records(batch, 0)
    assert records.headers == [[("h", b"x")]]
    assert records.sizes.to_pylist() == [1 + 1 + 1 + 1]


# -- refused ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("column", "array", "expected"),
    [
        ("value", pa.array([1], pa.int64()), "string or binary"),
        ("key", pa.array([1.5], pa.float64()), "string or binary"),
        ("partition", pa.array(["1"], pa.string()), "int"),
        ("partition", pa.array([1], pa.int64()), "int"),  # Spark takes IntegerType only
        ("topic", pa.array([1], pa.int32()), "string"),
        ("timestamp", pa.array([1.0], pa.float64()), "timestamp"),
        (
            "headers",
            pa.array([[{"key": "a", "value": "text"}]]),  # value string, not binary
            "array<struct<key:string,value:binary>>",
        ),
        ("headers", pa.array([["a"]]), "array<struct<key:string,value:binary>>"),
        (
            "headers",
            pa.array([{"key": "a", "value": b"1"}], HEADER),  # a struct, not an array
            "array<struct<key:string,value:binary>>",
        ),
    ],
)
def test_a_column_of_another_type_is_named_with_sparks_type(
    column: str, array: pa.Array, expected: str
) -> None:
    columns = {"value": pa.array([b"v"]), column: array}
    problems = schema_problems(pa.record_batch(columns).schema)
    assert problems == [
        f"column {column!r} is {array.type}; Spark's Kafka record shape needs {expected}"
    ]


def test_a_batch_without_a_value_column_or_with_a_repeated_one_is_refused() -> None:
    [missing] = schema_problems(pa.schema([("key", pa.string())]))
    assert "needs a 'value' column" in missing
    twice = pa.schema([("value", pa.string()), ("value", pa.binary())])
    assert schema_problems(twice) == ["the batch has more than one column named each of ['value']"]


def test_other_columns_are_ignored_whatever_their_type() -> None:
    batch = pa.record_batch(
        {"value": pa.array(["v"]), "offset": pa.array([1.5]), "when": pa.array([{"a": 1}])}
    )
    assert schema_problems(batch.schema) == []
    assert build_spark_records(batch, 0).values == ["v"]


def problems(batch: pa.RecordBatch, topic: str, partitions: int = 2) -> list[tuple[int, str]]:
    refused = row_refusals(batch, topic, partitions)
    assert {r.reason for r in refused.refusals} <= {RefusalReason.INVALID_VALUE}
    return [(row, r.message) for row, r in zip(refused.rows, refused.refusals, strict=True)]


def test_with_the_topic_option_the_topic_column_is_ignored_as_spark_ignores_it() -> None:
    assert problems(spark_batch(), "events") == []
    assert problems(spark_batch(), "orders") == []  # the option takes precedence


def test_rows_sparks_sink_fails_on_are_refused_with_the_row() -> None:
    partitions = pa.record_batch(
        {
            "value": pa.array(["a", "b", "c", "d"]),
            "partition": pa.array([0, -1, 2, None], pa.int32()),
        }
    )
    assert problems(partitions, "t") == [
        (1, "partition -1, but topic 't' has partitions 0..1"),
        (2, "partition 2, but topic 't' has partitions 0..1"),
    ]
    null_key = pa.record_batch(
        {
            "value": pa.array(["a", "b"]),
            "headers": pa.array(
                [[{"key": "x", "value": b"1"}], [{"key": "y", "value": None}, {"value": b"2"}]],
                HEADERS,
            ),
        }
    )
    assert problems(null_key, "t") == [
        (1, "a header with a null key in 'headers'; a Kafka header needs a key")
    ]
    null_entry = pa.record_batch(
        {"value": pa.array(["a", "b"]), "headers": pa.array([[], [None]], HEADERS)}
    )
    assert problems(null_entry, "t") == [
        (1, "a null header in 'headers'; a Kafka header needs a key")
    ]
