"""Kafka alone with no decision store, against the test bed's real Kafka: generations claimed
in the progress topic (concurrent claims never share one; a job that had a store of its own
goes on above its generations), decisions read back from the progress records, and a zombie
driver fenced by a newer driver's claim, both in the middle of an epoch and when it opens
the sink again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core import OpenContext
from durable_sinks.core.errors import DurableSinkError, FencedError
from durable_sinks.manifest import HostedDecisionStore, LocalDirectoryStore
from durable_sinks.sinks.kafka import Kafka, KafkaDecisionHost, KafkaSink
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint
from tests.support.targets import create_topic, delete_with_progress


@pytest.fixture
def topic(admin: AdminClient, unique: UniqueNames) -> Iterator[str]:
    name = unique.name("topic")
    create_topic(admin, name, 1)
    yield name
    delete_with_progress(admin, name)


def config(kafka: KafkaEndpoint, topic: str) -> Kafka:
    return Kafka(kafka.bootstrap_servers, topic, key_column="id", request_timeout_s=20)


def lone(kafka: KafkaEndpoint, topic: str, job_id: str) -> Coordinator:
    sink = KafkaSink(config(kafka, topic))
    return Coordinator(job_id, [sink], HostedDecisionStore(sink.decision_host()))


def events(*ids: int) -> pa.RecordBatch:
    return pa.record_batch({"id": [str(i) for i in ids], "n": list(ids)})


def committed_ids(kafka: KafkaEndpoint, topic: str) -> list[int]:
    consumer = Consumer(
        kafka.config(
            {"group.id": "host-check", "isolation.level": "read_committed", "enable.auto.commit": 0}
        )
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=20)
        consumer.assign([TopicPartition(topic, 0, low)])
        ids: list[int] = []
        while consumer.position([TopicPartition(topic, 0)])[0].offset < high:
            for message in consumer.consume(100, timeout=1):
                key = message.key()
                if message.error() is None and key is not None:
                    ids.append(int(key))
        return sorted(ids)
    finally:
        consumer.close()


def test_concurrent_claims_never_share_a_generation(
    kafka: KafkaEndpoint, topic: str, job_id: str
) -> None:
    claimed: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def claim_twice() -> None:
        host = KafkaDecisionHost(config(kafka, topic))
        try:
            start.wait()
            for _ in range(2):
                claimed.append(host.claim_generation(job_id))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            host.close()

    threads = [threading.Thread(target=claim_twice) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert errors == []
    assert sorted(claimed) == list(range(1, 7)), claimed
    reader = KafkaDecisionHost(config(kafka, topic))
    assert reader.newest_generation(job_id) == 6
    reader.close()


def test_decisions_are_read_back_from_the_progress_records(
    kafka: KafkaEndpoint, topic: str, job_id: str, tmp_path: Path
) -> None:
    # Three drivers with a decision store of their own fenced the sink up to generation 3.
    for _ in range(3):
        before = Coordinator(
            job_id, [KafkaSink(config(kafka, topic))], LocalDirectoryStore(tmp_path)
        )
        before.start()
        before.close()
    coordinator = lone(kafka, topic, job_id)
    assert coordinator.start().generation == 4  # above the fence, never below it
    decided = [coordinator.run_epoch(e, [events(e)]).decision for e in range(2)]
    coordinator.close()

    reader = HostedDecisionStore(KafkaDecisionHost(config(kafka, topic)))
    assert reader.peek(job_id, 0) == decided[0]
    assert reader.peek(job_id, 1) == decided[1]
    assert reader.peek(job_id, 2) is None
    assert reader.peek_latest(job_id) == 1
    assert reader.peek_generation(job_id) == 4
    assert reader.peek_latest("another-job") is None
    reader.close()

    again = lone(kafka, topic, job_id)
    assert again.start().generation == 5
    assert again.run_epoch(1, [events(1)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert again.run_epoch(2, [events(2)]).outcome is EpochOutcome.COMMITTED
    again.close()
    assert committed_ids(kafka, topic) == [0, 1, 2]


def test_a_zombie_driver_is_fenced_by_a_newer_claim(
    kafka: KafkaEndpoint, topic: str, job_id: str
) -> None:
    zombie = lone(kafka, topic, job_id)
    zombie.start()
    zombie.run_epoch(0, [events(0)])
    steps = zombie.epoch_steps(1, [events(100)])
    while next(steps) != "after-pre-commit:kafka":
        pass  # the zombie's epoch is prepared; its driver stalls here

    claimer = KafkaDecisionHost(config(kafka, topic))
    assert claimer.claim_generation(job_id) == 2  # the claim alone fences the zombie
    claimer.close()
    with pytest.raises(FencedError):
        for _ in steps:
            pass
    newer = lone(kafka, topic, job_id)
    assert newer.start().generation == 3
    assert newer.run_epoch(1, [events(1)]).outcome is EpochOutcome.COMMITTED

    # The zombie's sink opened again (a producer replaced after an error) refuses to start.
    stale = KafkaSink(config(kafka, topic))
    with pytest.raises(FencedError, match="generation 3 of this job already opened"):
        stale.open(OpenContext(job_id, stale.name, 1))
    stale.close()
    with pytest.raises(DurableSinkError):
        zombie.run_epoch(2, [events(200)])
    newer.close()
    zombie.close()
    assert committed_ids(kafka, topic) == [0, 1]
