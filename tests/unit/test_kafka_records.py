"""Pure logic of the Kafka sink: Arrow rows to records, layout checks, progress records and
configuration checks (no broker needed)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import zlib
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_sinks.core.errors import ConfigError, ManifestCorruptError, StoredFormatError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.redaction import redact
from durable_sinks.sinks.kafka import Kafka
from durable_sinks.sinks.kafka.progress import (
    ProgressRecord,
    decode_fence,
    encode_fence,
    progress_key,
)
from durable_sinks.sinks.kafka.records import RecordLayout, build_records
from durable_sinks.sinks.kafka.writer import TransactionalProducer

BATCH = pa.record_batch(
    {
        "k": pa.array(["a", None, "ccc"]),
        "v": pa.array([b"x", None, b"yz"], pa.binary()),
        "h": pa.array(["one", "two", None]),
        "at": pa.array(
            [dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), None, None], pa.timestamp("us")
        ),
        "p": pa.array([0, None, 1], pa.int8()),
        "n": pa.array([1, 2, 3], pa.int64()),
    }
)


def test_columns_map_to_record_parts() -> None:
    layout = RecordLayout("v", "k", ("h",), "at", "p")
    records = build_records(BATCH, layout, 0)
    assert records.values == [b"x", None, b"yz"]
    assert records.keys == ["a", None, "ccc"]
    assert records.headers == [[("h", "one")], [("h", "two")], [("h", None)]]
    assert records.timestamps == [1_767_225_600_000, 0, 0]
    assert records.partitions == [0, -1, 1]
    # value + key + header name + header value, per record
    assert records.sizes.to_pylist() == [1 + 1 + 1 + 3, 0 + 0 + 1 + 3, 2 + 3 + 1 + 0]
    assert records.total_bytes() == 6 + 4 + 6
    assert records.largest() == (0, 6)
    assert list(records.produce_args())[1] == (None, None, [("h", "two")], 0, -1)


def test_the_json_value_holds_every_column_without_a_role() -> None:
    records = build_records(BATCH.select(["k", "n", "at"]), RecordLayout(key_column="k"), 0)
    assert [json.loads(v) for v in records.values] == [
        {"n": 1, "at": "2026-01-01T00:00:00.000000"},
        {"n": 2, "at": None},
        {"n": 3, "at": None},
    ]
    assert records.sizes[0].as_py() == len(records.values[0]) + 1


@settings(deadline=None)  # CPU-bound: a loaded 2-core machine is no reason to fail
@given(st.lists(st.binary(max_size=20), max_size=30), st.integers(0, 30))
def test_the_checksum_does_not_depend_on_how_an_epoch_is_split(
    values: list[bytes], cut: int
) -> None:
    table = pa.table({"v": pa.array(values, pa.binary())})
    layout = RecordLayout("v")
    whole = build_records(table.to_batches()[0] if values else _empty(), layout, 0).checksum
    first = table.slice(0, cut).combine_chunks().to_batches()
    second = table.slice(cut).combine_chunks().to_batches()
    running = 0
    for batch in [*first, *second]:
        running = build_records(batch, layout, running).checksum
    assert running == whole == zlib.crc32(b"".join(values))


def _empty() -> pa.RecordBatch:
    return pa.record_batch({"v": pa.array([], pa.binary())})


def test_the_checksum_of_a_sliced_string_column_covers_only_the_slice() -> None:
    batch = pa.record_batch({"v": pa.array(["skip", "keep", "also"])}).slice(1, 2)
    assert build_records(batch, RecordLayout("v"), 0).checksum == zlib.crc32(b"keepalso")


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        (RecordLayout("missing"), "value_column 'missing' is not a column"),
        (RecordLayout("n"), "value_column 'n' is int64; it must be string or binary"),
        (RecordLayout(key_column="n"), "key_column 'n' is int64"),
        (RecordLayout(timestamp_column="k"), "timestamp_column 'k' is string"),
        (RecordLayout(partition_column="k"), "partition_column 'k' is string"),
        (
            RecordLayout("v", "k", ("h",), "at", "p"),
            None,
        ),
    ],
)
def test_layout_problems_name_role_column_and_type(
    layout: RecordLayout, problem: str | None
) -> None:
    problems = layout.problems(BATCH.schema)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_a_layout_that_leaves_no_json_column_is_a_problem() -> None:
    schema = pa.schema([("k", pa.string())])
    assert RecordLayout(key_column="k").problems(schema) == ["no column is left for the JSON value"]


def test_progress_records_round_trip_and_refuse_garbage() -> None:
    record = ProgressRecord(3, 2, "ds:job:kafka:3:0:2-0", 10, "crc32:0000abcd", {"epoch": 3})
    assert ProgressRecord.decode(record.encode(), "t@1") == record
    assert decode_fence(encode_fence(7), "t@2") == 7
    for garbage in (b"{}", b"not json", json.dumps({"version": 1, "epoch": 1}).encode()):
        with pytest.raises(ManifestCorruptError, match="t@5"):
            ProgressRecord.decode(garbage, "t@5")
    with pytest.raises(StoredFormatError, match="t@5: Kafka progress record version 99"):
        ProgressRecord.decode(json.dumps({"version": 99, "epoch": 1}).encode(), "t@5")
    assert progress_key("job", "kafka") != progress_key("job", "kafka2")


def test_secrets_are_redacted_in_the_config_repr() -> None:
    config = Kafka(
        "b:9092",
        "events",
        producer_config={"sasl.password": "hunter2", "ssl.key.password": "k", "linger.ms": 5},
    )
    assert "hunter2" not in repr(config)
    assert redact(config.producer_config) == {
        "sasl.password": "***",
        "ssl.key.password": "***",
        "linger.ms": 5,
    }
    # Connection settings reach the admin and consumer clients; tuning does not.
    assert config.connection_settings() == {
        "bootstrap.servers": "b:9092",
        "reconnect.backoff.max.ms": 1000,
        "socket.keepalive.enable": True,
        "sasl.password": "hunter2",
        "ssl.key.password": "k",
    }


def test_every_client_tries_a_lost_broker_again_within_a_second_unless_told_otherwise() -> None:
    """librdkafka's own cap (10 s) left a broker back from a restart unused for seconds."""

    def producer_settings(config: Kafka) -> dict[str, Any]:
        log = JobLogger("job", "kafka", component="sinks.kafka")
        where: dict[str, Any] = {"job": "job", "sink": "kafka"}
        return TransactionalProducer(config, "t", lambda _: where, log).settings()

    config = Kafka("b:9092", "events")
    assert producer_settings(config)["reconnect.backoff.max.ms"] == 1000
    assert config.connection_settings()["reconnect.backoff.max.ms"] == 1000
    told = Kafka("b:9092", "events", producer_config={"reconnect.backoff.max.ms": 50})
    assert producer_settings(told)["reconnect.backoff.max.ms"] == 50
    assert told.connection_settings()["reconnect.backoff.max.ms"] == 50


def test_every_client_keeps_its_connections_alive_unless_told_otherwise() -> None:
    def producer_settings(config: Kafka) -> dict[str, Any]:
        log = JobLogger("job", "kafka", component="sinks.kafka")
        where: dict[str, Any] = {"job": "job", "sink": "kafka"}
        return TransactionalProducer(config, "t", lambda _: where, log).settings()

    config = Kafka("b:9092", "events")
    assert producer_settings(config)["socket.keepalive.enable"] is True
    assert config.connection_settings()["socket.keepalive.enable"] is True
    told = Kafka("b:9092", "events", producer_config={"socket.keepalive.enable": False})
    assert producer_settings(told)["socket.keepalive.enable"] is False
    assert told.connection_settings()["socket.keepalive.enable"] is False


def test_the_progress_topic_defaults_beside_the_topic_and_must_differ() -> None:
    assert Kafka("b:9092", "events").progress_topic_name == "events-ds-progress"
    with pytest.raises(ConfigError, match="must differ"):
        Kafka("b:9092", "events", progress_topic="events")


def test_json_values_are_iso_timestamps_and_valid_json() -> None:
    batch = pa.record_batch(
        {
            "utc": pa.array(
                [dt.datetime(2026, 1, 1, 12, 30, 5, 7, tzinfo=dt.timezone.utc), None],
                pa.timestamp("us", tz="UTC"),
            ),
            "day": pa.array([dt.date(2026, 2, 3), None], pa.date32()),
            "x": pa.array([1.25, 1.5]),
            "raw": pa.array([b"\x00\xff", None]),
            "amount": pa.array([decimal.Decimal("12.30"), None], pa.decimal128(5, 2)),
        }
    )
    records = build_records(batch, RecordLayout(), 0)
    assert [json.loads(v) for v in records.values] == [
        {
            "utc": "2026-01-01T12:30:05.000007+00:00",
            "day": "2026-02-03",
            "x": 1.25,
            "raw": "AP8=",
            "amount": "12.30",
        },
        {"utc": None, "day": None, "x": 1.5, "raw": None, "amount": None},
    ]


def test_non_finite_floats_keep_their_value_in_json() -> None:
    batch = pa.record_batch({"x": pa.array([float("inf"), float("-inf"), None, 2.0])})
    values = build_records(batch, RecordLayout(), 0).values
    assert values == [b'{"x":Infinity}', b'{"x":-Infinity}', b'{"x":null}', b'{"x":2.0}']
    assert [json.loads(v)["x"] for v in values] == [float("inf"), float("-inf"), None, 2.0]


def _reference_values(batch: pa.RecordBatch) -> list[bytes]:
    """The default value as orjson writes each row as a dict (the path before json_columns):
    what the column-wise builder must equal byte for byte."""
    import orjson

    from durable_sinks.sinks.kafka.records import _iso_strings, _json_default

    arrays = [_iso_strings(c) for c in batch.columns]
    rows = pa.RecordBatch.from_arrays(arrays, names=batch.schema.names).to_pylist()
    return [orjson.dumps(row, default=_json_default) for row in rows]


_FINITE = st.floats(allow_nan=False, allow_infinity=False)
# Arrow strings are UTF-8: no lone surrogates.
_UTF8 = st.characters(codec="utf-8")
_COLUMNS = {
    "i64": (st.integers(-(2**63), 2**63 - 1), pa.int64()),
    "i8": (st.integers(-128, 127), pa.int8()),
    "u64": (st.integers(0, 2**64 - 1), pa.uint64()),
    "f64": (_FINITE, pa.float64()),
    "f32": (st.floats(width=32, allow_nan=False, allow_infinity=False), pa.float32()),
    "flag": (st.booleans(), pa.bool_()),
    "text": (st.text(_UTF8), pa.string()),
    "plain": (
        st.text(st.characters(codec="utf-8", blacklist_characters='"\\', min_codepoint=32)),
        pa.string(),
    ),
    "big": (st.text(_UTF8, max_size=5), pa.large_string()),
    "raw": (st.binary(max_size=5), pa.binary()),
    "utc": (
        st.datetimes(timezones=st.just(dt.timezone.utc), min_value=dt.datetime(1, 1, 2)),
        pa.timestamp("us", tz="UTC"),
    ),
    "local": (
        st.datetimes(min_value=dt.datetime(1900, 1, 1)),
        pa.timestamp("ms", tz="Europe/Paris"),
    ),
    "day": (st.dates(), pa.date32()),
    "amount": (st.decimals(places=2, min_value=-999, max_value=999), pa.decimal128(5, 2)),
    "tags": (st.lists(st.text(_UTF8, max_size=3), max_size=3), pa.list_(pa.string())),
}


@st.composite
def json_batches(draw: st.DrawFn) -> pa.RecordBatch:
    names = draw(st.lists(st.sampled_from(sorted(_COLUMNS)), min_size=1, max_size=5, unique=True))
    rows = draw(st.integers(0, 6))
    columns = {}
    for name in names:
        values, kind = _COLUMNS[name]
        column = draw(st.lists(st.none() | values, min_size=rows, max_size=rows))
        columns[f'{name} "q"' if draw(st.booleans()) else name] = pa.array(column, kind)
    return pa.record_batch(columns)


@settings(deadline=None)
@given(json_batches())
def test_column_wise_json_values_equal_orjson_per_row(batch: pa.RecordBatch) -> None:
    records = build_records(batch, RecordLayout(), 5)
    expected = _reference_values(batch)
    assert records.values == expected
    assert records.sizes.to_pylist() == [len(v) for v in expected]
    assert records.checksum == zlib.crc32(b"".join(expected), 5)


def test_float_columns_keep_orjson_text_in_sliced_batches_and_beside_nulls() -> None:
    floats = [0.1, None, -0.0, 1e-07, 100.0, 1.5e300, 123456789.125, None]
    batch = pa.record_batch(
        {
            "x": pa.array(floats, pa.float64()),
            "y": pa.array([1.0, 2.5, 3.25, 0.0, -1.0, 7.0, 0.5, 8.0], pa.float32()),
            "z": pa.array([2.0**-1074, 0.3, 2.0, 9.5, 1e22, 5e-324, 1.0, 4.0]),
        }
    )
    for part in (batch, batch.slice(1, 5), batch.slice(5), batch.slice(2, 1)):
        expected = _reference_values(part)
        records = build_records(part, RecordLayout(), 0)
        assert records.values == expected
        assert records.checksum == zlib.crc32(b"".join(expected))
    first = build_records(batch.slice(3, 1), RecordLayout(), 0).values
    assert first == [b'{"x":1e-7,"y":0.0,"z":9.5}']
