"""Bounded waits on Kafka: a broker connection that carries nothing (the faults bed's Toxiproxy
drops every byte both ways and closes nothing, so TCP still answers; the broker advertises the
proxy, so every connection of the sink's clients goes through it) fails each call of the Kafka
sink within its request_timeout_s; the epoch fails typed (at the commit, whose answer never
arrives, InDoubtError: never guessed), and once the connection carries data again a new
coordinator lands the epoch exactly once, at its first attempt: its start reads the progress
topic without waiting for the transaction the silenced attempt left open, which its
init_transactions then aborts, long before the broker's transaction timeout would."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator, EpochOutcome, RetryPolicy
from durable_sinks.core.errors import DurableSinkError, InDoubtError, TransientError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.kafka.writer import TransactionalProducer
from tests.integration.test_kafka_sink import events, ids
from tests.support.fault_bed import FaultBed
from tests.support.kafka_reads import read_committed

REQUEST_TIMEOUT_S = 3.0
#: The transaction timeout, which librdkafka also takes as the records' delivery timeout.
TRANSACTION_TIMEOUT_S = 3.0
#: After a lost commit request: longer than the test waits for the epoch to land, so that only
#: the next start's init_transactions can end the transaction the silenced attempt left open
#: (the broker would abort it at this timeout).
LOST_COMMIT_TRANSACTION_TIMEOUT_S = 120.0
#: How long the ride-through's new coordinators keep trying (a new one every second).
RIDE_THROUGH_S = 60.0
#: No retry in place: each call fails once.
ONCE = RetryPolicy(attempts=1)
ROWS = events(list(range(50)))


def coordinator(
    bed: FaultBed,
    topic: str,
    tmp_path: Path,
    on_step: Callable[[str], None],
    transaction_timeout_s: float = TRANSACTION_TIMEOUT_S,
) -> Coordinator:
    kafka = KafkaSink(
        Kafka(
            bed.kafka_proxied.bootstrap_servers,
            topic,
            key_column="id",
            request_timeout_s=REQUEST_TIMEOUT_S,
            progress_scan_timeout_s=2 * REQUEST_TIMEOUT_S,
            transaction_timeout_s=transaction_timeout_s,
        )
    )
    files = FolderSink(Files(str(tmp_path / "files"), name="files"))
    made = Coordinator(
        "bounded",
        [files, kafka],
        LocalDirectoryStore(tmp_path / "store"),
        source="q",
        commit_retry=ONCE,
        on_step=on_step,
    )
    made.start()
    return made


#: The steps of the Kafka sink's epoch, in order: a case reaches those before its call.
STEPS = ("after-begin:kafka", "after-write:0:kafka", "after-pre-commit:kafka", "after-decision")


@pytest.mark.parametrize(
    ("step", "call", "expected"),
    [
        # The hole opens before the epoch begins (begin_epoch waits for nothing): the first
        # wait is write_batch's, for the offsets of the partitions it writes.
        ("epoch-start", "write_batch", TransientError),
        # ... after both sinks began: write_batch waits for the partitions' offsets begin_epoch
        # asked for, if they have not answered yet; else the records are produced and
        # pre_commit's flush waits for them.
        ("after-begin:kafka", "write_batch or pre_commit", TransientError),
        # ... after the records are written: pre_commit's flush.
        ("after-write:0:kafka", "pre_commit", TransientError),
        # ... after both sinks prepared: the commit first reads the records' offsets (for the
        # progress record) and sends the progress record; nothing is committed yet.
        ("after-pre-commit:kafka", "commit_with_decision", TransientError),
        # ... as the transaction's commit request is sent (everything before it answered):
        # its answer never arrives, so its outcome is unknown, never guessed.
        ("commit_transaction", "commit_with_decision", InDoubtError),
    ],
)
@pytest.mark.fault_tier
def test_a_silent_broker_connection_fails_within_the_bound_and_the_epoch_lands_once(
    fault_bed: FaultBed,
    fault_kafka_topic: str,
    tmp_path: Path,
    step: str,
    call: str,
    expected: type[DurableSinkError],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    holes: list[Any] = []
    opened_at: list[float] = []
    seen: list[str] = []

    def at(name: str) -> None:
        seen.append(name)
        if name == step and not holes:
            hole = fault_bed.kafka_proxy.black_hole()
            hole.__enter__()
            holes.append(hole)
            opened_at.append(time.monotonic())

    if step == "commit_transaction":
        # The real producer's commit, the connection silenced just before it.
        commit = TransactionalProducer.commit

        def silenced_commit(producer: TransactionalProducer, epoch: int | None = None) -> None:
            if epoch is not None:
                at("commit_transaction")
            commit(producer, epoch)

        monkeypatch.setattr(TransactionalProducer, "commit", silenced_commit)

    timeout = (
        LOST_COMMIT_TRANSACTION_TIMEOUT_S if expected is InDoubtError else TRANSACTION_TIMEOUT_S
    )
    first = coordinator(fault_bed, fault_kafka_topic, tmp_path, at, timeout)
    try:
        with pytest.raises(DurableSinkError) as raised:
            first.run_epoch(0, [ROWS])
        failed_after = time.monotonic() - opened_at[0] if opened_at else -1.0
    finally:
        for hole in holes:
            hole.__exit__(None, None, None)
        closing = time.monotonic()
        first.close()
        closed_after = time.monotonic() - closing
    assert holes, f"the job never reached {step}"
    print(
        f"{call}: {type(raised.value).__name__} {failed_after:.1f} s after the hole opened "
        f"(close {closed_after:.1f} s): {raised.value}"
    )
    assert isinstance(raised.value, expected), raised.value
    assert raised.value.sink == "kafka", raised.value
    # The call named failed: the sink got through the calls before it, not through it.
    reached = [name for name in seen if name in STEPS]
    done = {"write_batch": 1, "pre_commit": 2, "commit_with_decision": 3}
    assert reached in [list(STEPS[: done[c]]) for c in call.split(" or ")], seen
    # The call fails at its bound; the attempt's rollback (abort_transaction) may meet the
    # silence too and wait its own.
    assert REQUEST_TIMEOUT_S - 0.5 <= failed_after <= 2 * REQUEST_TIMEOUT_S + 2, failed_after

    # The ride-through: a new coordinator (and sink) per attempt until one finishes the epoch.
    # A lost commit request leaves the transaction open on the broker; the new sink's start
    # does not wait for it (its fence check reads uncommitted) and its init_transactions
    # aborts it, so the first attempt lands the epoch.
    riding = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        try:
            again = coordinator(fault_bed, fault_kafka_topic, tmp_path, lambda _name: None, timeout)
        except TransientError:
            assert time.monotonic() - riding < RIDE_THROUGH_S, "never started again"
            time.sleep(1.0)
            continue
        try:
            result = again.run_epoch(0, [ROWS])
        finally:
            again.close()
        break
    landed_after = time.monotonic() - riding
    print(f"{call}: landed {landed_after:.1f} s later, attempt {attempts}")
    assert result.outcome in (EpochOutcome.COMMITTED, EpochOutcome.ALREADY_COMMITTED)
    assert attempts == 1, attempts
    assert landed_after < 2 * REQUEST_TIMEOUT_S, landed_after
    admin = AdminClient(fault_bed.kafka_direct.config())
    assert ids(read_committed(fault_bed.kafka_direct, admin, fault_kafka_topic)) == list(range(50))
