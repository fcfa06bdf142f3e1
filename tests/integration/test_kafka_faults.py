"""The Kafka sink rides through faults against the test bed's real broker: every failure
comes out typed and classified for the writer's ride-through (retriable: TransientError,
InDoubtError; not: FencedError, ConfigError), and librdkafka's own logging is rate-limited.

Measured here (librdkafka 2.16, Kafka 4): a transaction the broker times out (open longer than
transaction.timeout.ms; the broker looks every 10 s) is aborted and the producer epoch bumped;
the old producer's next EndTxn or Produce is answered INVALID_PRODUCER_EPOCH, which librdkafka
reports as fatal `_FENCED` (-144), exactly as for a newer producer's init_transactions. The
sink tells them apart (the transaction's age, the fence record) and raises a TransientError
for the time-out, a FencedError for a real fence.

The shared broker is never stopped: faults are made by stalling an epoch, deleting a topic
mid-transaction, or pointing a sink at a port where nothing listens."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core import OpenContext, SinkConnector
from durable_sinks.core.errors import (
    FencedError,
    InDoubtError,
    TransientError,
    UnreachableError,
)
from durable_sinks.manifest import DecisionStore, LocalDirectoryStore
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.conftest import UniqueNames
from tests.integration.test_kafka_sink import events, ids, pg_ids
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.kafka_reads import open_transactions, read_committed
from tests.support.targets import create_topic, delete_with_progress, prepared_gids

#: The broker aborts a transaction open longer than this (the test's own, short).
TIMEOUT_S = 3.0


@pytest.fixture
def topic(admin: AdminClient, unique: UniqueNames) -> Iterator[str]:
    name = unique.name("topic")
    create_topic(admin, name, 1)
    yield name
    delete_with_progress(admin, name)


def kafka_sink(kafka: KafkaEndpoint, topic: str, **options: Any) -> KafkaSink:
    options.setdefault("transaction_timeout_s", TIMEOUT_S)
    options.setdefault("request_timeout_s", 20)
    return KafkaSink(Kafka(kafka.bootstrap_servers, topic, key_column="id", **options))


def coordinator(
    job_id: str,
    sinks: list[SinkConnector],
    store: DecisionStore,
    on_step: Callable[[str], None] | None = None,
) -> Coordinator:
    made = Coordinator(job_id, sinks, store, on_step=on_step)
    made.start()
    return made


def stall_at(step: str, until: Callable[[], bool]) -> Callable[[str], None]:
    """An on_step that, at `step`, waits until `until()` holds (at most 30 s)."""

    def on_step(name: str) -> None:
        if name != step:
            return
        deadline = time.monotonic() + 30
        while not until():
            assert time.monotonic() < deadline, f"stalled at {step} for 30 s"
            time.sleep(0.2)

    return on_step


def broker_aborted(admin: AdminClient, topic: str, since: float) -> Callable[[], bool]:
    """True once the transaction is older than TIMEOUT_S and the broker aborted it (the
    partition's last stable offset caught up with its end)."""

    def aborted() -> bool:
        old_enough = time.monotonic() - since > TIMEOUT_S
        return old_enough and open_transactions(admin, topic, grace=0) == []

    return aborted


# -- the broker times a transaction out ------------------------------------------------------------
def test_a_transaction_the_broker_timed_out_is_retriable_and_replayed_exactly_once(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    topic: str,
    pg_table: str,
    pg_schema: str,
    unique: UniqueNames,
) -> None:
    """Kafka the last resource beside Postgres, decisions in Postgres: the batch stalls
    between its write and the commit point for longer than transaction.timeout.ms; the
    broker aborts the transaction; the commit point raises a retriable TransientError (not
    FencedError), nothing is visible anywhere, and a new coordinator (what the writer's
    ride-through builds) writes the epoch again exactly once."""

    def sinks() -> list[SinkConnector]:
        return [
            PostgresSink(Postgres(postgres.conninfo(), pg_table)),
            kafka_sink(kafka, topic),
        ]

    def store() -> PostgresDecisionStore:
        return PostgresDecisionStore(postgres.conninfo(), schema=pg_schema)

    began = time.monotonic()
    stalled = coordinator(
        unique.job_id,
        sinks(),
        store(),
        stall_at("after-write:0:kafka", broker_aborted(admin, topic, began)),
    )
    with pytest.raises(TransientError, match=r"open longer than transaction\.timeout\.ms") as hit:
        stalled.run_epoch(0, [events([1, 2, 3])])
    assert type(hit.value) is TransientError
    assert hit.value.retriable
    assert "transaction_timeout_s" in (hit.value.fix or "")
    assert read_committed(kafka, admin, topic) == []
    assert pg_ids(conn, pg_table) == []
    assert prepared_gids(conn, unique.job_id, "postgres") == []  # rolled back
    stalled.close()

    replay = coordinator(unique.job_id, sinks(), store())
    assert replay.run_epoch(0, [events([1, 2, 3])]).outcome is EpochOutcome.COMMITTED
    assert ids(read_committed(kafka, admin, topic)) == [1, 2, 3]
    assert pg_ids(conn, pg_table) == [1, 2, 3]
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []
    replay.close()


def test_a_timed_out_transaction_is_written_again_by_the_same_coordinator(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    """Stalled after pre_commit (every record acknowledged): the commit point raises
    TransientError; replaying the epoch on the same coordinator replaces the producer."""
    began = time.monotonic()
    stalled = coordinator(
        unique.job_id,
        [kafka_sink(kafka, topic)],
        LocalDirectoryStore(tmp_path),
        stall_at("after-pre-commit:kafka", broker_aborted(admin, topic, began)),
    )
    with pytest.raises(TransientError, match=r"transaction\.timeout\.ms"):
        stalled.run_epoch(0, [events([1, 2])])
    assert read_committed(kafka, admin, topic) == []
    stalled.on_step = None
    assert stalled.run_epoch(0, [events([1, 2])]).outcome is EpochOutcome.COMMITTED
    assert ids(read_committed(kafka, admin, topic)) == [1, 2]
    stalled.close()


def test_an_older_coordinator_is_fenced_even_when_its_transaction_is_old(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    """A newer generation opens while the older one's transaction is older than
    transaction.timeout.ms: the same `_FENCED` as a time-out, but the fence record names the
    newer generation, so the older coordinator gets FencedError (it must stop)."""
    newer: list[Coordinator] = []

    def take_over(step: str) -> None:
        if step == "after-write:0:kafka":
            store = LocalDirectoryStore(tmp_path)
            newer.append(coordinator(unique.job_id, [kafka_sink(kafka, topic)], store))
            newer[0].run_epoch(0, [events([10])])
            time.sleep(TIMEOUT_S + 0.2)

    store = LocalDirectoryStore(tmp_path)
    older = coordinator(unique.job_id, [kafka_sink(kafka, topic)], store, take_over)
    # librdkafka reports the fence either as _FENCED on the flush or as a failed call with
    # no error left behind; the sink tells both from a time-out by the fence record
    with pytest.raises(FencedError, match=r"a newer (producer|generation)") as hit:
        older.run_epoch(0, [events([1, 2])])
    assert not hit.value.retriable
    assert ids(read_committed(kafka, admin, topic)) == [10]
    newer[0].run_epoch(1, [events([11])])
    assert ids(read_committed(kafka, admin, topic)) == [10, 11]
    for made in (older, newer[0]):
        made.close()


# -- a commit whose answer is lost ---------------------------------------------------------------
class AnswerLost:
    """The real producer, but its first commit_transaction takes effect on the broker and
    then, before its caller hears of it, `meanwhile()` runs and the call raises what
    librdkafka raises when its retry of a delivered EndTxn is fenced: `_FENCED`, fatal."""

    def __init__(self, real: Any, meanwhile: Callable[[], None]) -> None:
        self.real, self.meanwhile, self.lost = real, meanwhile, False

    def commit_transaction(self, *args: Any) -> None:
        if self.lost:
            self.real.commit_transaction(*args)
            return
        self.lost = True
        self.real.commit_transaction(*args)  # committed on the broker
        self.meanwhile()
        raise KafkaException(KafkaError(KafkaError._FENCED, "retry of EndTxn fenced", fatal=True))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_fenced_commit_that_took_effect_is_finished_not_rolled_back(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    topic: str,
    pg_table: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    """Kafka the last resource beside Postgres. Driver A's EndTxn commits the epoch (Kafka's
    commit carries the decision), its answer is lost, a successor B starts meanwhile (its
    Kafka producer's init fences A) and A's retry is fenced. The fence says nothing of A's
    commit: A must not roll its prepared Postgres transaction back (it would leave the epoch
    in Kafka only); it raises InDoubtError and touches nothing more, and B's recovery reads
    the decision from the progress topic and commits Postgres. Every row once in both."""

    def sinks(kafka_first: bool) -> list[SinkConnector]:
        made: list[SinkConnector] = [
            PostgresSink(Postgres(postgres.conninfo(), pg_table)),
            kafka_sink(kafka, topic),
        ]
        return made[::-1] if kafka_first else made

    store = LocalDirectoryStore(tmp_path)
    zombie = coordinator(unique.job_id, sinks(False), store)
    successor = Coordinator(unique.job_id, sinks(True), LocalDirectoryStore(tmp_path))
    starting = successor.start_steps()

    def successor_fences() -> None:
        # B claims its generation and opens Kafka (init_transactions fences A's producer);
        # its Postgres sink is not open yet, so A's sessions are still alive.
        for step in starting:
            if step == "recovery:after-open:kafka":
                return
        raise AssertionError("the successor never opened its Kafka sink")

    kafka_part = next(s for s in zombie.sinks if isinstance(s, KafkaSink))
    producer = kafka_part._state().producer
    producer._producer = AnswerLost(producer._producer, successor_fences)  # type: ignore[assignment]

    with pytest.raises(InDoubtError, match="commit_transaction was fenced") as hit:
        zombie.run_epoch(0, [events([1, 2, 3])])
    assert "progress topic" in (hit.value.fix or "")
    assert ids(read_committed(kafka, admin, topic)) == [1, 2, 3]  # A's commit landed
    assert len(prepared_gids(conn, unique.job_id, "postgres")) == 1  # A left it prepared

    for _ in starting:  # B opens Postgres and recovers: the progress topic holds the decision
        pass
    assert pg_ids(conn, pg_table) == [1, 2, 3]
    assert prepared_gids(conn, unique.job_id, "postgres") == []
    assert successor.run_epoch(0, [events([1, 2, 3])]).outcome is EpochOutcome.ALREADY_COMMITTED
    successor.run_epoch(1, [events([4])])
    assert ids(read_committed(kafka, admin, topic)) == [1, 2, 3, 4]
    assert pg_ids(conn, pg_table) == [1, 2, 3, 4]
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []
    for made in (zombie, successor):
        made.close()


# -- typed errors at pre_commit and at the commit point -------------------------------------------
def test_a_progress_topic_deleted_mid_transaction_aborts_the_epoch(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    """The progress record cannot be delivered (its topic is gone): its flush, before the
    commit request, fails (_MSG_TIMED_OUT after the records' time-out, which is
    transaction.timeout.ms, or an abortable _INCONSISTENT / _TIMED_OUT); the sink aborts:
    TransientError before the commit point, nothing visible. The
    replay's open creates the progress topic again and the epoch lands once.

    When the broker has timed the transaction out first (its check runs on its own timer),
    the abort fails fenced, and the sink reads the fence record to tell a time-out from a
    newer owner: from a deleted progress topic that read fails after request_timeout_s (a
    topic's absence looks like a new topic's metadata lag; it waited progress_scan_timeout_s,
    60 s, before), hence a short one here."""
    progress = f"{topic}-ds-progress"

    def delete_progress(step: str) -> None:
        if step == "after-pre-commit:kafka":
            delete_for_good(admin, progress)

    store = LocalDirectoryStore(tmp_path)
    sink = kafka_sink(kafka, topic, request_timeout_s=5)
    broken = coordinator(unique.job_id, [sink], store, delete_progress)
    started = time.monotonic()
    with pytest.raises(TransientError, match=r"had to be aborted|delivering records") as hit:
        broken.run_epoch(0, [events([1, 2])])
    assert type(hit.value) is TransientError
    assert time.monotonic() - started < 15
    assert read_committed(kafka, admin, topic) == []
    broken.close()

    replay = coordinator(unique.job_id, [kafka_sink(kafka, topic)], LocalDirectoryStore(tmp_path))
    assert replay.run_epoch(0, [events([1, 2])]).outcome is EpochOutcome.COMMITTED
    assert ids(read_committed(kafka, admin, topic)) == [1, 2]
    replay.close()


def test_a_topic_deleted_before_the_commit_point_is_a_typed_error(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    """Before: reading the topic's offsets right before the commit raised a raw
    KafkaException. Now a TransientError before the commit point: rolled back."""

    def delete_topic(step: str) -> None:
        if step == "after-pre-commit:kafka":
            delete_for_good(admin, topic)

    sink = kafka_sink(kafka, topic, request_timeout_s=2)
    broken = coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path), delete_topic)
    with pytest.raises(TransientError, match="offsets") as hit:
        broken.run_epoch(0, [events([1])])
    assert type(hit.value) is TransientError
    assert sink.last_committed_epoch() is None
    broken.close()


def delete_for_good(admin: AdminClient, topic: str) -> None:
    """Delete `topic` and wait until the broker no longer serves it. The controller answers
    before the broker drops the partition, and the broker drops it from its metadata (what
    list_topics reads) before its replica manager stops serving it (reads of offsets,
    produce requests: Kafka's BrokerMetadataPublisher applies the two in that order). On a
    loaded machine the sink still read the deleted topic's offsets or wrote to it, and the
    epoch committed; the deletion is complete once the broker refuses a read of offsets."""
    for future in admin.delete_topics([topic], request_timeout=30).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while offsets_served(admin, topic):
        assert time.monotonic() < deadline, f"{topic} still served 30 s after deletion"
        time.sleep(0.1)


def offsets_served(admin: AdminClient, topic: str) -> bool:
    """Whether the broker may still answer the end offset of the topic's partition 0: false
    once it answers that the partition does not exist (any other failure says nothing)."""
    spec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    futures = admin.list_offsets({TopicPartition(topic, 0): spec}, request_timeout=5)
    try:
        for future in futures.values():
            future.result()
    except KafkaException as exc:
        code = exc.args[0].code() if exc.args else None
        return code not in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._NOENT)
    return True


# -- librdkafka's logs ---------------------------------------------------------------------------
def test_an_unreachable_cluster_logs_a_handful_of_lines_and_nothing_on_stderr(
    unique: UniqueNames, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    caplog.set_level(logging.DEBUG, logger="durable_sinks.sinks.kafka.client")
    sink = KafkaSink(Kafka(f"127.0.0.1:{port}", "events", request_timeout_s=5))
    started = time.monotonic()
    with pytest.raises(UnreachableError) as hit:
        sink.open(OpenContext(unique.job_id, "kafka", 1))
    assert 4 < time.monotonic() - started < 15
    assert hit.value.retriable
    lines = [r for r in caplog.records if r.name == "durable_sinks.sinks.kafka.client"]
    warnings = [r for r in lines if r.levelno >= logging.WARNING]
    assert 1 <= len(warnings) <= 8, [r.getMessage() for r in warnings]
    assert any("repeated" in r.getMessage() for r in warnings)
    assert all(f"job={unique.job_id} sink=kafka" in r.getMessage() for r in lines)
    err = capfd.readouterr().err
    assert "rdkafka" not in err, err[:2000]
