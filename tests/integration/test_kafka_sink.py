"""The Kafka sink against the test bed's real Kafka, read by read_committed consumers: record
layout, aborted epochs invisible, a zombie producer fenced, Kafka as the last resource with
Postgres (crash before and after the commit point), bad input refused before anything is
visible, bad configuration named at start, and secrets kept out of logs, errors and records."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from psycopg import sql

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core import OpenContext, SinkConnector
from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    SchemaMismatchError,
    TransientError,
)
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.kafka.bulk import BulkProducer
from durable_sinks.sinks.kafka.progress import FIRST_CHUNK, SCAN_CHUNK, ProgressReader
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.services.kafka import TRANSACTION_MAX_TIMEOUT_MS
from tests.support.coordinators import run_until
from tests.support.kafka_reads import open_transactions, partitions_of, read_committed
from tests.support.targets import create_topic, prepared_gids


def events(ids: list[int], *, size: int = 8) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array([str(i) for i in ids], pa.string()),
            "n": pa.array(ids, pa.int64()),
            "text": pa.array(["x" * size for _ in ids], pa.string()),
        }
    )


def config(kafka: KafkaEndpoint, topic: str, **options: Any) -> Kafka:
    options.setdefault("key_column", "id")
    return Kafka(kafka.bootstrap_servers, topic, request_timeout_s=20, **options)


#: The stream the tests' jobs write: a replay with other rows is then a replay, not a new
#: stream (tests/unit/test_stream_identity.py).
STREAM = "query-1"


def job(
    kafka: KafkaEndpoint, topic: str, unique: UniqueNames, tmp_path: Any, **options: Any
) -> Coordinator:
    coordinator = Coordinator(
        unique.job_id,
        [KafkaSink(config(kafka, topic, **options))],
        LocalDirectoryStore(tmp_path),
        source=STREAM,
    )
    coordinator.start()
    return coordinator


def ids(messages: list[Message]) -> list[int]:
    return sorted(json.loads(m.value() or b"")["n"] for m in messages)


# -- records --------------------------------------------------------------------------------------
def test_epochs_become_records_once(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    coordinator = job(kafka, topic, unique, tmp_path)
    first = coordinator.run_epoch(0, [events([1, 2]), events([3])])
    assert first.outcome is EpochOutcome.COMMITTED
    assert coordinator.run_epoch(0, [events([99])]).outcome is EpochOutcome.ALREADY_COMMITTED
    coordinator.run_epoch(1, [events([4])])
    coordinator.run_epoch(2, [])  # an empty epoch still records its progress
    messages = read_committed(kafka, admin, topic)
    assert ids(messages) == [1, 2, 3, 4]
    by_key = {(m.key() or b"").decode(): m for m in messages}
    assert json.loads(by_key["3"].value() or b"") == {"n": 3, "text": "x" * 8}
    assert by_key["3"].headers() is None  # the default: no epoch header (epoch_header=False)
    assert coordinator.sinks[0].last_committed_epoch() == 2
    coordinator.close()

    # A new coordinator reads the last committed epoch back from the progress topic.
    again = job(kafka, topic, unique, tmp_path)
    assert again.sinks[0].last_committed_epoch() == 2
    assert again.run_epoch(2, [events([5])]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []
    again.close()


def test_value_key_headers_timestamp_and_partition_columns(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    batch = pa.record_batch(
        {
            "payload": pa.array([b"\x00raw", None], pa.binary()),
            "k": pa.array(["a", "b"]),
            "trace": pa.array(["t1", None]),
            "at": pa.array([1_700_000_000_000, 1_700_000_000_500], pa.timestamp("ms")),
            "p": pa.array([1, 0], pa.int32()),
        }
    )
    coordinator = job(
        kafka,
        topic,
        unique,
        tmp_path,
        value_column="payload",
        key_column="k",
        header_columns=("trace",),
        timestamp_column="at",
        partition_column="p",
        epoch_header=True,
    )
    coordinator.run_epoch(7, [batch])
    messages = {(m.key() or b"").decode(): m for m in read_committed(kafka, admin, topic)}
    a, b = messages["a"], messages["b"]
    assert (a.value(), a.partition(), a.timestamp()[1]) == (b"\x00raw", 1, 1_700_000_000_000)
    assert (b.value(), b.partition(), b.timestamp()[1]) == (None, 0, 1_700_000_000_500)
    assert a.headers() == [("ds-epoch", b"7"), ("trace", b"t1")]
    assert b.headers() == [("ds-epoch", b"7"), ("trace", None)]
    coordinator.close()


def test_without_the_epoch_header_records_carry_only_their_own_headers(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    """epoch_header=False: the plain path (no header columns) sends no headers at all, the
    other path only the row's own; each epoch still lands once for read_committed readers,
    and a replay of a committed epoch adds nothing."""
    plain = job(kafka, topic, unique, tmp_path / "plain", epoch_header=False)
    plain.run_epoch(0, [events([1, 2]), events([3])])
    assert plain.run_epoch(0, [events([1, 2, 3])]).outcome is EpochOutcome.ALREADY_COMMITTED
    plain.close()
    with_trace = pa.record_batch({"id": ["9"], "trace": ["t9"], "n": [9]})
    traced = Coordinator(
        f"{unique.job_id}-traced",
        [KafkaSink(config(kafka, topic, epoch_header=False, header_columns=("trace",)))],
        LocalDirectoryStore(tmp_path / "traced"),
    )
    traced.start()
    traced.run_epoch(0, [with_trace])
    traced.close()
    messages = {(m.key() or b"").decode(): m for m in read_committed(kafka, admin, topic)}
    assert sorted(messages) == ["1", "2", "3", "9"]
    assert [messages[k].headers() for k in ("1", "2", "3")] == [None, None, None]
    assert json.loads(messages["3"].value() or b"") == {"n": 3, "text": "x" * 8}
    assert messages["9"].headers() == [("trace", b"t9")]


def test_a_rolled_back_epoch_stays_invisible(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames
) -> None:
    sink = KafkaSink(config(kafka, topic))
    sink.open(OpenContext(unique.job_id, "kafka", 1))
    sink.begin_epoch(0)
    sink.write_batch(events([1, 2, 3]))
    handle = sink.pre_commit(0)
    assert open_transactions(admin, topic, grace=0) != []  # acknowledged, not committed
    sink.rollback_epoch(0, handle)
    sink.rollback_epoch(0, handle)  # idempotent
    assert read_committed(kafka, admin, topic) == []
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []
    assert sink.last_committed_epoch() is None
    sink.close()


def test_the_last_epoch_is_found_behind_many_other_records(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    """Other jobs' records after ours make the backward scan read several chunks."""
    coordinator = job(kafka, topic, unique, tmp_path)
    coordinator.run_epoch(0, [events([1])])
    coordinator.run_epoch(1, [events([2])])
    coordinator.close()
    others = Producer(kafka.config({"linger.ms": 20}))
    for i in range(2 * SCAN_CHUNK + 500):
        others.produce(f"{topic}-ds-progress", b"{}", f"other-job/{i}".encode(), partition=0)
    assert others.flush(30) == 0

    again = job(kafka, topic, unique, tmp_path)
    sink = again.sinks[0]
    assert isinstance(sink, KafkaSink)
    assert sink.last_committed_epoch() == 1
    for _ in range(3):  # each scan re-reads the chunks from the broker
        for epoch in (0, 1):
            decision = sink.read_decision(epoch)
            assert decision is not None
            assert decision["epoch"] == epoch
    assert again.run_epoch(1, [events([9])]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert ids(read_committed(kafka, admin, topic)) == [1, 2]
    again.close()


def test_a_start_reads_the_newest_progress_records_in_a_small_chunk(
    kafka: KafkaEndpoint,
    topic: str,
    unique: UniqueNames,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keys a start looks for are among the newest records: however long the topic, it
    reads FIRST_CHUNK records back, not SCAN_CHUNK."""
    first = job(kafka, topic, unique, tmp_path)  # (it makes the progress topic)
    first.run_epoch(0, [events([0])])
    first.close()
    others = Producer(kafka.config({"linger.ms": 20}))
    for i in range(SCAN_CHUNK):
        others.produce(f"{topic}-ds-progress", b"{}", f"other-job/{i}".encode(), partition=0)
    assert others.flush(30) == 0
    coordinator = job(kafka, topic, unique, tmp_path)
    for epoch in (1, 2):
        coordinator.run_epoch(epoch, [events([epoch])])
    coordinator.close()

    spans: list[int] = []
    read = ProgressReader._read

    def counted(self: ProgressReader, consumer: Any, start: int, end: int, deadline: float) -> Any:
        spans.append(end - start)
        return read(self, consumer, start, end, deadline)

    monkeypatch.setattr(ProgressReader, "_read", counted)
    again = job(kafka, topic, unique, tmp_path)
    sink = again.sinks[0]
    assert isinstance(sink, KafkaSink)
    assert sink.last_committed_epoch() == 2
    assert spans
    assert max(spans) <= FIRST_CHUNK
    again.close()


def test_a_progress_topic_held_by_an_open_transaction_times_out_clearly(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    coordinator = job(kafka, topic, unique, tmp_path)  # creates the progress topic
    coordinator.close()
    holder = Producer(kafka.config({"transactional.id": unique.name("holder")}))
    holder.init_transactions(20)
    holder.begin_transaction()
    holder.produce(f"{topic}-ds-progress", b"{}", b"someone-else", partition=0)
    assert holder.flush(20) == 0
    try:
        started = time.monotonic()
        with pytest.raises(TransientError, match="held at offset") as raised:
            job(kafka, topic, unique, tmp_path, progress_scan_timeout_s=2)
        assert time.monotonic() - started < 20
        assert "progress_topic" in (raised.value.fix or "")
    finally:
        holder.abort_transaction(20)
    job(kafka, topic, unique, tmp_path).close()  # works again once the transaction ended


# -- fencing -------------------------------------------------------------------------------------
def test_a_zombie_producer_cannot_make_anything_visible(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    old = job(kafka, topic, unique, tmp_path)
    old.run_epoch(0, [events([1])])
    # The old driver prepares epoch 1 and stalls before its commit point.
    stalled = old.epoch_steps(1, [events([100, 101])])
    run_until(stalled, "after-pre-commit:kafka")

    new = job(kafka, topic, unique, tmp_path)  # its init_transactions aborts the old epoch
    new.run_epoch(1, [events([2])])
    visible = ids(read_committed(kafka, admin, topic))
    assert visible == [1, 2]

    # The zombie wakes: its commit point, a new epoch, and a new open all fail fenced.
    with pytest.raises(FencedError):
        for _ in stalled:
            pass
    with pytest.raises(FencedError):
        old.run_epoch(2, [events([200])])
    zombie_sink = KafkaSink(config(kafka, topic))
    with pytest.raises(FencedError, match="older"):
        zombie_sink.open(OpenContext(unique.job_id, "kafka", 1))
    assert ids(read_committed(kafka, admin, topic)) == visible
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []

    new.run_epoch(2, [events([3])])
    assert ids(read_committed(kafka, admin, topic)) == [1, 2, 3]
    for coordinator in (old, new):
        coordinator.close()
    zombie_sink.close()


# -- Kafka as the last resource with Postgres ----------------------------------------------------
def two_sink_job(
    kafka: KafkaEndpoint,
    postgres: PostgresEndpoint,
    topic: str,
    table: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> Coordinator:
    sinks: list[SinkConnector] = [
        PostgresSink(Postgres(postgres.conninfo(), table)),
        KafkaSink(config(kafka, topic)),
    ]
    coordinator = Coordinator(unique.job_id, sinks, LocalDirectoryStore(tmp_path))
    coordinator.start()
    return coordinator


def pg_ids(conn: psycopg.Connection[Any], table: str) -> list[int]:
    query = sql.SQL("SELECT n FROM {} ORDER BY n").format(sql.Identifier(*table.split(".")))
    return [row[0] for row in conn.execute(query).fetchall()]


def test_crash_after_the_kafka_commit_is_finished_from_the_progress_record(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    topic: str,
    pg_table: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    crashed = two_sink_job(kafka, postgres, topic, pg_table, unique, tmp_path)
    crashed.run_epoch(0, [events([1])])
    steps = crashed.epoch_steps(1, [events([2, 3])])
    run_until(steps, "after-decision")  # Kafka committed; Postgres still prepared
    assert ids(read_committed(kafka, admin, topic)) == [1, 2, 3]
    assert pg_ids(conn, pg_table) == [1]
    assert len(prepared_gids(conn, unique.job_id, "postgres")) == 1
    assert crashed.store.get(1) is None  # the crash came before the decision cache

    recovered = two_sink_job(kafka, postgres, topic, pg_table, unique, tmp_path)
    assert pg_ids(conn, pg_table) == [1, 2, 3]  # committed by recovery, per the progress record
    assert prepared_gids(conn, unique.job_id, "postgres") == []
    replay = recovered.run_epoch(1, [events([2, 3])])
    assert replay.outcome is EpochOutcome.ALREADY_COMMITTED
    recovered.run_epoch(2, [events([4])])
    assert ids(read_committed(kafka, admin, topic)) == [1, 2, 3, 4]
    assert pg_ids(conn, pg_table) == [1, 2, 3, 4]
    for coordinator in (crashed, recovered):
        coordinator.close()


def test_crash_before_the_kafka_commit_rolls_everything_back(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    topic: str,
    pg_table: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    crashed = two_sink_job(kafka, postgres, topic, pg_table, unique, tmp_path)
    steps = crashed.epoch_steps(0, [events([1, 2])])
    run_until(steps, "after-pre-commit:kafka")  # both prepared, no decision
    assert len(prepared_gids(conn, unique.job_id, "postgres")) == 1

    recovered = two_sink_job(kafka, postgres, topic, pg_table, unique, tmp_path)
    assert prepared_gids(conn, unique.job_id, "postgres") == []
    assert pg_ids(conn, pg_table) == []
    assert read_committed(kafka, admin, topic) == []
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []
    # Spark replays the epoch: it lands once in both.
    assert recovered.run_epoch(0, [events([1, 2])]).outcome is EpochOutcome.COMMITTED
    assert ids(read_committed(kafka, admin, topic)) == [1, 2]
    assert pg_ids(conn, pg_table) == [1, 2]
    for coordinator in (crashed, recovered):
        coordinator.close()


# -- bad input -----------------------------------------------------------------------------------
BAD_BATCHES = {
    "key column missing": (
        pa.record_batch({"n": pa.array([5], pa.int64())}),
        "key_column 'id'",
    ),
    "value column of a wrong type": (
        pa.record_batch({"id": ["5"], "body": pa.array([5], pa.int64())}),
        "value_column 'body'",
    ),
    "record over the size limit": (
        events([5, 6], size=2_000_000),
        "record_too_large: 2 rows .first: row 0: the record is about",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_bad_batches_are_refused_and_leave_nothing(
    case: str,
    kafka: KafkaEndpoint,
    admin: AdminClient,
    topic: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    batch, message = BAD_BATCHES[case]
    options = {"value_column": "body"} if "value column" in case else {}
    coordinator = job(kafka, topic, unique, tmp_path, **options)
    good = events([1]) if not options else pa.record_batch({"id": ["1"], "body": [b"one"]})
    coordinator.run_epoch(0, [good])
    with pytest.raises(SchemaMismatchError, match=message) as raised:
        coordinator.run_epoch(1, [good, batch])
    assert raised.value.fix
    assert len(read_committed(kafka, admin, topic)) == 1  # the good row of epoch 1 too is gone
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []
    assert coordinator.sinks[0].last_committed_epoch() == 0
    assert coordinator.run_epoch(1, [good]).outcome is EpochOutcome.COMMITTED
    assert len(read_committed(kafka, admin, topic)) == 2
    coordinator.close()


def test_a_partition_the_topic_does_not_have_is_refused(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    coordinator = job(kafka, topic, unique, tmp_path, partition_column="p")
    batch = events([1]).append_column("p", pa.array([2], pa.int32()))
    with pytest.raises(
        SchemaMismatchError, match=re.escape("first: row 0: partition 2, but topic")
    ):
        coordinator.run_epoch(0, [batch])
    assert read_committed(kafka, admin, topic) == []
    coordinator.close()


# -- bad configuration ---------------------------------------------------------------------------
def test_a_missing_topic_is_named_unless_creation_is_allowed(
    kafka: KafkaEndpoint, admin: AdminClient, unique: UniqueNames, tmp_path: Any
) -> None:
    name = unique.name("absent")
    with pytest.raises(ConfigError, match=f"topic '{name}' does not exist") as raised:
        job(kafka, name, unique, tmp_path)
    assert "create_topic=True" in (raised.value.fix or "")
    coordinator = job(kafka, name, unique, tmp_path, create_topic=True, topic_partitions=3)
    try:
        assert len(partitions_of(admin, name)) == 3
        progress = admin.list_topics(f"{name}-ds-progress", timeout=20).topics
        assert len(progress[f"{name}-ds-progress"].partitions) == 1
        coordinator.run_epoch(0, [events([1])])
        assert ids(read_committed(kafka, admin, name)) == [1]
    finally:
        coordinator.close()
        for future in admin.delete_topics(
            [name, f"{name}-ds-progress"], request_timeout=30
        ).values():
            future.result(timeout=30)


def test_a_transaction_timeout_above_the_brokers_limit_is_refused(
    kafka: KafkaEndpoint, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    too_long = TRANSACTION_MAX_TIMEOUT_MS / 1000 + 1
    with pytest.raises(ConfigError, match=re.escape("transaction.max.timeout.ms")) as raised:
        job(kafka, topic, unique, tmp_path, transaction_timeout_s=too_long)
    limit = f"transaction_timeout_s <= {TRANSACTION_MAX_TIMEOUT_MS / 1000:g}"
    assert limit in (raised.value.fix or "")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"producer_config": {"transactional.id": "mine"}}, "which the sink owns"),
        ({"producer_config": {"acks": 1}}, "which the sink owns"),
        ({"transaction_timeout_s": 10, "max_transaction_timeout_s": 20}, "are both set"),
        ({"topic": "bad topic"}, "not a valid topic name"),
        ({"value_column": "id"}, "more than one role"),
    ],
)
def test_bad_settings_are_refused_when_configured(
    options: dict[str, Any], message: str, kafka: KafkaEndpoint
) -> None:
    settings: dict[str, Any] = {"key_column": "id", "topic": "events", **options}
    with pytest.raises(ConfigError, match=message):
        Kafka(kafka.bootstrap_servers, **settings)


def test_an_unknown_producer_setting_is_named_at_start(
    kafka: KafkaEndpoint, topic: str, unique: UniqueNames, tmp_path: Any
) -> None:
    with pytest.raises(ConfigError, match=re.escape("no.such.setting")) as raised:
        job(kafka, topic, unique, tmp_path, producer_config={"no.such.setting": 1})
    assert "CONFIGURATION.md" in (raised.value.fix or "")


def test_an_unreachable_cluster_is_a_clear_error(unique: UniqueNames, tmp_path: Any) -> None:
    sink = KafkaSink(Kafka("127.0.0.1:1", "events", request_timeout_s=3))
    coordinator = Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path))
    started = time.monotonic()
    with pytest.raises(
        TransientError, match=re.escape("cannot reach the Kafka cluster at 127.0.0.1:1")
    ):
        coordinator.start()
    assert time.monotonic() - started < 30
    coordinator.close()


@pytest.mark.parametrize(
    ("partitions", "settings", "message"),
    [
        (2, {"cleanup.policy": "compact"}, "has 2 partitions; it needs 1"),
        (1, {"cleanup.policy": "delete", "retention.ms": "3600000"}, "could be deleted"),
    ],
)
def test_an_unsuitable_progress_topic_is_refused(
    partitions: int,
    settings: dict[str, str],
    message: str,
    kafka: KafkaEndpoint,
    admin: AdminClient,
    topic: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    create_topic(admin, f"{topic}-ds-progress", partitions, **settings)
    with pytest.raises(ConfigError, match=message) as raised:
        job(kafka, topic, unique, tmp_path)
    assert raised.value.fix


# -- secrets -------------------------------------------------------------------------------------
def test_secrets_never_reach_logs_errors_or_records(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    topic: str,
    unique: UniqueNames,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = f"sasl-secret-{uuid.uuid4().hex}"
    producer_config = {
        "sasl.username": "user",
        "sasl.password": secret,
        "ssl.key.password": secret,
        "debug": "security",
    }
    coordinator = job(kafka, topic, unique, tmp_path, producer_config=producer_config)
    sink = coordinator.sinks[0]
    assert isinstance(sink, KafkaSink)
    result = coordinator.run_epoch(0, [events([1])])
    errors: list[str] = []
    for bad in (pa.record_batch({"n": [1]}), events([2], size=2_000_000)):
        try:
            coordinator.run_epoch(1, [bad])
        except DurableSinkError as exc:
            errors.append(str(exc) + repr(exc) + str(exc.fix))
    assert len(errors) == 2
    progress = read_committed(kafka, admin, f"{topic}-ds-progress")
    places = {
        "logs": "\n".join(r.getMessage() for r in caplog.records),
        "errors": "\n".join(errors),
        "reprs": repr(sink.config) + repr(sink),
        "decision": result.decision.to_bytes().decode(),
        "progress records": "\n".join((m.value() or b"").decode() for m in progress),
        "metrics": str(sink.metrics()),
    }
    assert [place for place, text in places.items() if secret in text] == []
    assert "***" in places["reprs"]
    coordinator.close()


def test_records_produced_in_bulk_equal_those_produced_one_by_one(
    kafka: KafkaEndpoint, admin: AdminClient, unique: UniqueNames, tmp_path: Any
) -> None:
    """The same epochs through librdkafka's batch call and through a `produce()` per record:
    the same records (keys, values, null keys, tombstones, large strings) land in the same
    partitions in the same order, and a queue too small for a batch is waited out."""
    batch = pa.record_batch(
        {
            "key": pa.array([None if i % 7 == 0 else f"k{i % 11}" for i in range(3000)]),
            "value": pa.array(
                [None if i % 13 == 0 else f"v{i}-" + "é" * (i % 5) for i in range(3000)],
                pa.large_string(),
            ),
        }
    ).slice(5, 2990)
    landed = {}
    for bulk in (True, False):
        topic = unique.name(f"bulk-{bulk}")
        create_topic(admin, topic, 3)
        coordinator = job(
            kafka,
            topic,
            unique,
            tmp_path / str(bulk),
            key_column="key",
            value_column="value",
            produce_in_bulk=bulk,
            # Smaller than a batch: the batch call meets a full queue and waits for room.
            producer_config={"queue.buffering.max.messages": 1000},
        )
        sink = coordinator.sinks[0]
        assert isinstance(sink, KafkaSink)
        for epoch in range(2):
            assert coordinator.run_epoch(epoch, [batch]).outcome is EpochOutcome.COMMITTED
        assert (sink._state().producer._bulk is not None) is bulk
        coordinator.close()
        landed[bulk] = [
            (m.partition(), m.key(), m.value()) for m in read_committed(kafka, admin, topic)
        ]
    expected = [
        (
            None if i % 7 == 0 else f"k{i % 11}".encode(),
            None if i % 13 == 0 else f"v{i}-{'é' * (i % 5)}".encode(),
        )
        for i in range(5, 2995)
    ] * 2
    for records in landed.values():
        # Every record once, keys and values (null keys, tombstones) as given.
        assert sorted(((k, v) for _, k, v in records), key=repr) == sorted(expected, key=repr)
        # Keyed records are in their key's partition (murmur2), in the order they were given.
        for part in range(3):
            mine = [(k, v) for p, k, v in records if p == part and k is not None]
            assert mine == [kv for kv in expected if kv[0] is not None and kv in mine]
    keyed = {
        bulk: sorted(((p, k) for p, k, _ in records if k is not None), key=repr)
        for bulk, records in landed.items()
    }
    assert keyed[True] == keyed[False]


def test_a_record_batch_that_fails_on_the_sender_thread_fails_its_epoch_before_the_decision(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    topic: str,
    unique: UniqueNames,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record batch is enqueued in bulk on the producer's sender thread while the sink goes
    on: its failure (here the client refusing the second half of its records, injected around
    the real call) is raised by the sink's next call, pre_commit at the latest; the epoch
    rolls back and nothing of it is visible; the next epoch commits exactly."""
    real = BulkProducer.send

    def half_then_refused(
        self: BulkProducer, topic: str, values: pa.Array, keys: pa.Array | None, **k: Any
    ) -> None:
        half = len(values) // 2
        real(self, topic, values.slice(0, half), None if keys is None else keys.slice(0, half), **k)
        raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "injected"))

    sink = KafkaSink(config(kafka, topic))
    sink.open(OpenContext(unique.job_id, "kafka", 1))
    sink.begin_epoch(0)
    monkeypatch.setattr(BulkProducer, "send", half_then_refused)
    sink.write_batch(events([1, 2, 3, 4]))  # handed to the sender thread: returns at once
    with pytest.raises(TransientError, match="producing records failed: _MSG_TIMED_OUT"):
        sink.pre_commit(0)
    sink.rollback_epoch(0, None)
    monkeypatch.setattr(BulkProducer, "send", real)
    assert read_committed(kafka, admin, topic) == []
    sink.begin_epoch(0)
    sink.write_batch(events([1, 2, 3, 4]))
    sink.commit_epoch(0, sink.pre_commit(0))
    assert ids(read_committed(kafka, admin, topic)) == [1, 2, 3, 4]
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []
    sink.close()
