"""The Kafka sink's transaction timeout against the test bed's real broker (4.3.1,
transaction.max.timeout.ms 900000, timed-out transactions aborted at its scan every 10 s).

The default suite holds a batch open past a small ceiling (max_transaction_timeout_s): a
ConfigError instead of an attempt after attempt that the broker aborts the same way. The
fault tier (each broker abort waits for the broker's 10 s scan, the long batches for
themselves) runs the derived timeout following the epochs and growing to the ceiling after
an abort, and the real case with the default settings: batches that keep their transaction
open longer than Kafka's default 60 s, the first one of the job included, and a restarted
job that starts from what its progress record carries."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.errors import ConfigError, TransientError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from tests.conftest import UniqueNames
from tests.integration.test_kafka_sink import events, ids
from tests.services import KafkaEndpoint
from tests.support.kafka_reads import open_transactions, read_committed

#: The test's own ceiling of the derived timeout: its ladder is 1, 2, 4 s.
CEILING_S = 4.0
#: How long the fault tier's batches keep their transaction open: more than Kafka's default
#: transaction.timeout.ms (60 s), which used to be the sink's.
LONG_BATCH_S = 65.0


def kafka_sink(bootstrap_servers: str, topic: str, **options: Any) -> KafkaSink:
    return KafkaSink(
        Kafka(bootstrap_servers, topic, key_column="id", request_timeout_s=20, **options)
    )


def coordinator(
    job_id: str, sink: KafkaSink, store: Path, on_step: Callable[[str], None] | None = None
) -> Coordinator:
    made = Coordinator(job_id, [sink], LocalDirectoryStore(store), on_step=on_step)
    made.start()
    return made


def hold(step: str, until: Callable[[], Callable[[], bool]]) -> Callable[[str], None]:
    """An on_step that, each time the epoch reaches `step` (its transaction open, its records
    written), waits until the condition `until()` makes there holds (at most 10 minutes)."""

    def on_step(name: str) -> None:
        if name != step:
            return
        done = until()
        deadline = time.monotonic() + 600
        while not done():
            assert time.monotonic() < deadline, f"held at {step} for 10 minutes"
            time.sleep(0.2)

    return on_step


def for_seconds(seconds: float) -> Callable[[], Callable[[], bool]]:
    def start() -> Callable[[], bool]:
        started = time.monotonic()
        return lambda: time.monotonic() - started >= seconds

    return start


def aborted_after(
    admin: AdminClient, topic: str, seconds: float
) -> Callable[[], Callable[[], bool]]:
    """`seconds` have passed and no transaction is open on `topic` any more (the broker
    aborted the one held open)."""

    def start() -> Callable[[], bool]:
        started = time.monotonic()

        def aborted() -> bool:
            old_enough = time.monotonic() - started > seconds
            return old_enough and open_transactions(admin, topic, grace=0) == []

        return aborted

    return start


WRITTEN = "after-write:0:kafka"


def test_a_batch_held_open_past_the_ceiling_fails_typed_and_is_not_retried(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    """With max_transaction_timeout_s=4, the job's first epoch takes the ceiling (nothing
    measured yet); held open until the broker aborts it, it is a ConfigError naming the
    transaction's age, the ceiling and the fix, not a retriable error that the next attempt
    meets again; nothing of it is visible, and the epoch's replay commits once it is quick."""
    servers, store = kafka.bootstrap_servers, tmp_path / "store"
    sink = kafka_sink(servers, topic, max_transaction_timeout_s=CEILING_S)
    held = coordinator(
        unique.job_id, sink, store, hold(WRITTEN, aborted_after(admin, topic, CEILING_S))
    )
    assert sink.transaction_timeout_s == CEILING_S
    with pytest.raises(ConfigError, match=r"its first record is \d+\.\d s old") as raised:
        held.run_epoch(0, [events([1, 2])])
    assert not raised.value.retriable
    assert "4 s is already the longest transaction timeout" in raised.value.message
    assert "transaction.max.timeout.ms" in (raised.value.fix or "")
    held.close()
    assert read_committed(kafka, admin, topic) == []

    replay = coordinator(unique.job_id, kafka_sink(servers, topic), store)
    assert replay.run_epoch(0, [events([1, 2])]).outcome is EpochOutcome.COMMITTED
    replay.close()
    assert ids(read_committed(kafka, admin, topic)) == [1, 2]
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []


@pytest.mark.fault_tier  # ~25 s: two transactions the broker aborts at its 10 s scan
def test_a_derived_timeout_follows_the_epochs_and_takes_the_ceiling_after_an_abort(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    """With max_transaction_timeout_s=4: the first epoch takes the ceiling, its quick commit
    brings the timeout to the lowest rung (1 s, a new producer before epoch 1); epoch 1 held
    open until the broker aborts it is retriable and the next attempt (a new coordinator, as
    the writer's ride-out builds) takes the ceiling and commits a batch held 2 s; held past
    the ceiling, epoch 2 is the ConfigError."""
    servers, store = kafka.bootstrap_servers, tmp_path / "store"
    sink = kafka_sink(servers, topic, max_transaction_timeout_s=CEILING_S)
    first = coordinator(unique.job_id, sink, store)
    assert sink.transaction_timeout_s == CEILING_S  # nothing measured yet
    assert first.run_epoch(0, [events([1, 2])]).outcome is EpochOutcome.COMMITTED

    first.on_step = hold(WRITTEN, aborted_after(admin, topic, 1.0))
    with pytest.raises(TransientError, match="the next attempt uses a transaction timeout of 4 s"):
        first.run_epoch(1, [events([3, 4])])
    assert sink.transaction_timeout_s == 1.0  # epoch 1 ran on the measured rung
    first.close()

    again = kafka_sink(servers, topic, max_transaction_timeout_s=CEILING_S)
    retry = coordinator(unique.job_id, again, store, hold(WRITTEN, for_seconds(2.0)))
    assert again.transaction_timeout_s == CEILING_S
    assert retry.run_epoch(1, [events([3, 4])]).outcome is EpochOutcome.COMMITTED
    assert ids(read_committed(kafka, admin, topic)) == [1, 2, 3, 4]

    retry.on_step = hold(WRITTEN, aborted_after(admin, topic, CEILING_S))
    with pytest.raises(ConfigError, match="already the longest transaction timeout"):
        retry.run_epoch(2, [events([5])])
    retry.close()
    assert ids(read_committed(kafka, admin, topic)) == [1, 2, 3, 4]
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []


@pytest.mark.fault_tier  # ~4 minutes: three batches held open 65 s each
def test_batches_longer_than_kafkas_default_timeout_commit_with_default_settings(
    kafka: KafkaEndpoint, admin: AdminClient, topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    """No timeout option: the job's first batch, held open 65 s, commits (it takes the
    broker's limit, 900 s); the measured 65 s sets the next producer's timeout to 480 s
    (4 x 65 s on the ladder 60, 120, 240, 480, 900), on which the second commits too; a
    restarted job (a new chooser, as in another process) starts at 480 s from the progress
    record's open time and commits a third. No transaction is ever aborted."""
    servers, store = kafka.bootstrap_servers, tmp_path / "store"
    sink = kafka_sink(servers, topic)
    job = coordinator(unique.job_id, sink, store, hold(WRITTEN, for_seconds(LONG_BATCH_S)))
    assert sink.transaction_timeout_s == 900.0
    assert job.run_epoch(0, [events([1, 2])]).outcome is EpochOutcome.COMMITTED
    assert job.run_epoch(1, [events([3])]).outcome is EpochOutcome.COMMITTED
    assert sink.transaction_timeout_s == 480.0
    assert sink.metrics()["rollbacks"] == 0
    job.close()

    # The chooser is one per process and cluster address: a trailing comma (an empty entry,
    # which librdkafka skips) names the same broker through a chooser with nothing learnt.
    restarted = kafka_sink(f"{servers},", topic)
    later = coordinator(unique.job_id, restarted, store, hold(WRITTEN, for_seconds(LONG_BATCH_S)))
    assert restarted.transaction_timeout_s == 480.0
    assert later.run_epoch(2, [events([4])]).outcome is EpochOutcome.COMMITTED
    assert restarted.metrics()["rollbacks"] == 0
    later.close()
    assert ids(read_committed(kafka, admin, topic)) == [1, 2, 3, 4]
    assert open_transactions(admin, topic, f"{topic}-ds-progress") == []
