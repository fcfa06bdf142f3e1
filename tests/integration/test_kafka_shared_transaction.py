"""Two Kafka sinks of one job on the test bed's cluster, with Postgres: one producer and one
Kafka transaction per epoch carry both topics and both progress records; the first Kafka
sink's commit is the decision. A crash before it leaves nothing visible in either topic, a
crash after it is finished from the progress records, a zombie driver is fenced on both, and
sinks whose producer settings differ are refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core import SinkConnector
from durable_sinks.core.errors import ConfigError, FencedError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.kafka.operations import holdings
from durable_sinks.sinks.kafka.progress import progress_key, transactional_id
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.conftest import UniqueNames
from tests.integration.test_kafka_sink import pg_ids
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.coordinators import run_until, started
from tests.support.kafka_reads import open_transactions, read_committed
from tests.support.targets import create_topic, delete_with_progress, prepared_gids


@pytest.fixture
def audit(admin: AdminClient, unique: UniqueNames) -> Iterator[str]:
    """A second fresh topic, deleted with its progress topic after the test."""
    name = unique.name("audit")
    create_topic(admin, name, 1)
    yield name
    delete_with_progress(admin, name)


def events(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array([str(i) for i in ids]),
            "n": pa.array(ids, pa.int64()),
            "text": ["x"] * len(ids),
        }
    )


def job(
    kafka: KafkaEndpoint,
    postgres: PostgresEndpoint,
    topics: tuple[str, str],
    table: str,
    unique: UniqueNames,
    tmp_path: Any,
    **audit_options: Any,
) -> Coordinator:
    sinks: list[SinkConnector] = [
        PostgresSink(Postgres(postgres.conninfo(), table)),
        KafkaSink(Kafka(kafka.bootstrap_servers, topics[0], key_column="id", request_timeout_s=20)),
        KafkaSink(
            Kafka(
                kafka.bootstrap_servers,
                topics[1],
                name="audit",
                value_column="text",
                request_timeout_s=20,
                **audit_options,
            )
        ),
    ]
    return started(Coordinator(unique.job_id, sinks, LocalDirectoryStore(tmp_path)))


def numbers(kafka: KafkaEndpoint, admin: AdminClient, topic: str) -> list[int]:
    return sorted(json.loads(m.value() or b"")["n"] for m in read_committed(kafka, admin, topic))


def count(kafka: KafkaEndpoint, admin: AdminClient, topic: str) -> int:
    return len(read_committed(kafka, admin, topic))


def test_two_kafka_sinks_and_postgres_commit_each_epoch_at_once(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    topic: str,
    audit: str,
    pg_table: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    coordinator = job(kafka, postgres, (topic, audit), pg_table, unique, tmp_path)
    try:
        sinks = {s.name: s for s in coordinator.sinks}
        first, second = sinks["kafka"], sinks["audit"]
        assert isinstance(first, KafkaSink)
        assert isinstance(second, KafkaSink)
        assert first.transactional_id == second.transactional_id
        assert first.transactional_id == transactional_id(unique.job_id, "kafka")
        coordinator.run_epoch(0, [events([1, 2])])
        coordinator.run_epoch(1, [events([3])])
        assert numbers(kafka, admin, topic) == [1, 2, 3]
        assert count(kafka, admin, audit) == 3
        assert pg_ids(conn, pg_table) == [1, 2, 3]
        assert (first.last_committed_epoch(), second.last_committed_epoch()) == (1, 1)
        for name, sink_topic in (("kafka", topic), ("audit", audit)):
            held = holdings(
                {"bootstrap.servers": kafka.bootstrap_servers},
                admin,
                sink_topic,
                f"{sink_topic}-ds-progress",
                progress_key(unique.job_id, name),
                False,
                0,
                1,
                20,
            )
            assert {e: (h.rows, h.counted) for e, h in held.items()} == {
                0: (2, True),
                1: (1, True),
            }, name
        # the decision rides in the first Kafka sink's progress record only
        decisions = [
            json.loads(m.value() or b"{}").get("decision")
            for topic_name in (f"{topic}-ds-progress", f"{audit}-ds-progress")
            for m in read_committed(kafka, admin, topic_name)
            if m.key()
            in (progress_key(unique.job_id, "kafka"), progress_key(unique.job_id, "audit"))
        ]
        assert sum(d is not None for d in decisions) == 2
        assert sum(d is None for d in decisions) == 2
        assert open_transactions(admin, topic, audit) == []
    finally:
        coordinator.close()


def test_a_crash_before_the_commit_leaves_nothing_in_either_topic(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    topic: str,
    audit: str,
    pg_table: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    crashed = job(kafka, postgres, (topic, audit), pg_table, unique, tmp_path)
    steps = crashed.epoch_steps(0, [events([1, 2])])
    run_until(steps, "after-pre-commit:kafka")  # every sink prepared, no decision
    recovered = job(kafka, postgres, (topic, audit), pg_table, unique, tmp_path)
    try:
        assert numbers(kafka, admin, topic) == []
        assert count(kafka, admin, audit) == 0
        assert prepared_gids(conn, unique.job_id, "postgres") == []
        assert recovered.run_epoch(0, [events([1, 2])]).outcome is EpochOutcome.COMMITTED
        assert numbers(kafka, admin, topic) == [1, 2]
        assert count(kafka, admin, audit) == 2
        assert pg_ids(conn, pg_table) == [1, 2]
    finally:
        for coordinator in (crashed, recovered):
            coordinator.close()


def test_a_crash_after_the_commit_is_finished_and_both_topics_hold_the_epoch_once(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    topic: str,
    audit: str,
    pg_table: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    crashed = job(kafka, postgres, (topic, audit), pg_table, unique, tmp_path)
    crashed.run_epoch(0, [events([1])])
    steps = crashed.epoch_steps(1, [events([2, 3])])
    run_until(steps, "after-decision")  # both topics committed; Postgres still prepared
    assert numbers(kafka, admin, topic) == [1, 2, 3]
    assert count(kafka, admin, audit) == 3
    recovered = job(kafka, postgres, (topic, audit), pg_table, unique, tmp_path)
    try:
        assert pg_ids(conn, pg_table) == [1, 2, 3]
        replay = recovered.run_epoch(1, [events([2, 3])])
        assert replay.outcome is EpochOutcome.ALREADY_COMMITTED
        recovered.run_epoch(2, [events([4])])
        assert numbers(kafka, admin, topic) == [1, 2, 3, 4]
        assert count(kafka, admin, audit) == 4
        assert pg_ids(conn, pg_table) == [1, 2, 3, 4]
    finally:
        for coordinator in (crashed, recovered):
            coordinator.close()


def test_a_zombie_driver_is_fenced_on_both_topics(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    topic: str,
    audit: str,
    pg_table: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    old = job(kafka, postgres, (topic, audit), pg_table, unique, tmp_path)
    stalled = old.epoch_steps(0, [events([100, 101])])
    run_until(stalled, "after-pre-commit:kafka")
    new = job(kafka, postgres, (topic, audit), pg_table, unique, tmp_path)
    try:
        new.run_epoch(0, [events([1])])
        with pytest.raises(FencedError):
            for _ in stalled:
                pass
        assert numbers(kafka, admin, topic) == [1]
        assert count(kafka, admin, audit) == 1
        assert pg_ids(conn, pg_table) == [1]
        assert open_transactions(admin, topic, audit) == []
    finally:
        for coordinator in (old, new):
            coordinator.close()


def test_kafka_sinks_sharing_a_transaction_with_other_producer_settings_are_refused(
    kafka: KafkaEndpoint,
    postgres: PostgresEndpoint,
    topic: str,
    audit: str,
    pg_table: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    with pytest.raises(ConfigError, match="share one transaction") as raised:
        job(
            kafka,
            postgres,
            (topic, audit),
            pg_table,
            unique,
            tmp_path,
            producer_config={"linger.ms": 5},
        )
    assert raised.value.sink == "audit"
    assert "the same producer_config" in (raised.value.fix or "")
