"""The broker is a real Kafka: transactions commit and abort, read_committed hides aborted
records, and a second producer with the same transactional.id fences the first."""

from __future__ import annotations

import base64
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint
from tests.services import kafka as kafka_service


def _producer(kafka: KafkaEndpoint, transactional_id: str) -> Producer:
    producer = Producer(
        kafka.config({"transactional.id": transactional_id, "transaction.timeout.ms": 30000})
    )
    producer.init_transactions(30)
    return producer


def _read_all(kafka: KafkaEndpoint, topic: str, isolation: str) -> list[bytes]:
    """Every record of partition 0 visible under `isolation`, read up to the end."""
    consumer = Consumer(
        kafka.config(
            {
                "group.id": f"reader-{topic}-{isolation}",
                "isolation.level": isolation,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
    )
    try:
        partition = TopicPartition(topic, 0, 0)
        _, high = consumer.get_watermark_offsets(partition, timeout=10, cached=False)
        consumer.assign([partition])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while consumer.position([partition])[0].offset < high:
            assert time.monotonic() < deadline, f"did not reach offset {high} of {topic}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            value = message.value()
            assert value is not None
            values.append(value)
        return values
    finally:
        consumer.close()


def test_read_committed_sees_committed_transactions_only(
    kafka: KafkaEndpoint, kafka_topic: str, unique: UniqueNames
) -> None:
    producer = _producer(kafka, unique.name("txn"))
    producer.begin_transaction()
    for i in range(3):
        producer.produce(kafka_topic, value=f"committed-{i}".encode())
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(2):
        producer.produce(kafka_topic, value=f"aborted-{i}".encode())
    producer.flush(30)  # the aborted records really are in the log, not just in a buffer
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(kafka_topic, value=b"committed-after-abort")
    producer.commit_transaction(30)

    committed = [b"committed-0", b"committed-1", b"committed-2", b"committed-after-abort"]
    assert _read_all(kafka, kafka_topic, "read_committed") == committed
    assert sorted(_read_all(kafka, kafka_topic, "read_uncommitted")) == sorted(
        [*committed, b"aborted-0", b"aborted-1"]
    )


def test_same_transactional_id_fences_the_older_producer(
    kafka: KafkaEndpoint, kafka_topic: str, unique: UniqueNames
) -> None:
    transactional_id = unique.name("txn")
    zombie = _producer(kafka, transactional_id)
    zombie.begin_transaction()
    zombie.produce(kafka_topic, value=b"from-zombie")
    zombie.flush(30)

    successor = _producer(kafka, transactional_id)  # aborts the zombie's open transaction
    successor.begin_transaction()
    successor.produce(kafka_topic, value=b"from-successor")
    successor.commit_transaction(30)

    zombie.produce(kafka_topic, value=b"zombie-again")  # only queued: no broker round trip
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(30)
    error = raised.value.args[0]
    assert error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), error
    assert _read_all(kafka, kafka_topic, "read_committed") == [b"from-successor"]


def test_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-storage took a cluster id starting with '-' for an option (one start in 64 failed)."""
    leading_dash = uuid.UUID(bytes=bytes([0xF8]) + bytes(15))
    plain = uuid.UUID(bytes=bytes(16))
    draws = iter([leading_dash, leading_dash, plain])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    assert base64.urlsafe_b64encode(leading_dash.bytes).decode().startswith("-")
    assert kafka_service.new_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"
