"""What a Kafka topic shows its readers, read as an outside client would: a read_committed
consumer up to the last stable offsets, and the transactions left open."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, IsolationLevel, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator
from durable_sinks.sinks.kafka.admin import list_offsets
from tests.services import KafkaEndpoint
from tests.support import targets


def partitions_of(admin: AdminClient, topic: str) -> list[TopicPartition]:
    count = len(admin.list_topics(topic, timeout=20).topics[topic].partitions)
    return [TopicPartition(topic, p) for p in range(count)]


def read_committed(kafka: KafkaEndpoint, admin: AdminClient, topic: str) -> list[Message]:
    """Every record a read_committed consumer sees, up to the last stable offsets."""
    partitions = partitions_of(admin, topic)
    stable = list_offsets(admin, partitions, IsolationLevel.READ_COMMITTED, 20)
    consumer = Consumer(
        kafka.config(
            {
                "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
    )
    consumer.assign([TopicPartition(topic, p.partition, 0) for p in partitions])
    messages: list[Message] = []
    deadline = time.monotonic() + 20
    try:
        while True:
            positions = consumer.position(partitions)
            if all(
                max(p.offset, 0) >= stable[tp] for p, tp in zip(positions, partitions, strict=True)
            ):
                return messages
            assert time.monotonic() < deadline, f"reader stuck at {positions}, LSO {stable}"
            for message in consumer.consume(500, timeout=0.1):
                assert message.error() is None, message.error()
                messages.append(message)
    finally:
        consumer.close()


def open_transactions(admin: AdminClient, *topics: str, grace: float = 5.0) -> list[str]:
    """Partitions of `topics` with a transaction left open (see targets.open_transactions)."""
    partitions = [p for t in topics for p in partitions_of(admin, t)]
    return targets.open_transactions(admin, partitions, grace)


def assert_nothing_visible(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, coordinator: Coordinator
) -> None:
    """A refused epoch left nothing: no record a reader sees, no transaction open, no epoch
    committed."""
    assert read_committed(kafka, admin, topic) == []
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []
    assert coordinator.sinks[0].last_committed_epoch() is None
