"""Bad rows and dead letters with Kafka, against the test bed's real Kafka, read by
read_committed consumers: rows a topic cannot take (a record over its max.message.bytes, a
partition it does not have, a timestamp outside its window, a Spark-shape row Spark's sink
would fail on; a `topic` column is ignored under the sink's topic option, as in Spark) fail
the epoch with the row, the limit and the fix, or go to a files dead letter while every
other row lands in the topic; a Kafka topic as the dead-letter sink of a files target is the
job's commit point; a Kafka target and a Kafka dead-letter topic on one cluster commit in one
transaction (on two clusters they are refused); and a new column flows through with
schema_evolution='add_columns'."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.bad_rows import (
    BadRowCap,
    BadRowPolicy,
    BadRowsError,
    SchemaEvolution,
    WritePolicy,
    dead_letter_schema,
)
from durable_sinks.core.errors import CapabilityError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.kafka.progress import transactional_id
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint
from tests.support.coordinators import started
from tests.support.kafka_reads import open_transactions, read_committed
from tests.support.refusing_sink import RefusingFileSink
from tests.support.targets import create_topic, delete_with_progress

#: The topic's max.message.bytes in these tests.
TOPIC_LIMIT = 4096
DEAD_LETTERS = WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER)


def kafka_sink(kafka: KafkaEndpoint, topic: str, name: str = "kafka", **options: Any) -> KafkaSink:
    return KafkaSink(
        Kafka(kafka.bootstrap_servers, topic, name=name, request_timeout_s=20, **options)
    )


def rows(ids: list[int], sizes: list[int], partitions: list[int | None]) -> pa.RecordBatch:
    """Rows whose `body` holds `sizes[i]` incompressible bytes (hex of random bytes)."""
    return pa.record_batch(
        {
            "id": pa.array([str(i) for i in ids]),
            "body": pa.array([os.urandom(s // 2).hex() for s in sizes]),
            "p": pa.array(partitions, pa.int32()),
        }
    )


def dead_letters_in(path: Path) -> list[dict[str, Any]]:
    table = pq.read_table(path, partitioning=None)  # its epoch column, not the folder's
    return sorted(
        table.select(dead_letter_schema().names).to_pylist(), key=lambda r: r["row_number"]
    )


@pytest.fixture
def small_topic(admin: AdminClient, unique: UniqueNames) -> Any:
    """A two-partition topic that takes records of up to TOPIC_LIMIT bytes."""
    name = unique.name("small")
    create_topic(admin, name, 2, **{"max.message.bytes": str(TOPIC_LIMIT)})
    yield name
    delete_with_progress(admin, name)


def test_oversize_rows_and_missing_partitions_fail_the_epoch_naming_row_limit_and_fix(
    kafka: KafkaEndpoint, admin: AdminClient, small_topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    target = kafka_sink(kafka, small_topic, key_column="id", partition_column="p")
    coordinator = started(Coordinator(unique.job_id, [target], LocalDirectoryStore(tmp_path)))
    try:
        batch = rows([0, 1, 2], [10, 2 * TOPIC_LIMIT, 10], [0, None, 7])
        with pytest.raises(BadRowsError) as raised:
            coordinator.run_epoch(0, [batch])
        error = raised.value
        assert error.refused.rows == (1, 2)
        assert re.search(
            rf"record_too_large: 1 row \(first: row 1: the record is about \d+ bytes; the limit "
            rf"is {TOPIC_LIMIT} bytes",
            error.message,
        ), error.message
        assert "invalid_value (column 'p'): 1 row (first: row 2: partition 7" in error.message
        assert "raise max.message.bytes on the topic" in (error.fix or "")
        assert "modulo the topic's partition count" in (error.fix or "")
        assert "on_bad_rows='dead_letter'" in (error.fix or "")
        assert read_committed(kafka, admin, small_topic) == []
        assert open_transactions(admin, small_topic, f"{small_topic}-ds-progress") == []
        assert target.last_committed_epoch() is None
    finally:
        coordinator.close()


def test_refused_rows_go_to_the_dead_letter_and_the_rest_to_the_topic(
    kafka: KafkaEndpoint, admin: AdminClient, small_topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    """Many records close to the topic's limit go out too: the producer never packs them
    into a batch the topic refuses."""
    letters_path = tmp_path / "dead"
    target = kafka_sink(kafka, small_topic, key_column="id", partition_column="p")
    dead = FolderSink(Files(str(letters_path), name="dead"))
    coordinator = started(
        Coordinator(
            unique.job_id,
            [target],
            LocalDirectoryStore(tmp_path / "store"),
            policy=DEAD_LETTERS,
            dead_letter=dead,
            bad_row_cap=BadRowCap(5),
        )
    )
    try:
        near = TOPIC_LIMIT - 200
        first = rows(list(range(40)), [near] * 40, [i % 2 for i in range(40)])
        second = rows([40, 41, 42, 43], [10, TOPIC_LIMIT, 10, 3 * TOPIC_LIMIT], [None, 0, -3, 1])
        result = coordinator.run_epoch(0, [first, second])
        assert result.outcome is EpochOutcome.COMMITTED
        written = read_committed(kafka, admin, small_topic)
        assert sorted(int(m.key() or b"") for m in written) == [*range(41)]
        letters = dead_letters_in(letters_path)
        assert [(r["row_number"], r["reason"], r["column_name"]) for r in letters] == [
            (41, "record_too_large", None),
            (42, "invalid_value", "p"),
            (43, "record_too_large", None),
        ]
        assert {(r["job_id"], r["epoch"], r["sink"]) for r in letters} == {
            (unique.job_id, 0, "kafka")
        }
        assert json.loads(letters[1]["row_json"])["p"] == -3
        assert f"the limit is {TOPIC_LIMIT} bytes" in letters[0]["message"]
        # An epoch without bad rows needs nothing of the dead-letter sink.
        coordinator.run_epoch(1, [rows([50], [10], [0])])
        assert len(read_committed(kafka, admin, small_topic)) == 42
        assert len(dead_letters_in(letters_path)) == 3
    finally:
        coordinator.close()


def test_timestamps_the_topic_refuses_go_to_the_dead_letter(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    """Kafka 4 takes timestamps up to an hour ahead of its clock, none before 1970."""
    letters_path = tmp_path / "dead"
    coordinator = started(
        Coordinator(
            unique.job_id,
            [kafka_sink(kafka, topic, key_column="id", timestamp_column="ts")],
            LocalDirectoryStore(tmp_path / "store"),
            policy=DEAD_LETTERS,
            dead_letter=FolderSink(Files(str(letters_path), name="dead")),
            bad_row_cap=BadRowCap(5),
        )
    )
    try:
        now = int(time.time() * 1000)
        stamps = [now, now * 1000, -5, None, now - 86_400_000]  # the second: microseconds
        batch = pa.record_batch(
            {"id": [str(i) for i in range(5)], "n": range(5), "ts": pa.array(stamps, pa.int64())}
        )
        coordinator.run_epoch(0, [batch])
        landed = sorted(int(m.key() or b"") for m in read_committed(kafka, admin, topic))
        assert landed == [0, 3, 4]
        letters = dead_letters_in(letters_path)
        assert [(r["row_number"], r["reason"], r["column_name"]) for r in letters] == [
            (1, "timestamp_out_of_range", "ts"),
            (2, "timestamp_out_of_range", "ts"),
        ]
        assert "after.max.ms 3600000 ms" in letters[0]["message"]
        assert "before 1970" in letters[1]["message"]
    finally:
        coordinator.close()


def test_spark_shape_rows_the_sink_cannot_write_go_to_the_dead_letter(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    letters_path = tmp_path / "dead"
    coordinator = started(
        Coordinator(
            unique.job_id,
            [kafka_sink(kafka, topic)],
            LocalDirectoryStore(tmp_path / "store"),
            policy=DEAD_LETTERS,
            dead_letter=FolderSink(Files(str(letters_path), name="dead")),
            bad_row_cap=BadRowCap(5),
        )
    )
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    try:
        batch = pa.record_batch(
            {
                "value": ["ok", "far", "elsewhere", "keyless", "also ok"],
                "partition": pa.array([1, 2, None, None, 0], pa.int32()),
                "topic": [topic, None, "elsewhere", None, None],
                "headers": pa.array(
                    [[{"key": "h", "value": b"1"}], None, None, [{"value": b"2"}], []],
                    pa.list_(header),
                ),
            }
        )
        coordinator.run_epoch(0, [batch])
        written = {(m.value() or b"").decode(): m for m in read_committed(kafka, admin, topic)}
        # the sink's topic option takes precedence over the topic column, as in Spark
        assert sorted(written) == ["also ok", "elsewhere", "ok"]
        assert (written["ok"].partition(), written["ok"].headers()) == (
            1,
            [("h", b"1")],
        )
        letters = dead_letters_in(letters_path)
        assert [(r["row_number"], r["column_name"]) for r in letters] == [
            (1, "partition"),
            (3, "headers"),
        ]
        assert {r["reason"] for r in letters} == {"invalid_value"}
    finally:
        coordinator.close()


def test_a_kafka_dead_letter_topic_is_the_commit_point_of_a_files_target(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    """The topic's transaction carries every epoch's decision, with or without dead letters;
    each dead letter is one JSON record of the dead-letter columns."""
    target = RefusingFileSink(Files(str(tmp_path / "target"), name="target"))
    dead = kafka_sink(kafka, topic, name="dead")
    coordinator = started(
        Coordinator(
            unique.job_id,
            [target],
            LocalDirectoryStore(tmp_path / "store"),
            policy=DEAD_LETTERS,
            dead_letter=dead,
        )
    )
    try:
        assert coordinator.decisions.last is dead
        batch = pa.record_batch({"id": [1, 2, 3, 4], "v": [5, -1, 7, 8]})
        assert coordinator.run_epoch(0, [batch]).outcome is EpochOutcome.COMMITTED
        assert coordinator.run_epoch(1, [pa.record_batch({"id": [9], "v": [1]})]).outcome is (
            EpochOutcome.COMMITTED
        )
        assert dead.last_committed_epoch() == 1  # its progress record carries epoch 1 too
        [record] = read_committed(kafka, admin, topic)
        letter = json.loads(record.value() or b"")
        assert set(letter) == set(dead_letter_schema().names)
        assert (letter["job_id"], letter["epoch"], letter["sink"], letter["row_number"]) == (
            unique.job_id,
            0,
            "target",
            1,
        )
        assert (letter["reason"], letter["constraint_name"]) == ("check", "v_not_negative")
        assert json.loads(letter["row_json"]) == {"id": 2, "v": -1}
        landed = pq.read_table(tmp_path / "target").sort_by("id")
        assert landed.column("id").to_pylist() == [1, 3, 4, 9]
        assert open_transactions(admin, topic, f"{topic}-ds-progress") == []
    finally:
        coordinator.close()


def test_a_kafka_target_and_a_kafka_dead_letter_topic_commit_in_one_transaction(
    kafka: KafkaEndpoint, admin: AdminClient, small_topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    """Both on the test bed's cluster: one producer, one transaction per epoch, the target's
    commit carries the decision and the dead letters' progress record rides in it; an epoch
    without dead letters leaves the dead-letter topic out."""
    letters = f"{small_topic}-dlq"
    target = kafka_sink(kafka, small_topic, key_column="id", partition_column="p")
    dead = kafka_sink(kafka, letters, name="dead", create_topic=True)
    coordinator = started(
        Coordinator(
            unique.job_id,
            [target],
            LocalDirectoryStore(tmp_path),
            policy=DEAD_LETTERS,
            dead_letter=dead,
            bad_row_cap=BadRowCap(5),
        )
    )
    try:
        shared = transactional_id(unique.job_id, "kafka")  # the carrier's
        assert target.transactional_id == dead.transactional_id == shared
        first = rows([0, 1, 2], [10, 2 * TOPIC_LIMIT, 10], [0, None, 7])
        assert coordinator.run_epoch(0, [first]).outcome is EpochOutcome.COMMITTED
        assert coordinator.run_epoch(1, [rows([3], [10], [1])]).outcome is EpochOutcome.COMMITTED
        landed = sorted(m.key() or b"" for m in read_committed(kafka, admin, small_topic))
        assert landed == [b"0", b"3"]
        found = [json.loads(m.value() or b"{}") for m in read_committed(kafka, admin, letters)]
        assert sorted((r["row_number"], r["reason"]) for r in found) == [
            (1, "record_too_large"),
            (2, "invalid_value"),
        ]
        assert {r["epoch"] for r in found} == {0}
        assert (target.last_committed_epoch(), dead.last_committed_epoch()) == (1, 0)
        progress = (f"{small_topic}-ds-progress", f"{letters}-ds-progress")
        assert open_transactions(admin, small_topic, letters, *progress) == []
    finally:
        coordinator.close()
    delete_with_progress(admin, letters)


def test_a_kafka_dead_letter_on_another_cluster_is_refused_with_the_fix(
    kafka: KafkaEndpoint, topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    """Named by other bootstrap servers, the dead-letter topic's cluster counts as another:
    two transactions, and only one can carry the decision."""
    port = kafka.bootstrap_servers.rsplit(":", 1)[1]
    other = KafkaSink(Kafka(f"localhost:{port}", f"{topic}-dlq", name="dead"))
    coordinator = Coordinator(
        unique.job_id,
        [kafka_sink(kafka, topic)],
        LocalDirectoryStore(tmp_path),
        policy=DEAD_LETTERS,
        dead_letter=other,
    )
    with pytest.raises(CapabilityError, match="dead-letter sink 'dead'") as raised:
        coordinator.start()
    coordinator.close()
    assert f"'dead': kafka cluster localhost:{port}" in raised.value.message
    fix = raised.value.fix or ""
    assert "the same bootstrap_servers" in fix
    assert "dead_letter=sink('postgres'" in fix


def test_a_new_column_flows_through_with_add_columns(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    coordinator = started(
        Coordinator(
            unique.job_id,
            [kafka_sink(kafka, topic, key_column="id")],
            LocalDirectoryStore(tmp_path),
            policy=WritePolicy(schema_evolution=SchemaEvolution.ADD_COLUMNS),
        )
    )
    try:
        coordinator.run_epoch(0, [pa.record_batch({"id": ["1"], "n": [1]})])
        coordinator.run_epoch(1, [pa.record_batch({"id": ["2"], "n": [2], "added": ["new"]})])
        values = sorted(
            (json.loads(m.value() or b"") for m in read_committed(kafka, admin, topic)),
            key=lambda v: v["n"],
        )
        assert values == [{"n": 1}, {"n": 2, "added": "new"}]
    finally:
        coordinator.close()
