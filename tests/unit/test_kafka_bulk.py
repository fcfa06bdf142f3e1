"""librdkafka's batch call on a confluent-kafka producer (sinks/kafka/bulk.py), on a real
client with no broker: records stay in its queue, where they are counted."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from durable_sinks.sinks.kafka.bulk import BulkProducer, _spans, bulk_capable

#: A client that contacts nobody (no bootstrap.servers): what it is given stays queued.
OFFLINE = {"log_level": 0}


@pytest.fixture
def producer() -> Iterator[Producer]:
    client = Producer({**OFFLINE, "queue.buffering.max.messages": 100})
    yield client
    client.purge()
    client.close()


class QueueStayedFullError(Exception):
    pass


def stayed_full() -> None:
    raise QueueStayedFullError


def test_only_the_producer_whose_client_it_finds_gets_a_bulk_producer(producer: Producer) -> None:
    assert BulkProducer.of(producer) is not None
    closed = Producer(OFFLINE)
    closed.close()
    assert BulkProducer.of(closed) is None  # its client is gone: nothing to call


def test_every_record_is_queued_once(producer: Producer) -> None:
    bulk = BulkProducer.of(producer)
    assert bulk is not None
    values = pa.array(["a", None, "ccc", ""]).slice(1)
    bulk.send(
        "t", values, pa.array([b"k", None, b"z", None]).slice(1), wait_s=0, on_full=stayed_full
    )
    assert len(producer) == 3


def test_a_queue_that_stays_full_is_reported_after_a_wait_and_nothing_is_queued_twice(
    producer: Producer,
) -> None:
    bulk = BulkProducer.of(producer)
    assert bulk is not None
    with pytest.raises(QueueStayedFullError):
        bulk.send("t", pa.array([b"x"] * 250), None, wait_s=0.01, on_full=stayed_full)
    assert len(producer) == 100  # the queue's limit: the first 100, each once


def test_a_record_the_client_refuses_names_its_error_and_place() -> None:
    client = Producer({**OFFLINE, "message.max.bytes": 1000})
    try:
        bulk = BulkProducer.of(client)
        assert bulk is not None
        values = pa.array([b"small", b"x" * 5000, b"small"])
        with pytest.raises(KafkaException) as raised:
            bulk.send("t", values, None, wait_s=0, on_full=stayed_full)
        error = raised.value.args[0]
        assert error.code() == KafkaError.MSG_SIZE_TOO_LARGE
        assert "record 1 " in error.str()
    finally:
        client.purge()
        client.close()


@pytest.mark.parametrize("type_", [pa.binary(), pa.string(), pa.large_binary(), pa.large_string()])
def test_spans_point_at_each_element(type_: pa.DataType) -> None:
    values = ["", "a", None, "bcd", "é" * 3, None]
    array = pa.array(values, type_).slice(1, 4)
    assert bulk_capable(array)
    addresses, lengths = _spans(array)
    read = [
        ctypes.string_at(int(a), int(n)) if a else None
        for a, n in zip(addresses, lengths, strict=True)
    ]
    assert read == [None if v is None else v.encode() for v in values[1:5]]


def test_other_types_are_not_read_in_bulk() -> None:
    assert not bulk_capable(pa.array([1, 2]))
    assert not bulk_capable(pa.array(["a"], pa.string_view()))


def test_empty_values_are_empty_not_null() -> None:
    """A value of no bytes is an empty record, not a tombstone, even in an array with no
    data buffer at all."""
    array = pa.array(["", None, ""])
    addresses, lengths = _spans(array)
    assert [bool(a) for a in addresses] == [True, False, True]
    assert list(lengths) == [0, 0, 0]
