"""A Kafka sink without a `topic` option, against the test bed's real Kafka: each row goes to
the topic its `topic` column names (Spark's rule), all of an epoch's topics in its one
transaction; its progress record names every topic-partition's offset range, and the audit
counts each epoch over all of them; rows naming no topic, a topic outside the sink's bounds
or a missing one are bad rows (failing the epoch with nothing visible, or going to the dead
letter); a topic inside the bounds is created when first named with `create_topic`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.bad_rows import BadRowPolicy, BadRowsError, WritePolicy
from durable_sinks.core.errors import CommittedEpochLostError, SchemaMismatchError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.kafka.operations import holdings
from durable_sinks.sinks.kafka.progress import progress_key
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint
from tests.support.coordinators import started
from tests.support.kafka_reads import open_transactions, read_committed
from tests.support.targets import create_topic


@pytest.fixture
def topics(admin: AdminClient, unique: UniqueNames) -> Iterator[list[str]]:
    """Three fresh topics (two partitions each) and a progress topic name; all deleted
    after the test, with any topic the test made beside them."""
    prefix = unique.name("routed")
    names = [f"{prefix}-orders", f"{prefix}-refunds", f"{prefix}-audit"]
    for name in names:
        create_topic(admin, name, 2)
    yield [*names, f"{prefix}-progress"]
    existing = set(admin.list_topics(timeout=30).topics)
    made = [n for n in existing if n.startswith(prefix)]
    for future in admin.delete_topics(made, request_timeout=30).values():
        future.result(timeout=30)


def routed_sink(kafka: KafkaEndpoint, progress: str, **options: Any) -> KafkaSink:
    options.setdefault("request_timeout_s", 20)
    return KafkaSink(Kafka(kafka.bootstrap_servers, progress_topic=progress, **options))


def batch(values: list[str], topics: list[str | None]) -> pa.RecordBatch:
    """Spark's Kafka record shape: a value and the topic each row names."""
    return pa.record_batch({"value": pa.array(values), "topic": pa.array(topics, pa.string())})


def values_in(kafka: KafkaEndpoint, admin: AdminClient, topic: str) -> list[str]:
    return sorted(bytes(m.value() or b"").decode() for m in read_committed(kafka, admin, topic))


def test_each_row_goes_to_the_topic_it_names_in_one_transaction_and_the_audit_counts_all(
    kafka: KafkaEndpoint, admin: AdminClient, topics: list[str], unique: UniqueNames, tmp_path: Path
) -> None:
    orders, refunds, audit, progress = topics
    sink = routed_sink(kafka, progress, topics=(orders, refunds, audit))
    coordinator = started(Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path)))
    try:
        first = batch(["o1", "r1", "o2", "a1"], [orders, refunds, orders, audit])
        second = batch(["o3", "r2"], [orders, refunds])
        assert coordinator.run_epoch(0, [first, second]).outcome is EpochOutcome.COMMITTED
        # an epoch writing one topic only: its ranges name that topic alone
        assert coordinator.run_epoch(1, [batch(["a2"], [audit])]).outcome is (
            EpochOutcome.COMMITTED
        )
        assert values_in(kafka, admin, orders) == ["o1", "o2", "o3"]
        assert values_in(kafka, admin, refunds) == ["r1", "r2"]
        assert values_in(kafka, admin, audit) == ["a1", "a2"]
        assert open_transactions(admin, orders, refunds, audit, progress) == []
        records = [json.loads(m.value() or b"{}") for m in read_committed(kafka, admin, progress)]
        ranges = {r["epoch"]: r["ranges"] for r in records if "epoch" in r}
        assert sorted(ranges[0]) == sorted([orders, refunds, audit])
        assert sorted(ranges[1]) == [audit]
        assert all(sorted(spans) == ["0", "1"] for spans in ranges[0].values())
        held = holdings(
            {"bootstrap.servers": kafka.bootstrap_servers},
            admin,
            None,
            progress,
            progress_key(unique.job_id, "kafka"),
            False,
            0,
            1,
            20,
        )
        assert {e: (h.rows, h.counted, h.problems) for e, h in held.items()} == {
            0: (6, True, ()),
            1: (1, True, ()),
        }
        assert sink.in_doubt() == []
    finally:
        coordinator.close()


def test_rows_no_topic_takes_fail_the_epoch_naming_each_reason_with_nothing_visible(
    kafka: KafkaEndpoint, admin: AdminClient, topics: list[str], unique: UniqueNames, tmp_path: Path
) -> None:
    orders, refunds, _audit, progress = topics
    missing = f"{orders}-missing"
    sink = routed_sink(kafka, progress, topic_pattern=rf"{orders}.*")
    coordinator = started(Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path)))
    try:
        good = batch(["o1"], [orders])
        bad = batch(["o2", "x", "y", "z", "w"], [orders, None, refunds, missing, "bad name!"])
        with pytest.raises(BadRowsError) as raised:
            coordinator.run_epoch(0, [good, bad])
        error = raised.value
        assert error.refused.rows == (1, 2, 3, 4)
        reasons = [r.message for r in error.refused.refusals]
        assert reasons[0].startswith("the topic is null")
        assert reasons[1] == (
            f"topic {refunds!r} is not among the sink's topics (topic_pattern='{orders}.*')"
        )
        assert reasons[2].startswith(f"topic {missing!r} does not exist")
        assert "not a valid Kafka topic name" in reasons[3]
        assert {r.column for r in error.refused.refusals} == {"topic"}
        assert "name an existing topic in each row's topic column" in (error.fix or "")
        assert values_in(kafka, admin, orders) == []
        assert missing not in admin.list_topics(timeout=20).topics  # nothing created
        assert open_transactions(admin, orders, progress) == []
    finally:
        coordinator.close()


def test_rows_no_topic_takes_go_to_the_dead_letter_and_a_bounded_topic_is_created(
    kafka: KafkaEndpoint, admin: AdminClient, topics: list[str], unique: UniqueNames, tmp_path: Path
) -> None:
    orders, _refunds, _audit, progress = topics
    fresh = f"{orders}-fresh"
    sink = routed_sink(
        kafka, progress, topics=(orders, fresh), create_topic=True, topic_partitions=3
    )
    dead = FolderSink(Files(str(tmp_path / "dead"), name="dead"))
    coordinator = started(
        Coordinator(
            unique.job_id,
            [sink],
            LocalDirectoryStore(tmp_path / "store"),
            policy=WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER),
            dead_letter=dead,
        )
    )
    try:
        rows = batch(["o1", "f1", "x", "o2"], [orders, fresh, "elsewhere", orders])
        result = coordinator.run_epoch(0, [rows])
        assert result.outcome is EpochOutcome.COMMITTED
        assert values_in(kafka, admin, orders) == ["o1", "o2"]
        assert values_in(kafka, admin, fresh) == ["f1"]
        assert len(admin.list_topics(fresh, timeout=20).topics[fresh].partitions) == 3
        assert "elsewhere" not in admin.list_topics(timeout=20).topics
        letters = pq.read_table(tmp_path / "dead", partitioning=None).to_pylist()
        assert [(r["row_number"], r["reason"], r["column_name"]) for r in letters] == [
            (2, "invalid_value", "topic")
        ]
        assert "'elsewhere' is not among the sink's topics" in letters[0]["message"]
    finally:
        coordinator.close()


def test_the_json_shape_routes_by_topic_column_and_leaves_it_out_of_the_value(
    kafka: KafkaEndpoint, admin: AdminClient, topics: list[str], unique: UniqueNames, tmp_path: Path
) -> None:
    orders, refunds, _audit, progress = topics
    sink = routed_sink(kafka, progress, topic_column="kind", topics=(orders, refunds))
    coordinator = started(Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path)))
    try:
        rows = pa.record_batch({"id": [1, 2], "kind": [orders, refunds]})
        assert coordinator.run_epoch(0, [rows]).outcome is EpochOutcome.COMMITTED
        assert values_in(kafka, admin, orders) == ['{"id":1}']
        assert values_in(kafka, admin, refunds) == ['{"id":2}']
        with pytest.raises(SchemaMismatchError, match="topic_column 'kind' is not a column"):
            coordinator.run_epoch(1, [pa.record_batch({"id": [3]})])
    finally:
        coordinator.close()


def test_a_topic_that_lost_the_newest_epochs_records_stops_the_next_start(
    kafka: KafkaEndpoint, admin: AdminClient, topics: list[str], unique: UniqueNames, tmp_path: Path
) -> None:
    """One topic of the epoch deleted and made again behind the job: the next start names
    it (CommittedEpochLostError) before anything is written."""
    orders, refunds, _audit, progress = topics
    sink = routed_sink(kafka, progress, topics=(orders, refunds))
    coordinator = started(Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path)))
    try:
        coordinator.run_epoch(0, [batch(["o1", "r1", "r2"], [orders, refunds, refunds])])
    finally:
        coordinator.close()
    for future in admin.delete_topics([refunds], request_timeout=30).values():
        future.result(timeout=30)
    wait_until_gone(admin, refunds)
    create_topic(admin, refunds, 2)
    # a shortfall is read again for up to request_timeout_s (a new leader's high watermark
    # may lag for a moment) before it counts as a loss
    again = Coordinator(
        unique.job_id,
        [routed_sink(kafka, progress, topics=(orders, refunds), request_timeout_s=2)],
        LocalDirectoryStore(tmp_path),
    )
    with pytest.raises(CommittedEpochLostError, match="no longer hold epoch 0") as raised:
        started(again)
    assert f"{refunds}[" in raised.value.message
    assert orders not in raised.value.message
    assert (raised.value.first_lost, raised.value.last_lost) == (0, 0)


def wait_until_gone(admin: AdminClient, topic: str) -> None:
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"topic {topic} was not deleted"
        time.sleep(0.1)
