"""Phase 2 of the Kafka sink: the commit point. The epoch's progress record (job, sink,
epoch, participant, rows, checksum, the decision it carries, the offset range written in
each partition) is produced into the epoch's still-open transaction, acknowledged, and the
transaction committed: the records and the progress record become visible atomically.

The progress record is acknowledged before the commit request, so that a fence or an
abortable error met on its way (adding the progress partition to the transaction, the
record refused) comes before the commit point, where it is certain: the caller aborts the
transaction and nothing becomes visible. What `commit_transaction` then fails with concerns
the EndTxn alone (InDoubtError: the progress topic tells)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from confluent_kafka import TopicPartition

from durable_sinks.core.protocol import JSON, CommitHandle, OpenContext

from .progress import ProgressReader, ProgressRecord, progress_key
from .recovery import latest_progress
from .transaction import RidingRecord
from .writer import TransactionalProducer


def progress_record(
    context: OpenContext,
    handle: CommitHandle,
    decision: Mapping[str, JSON] | None,
    ranges: Mapping[TopicPartition, tuple[int, int]],
    open_s: float | None = None,
    longest_open_s: float | None = None,
) -> ProgressRecord:
    """The progress record of the epoch `handle` prepared. `ranges`: each data partition's
    (start, end) offsets of the epoch, over every topic it wrote."""
    return ProgressRecord(
        handle.epoch,
        context.generation,
        handle.participant,
        handle.rows,
        handle.checksum,
        decision,
        by_topic(ranges),
        open_s,
        longest_open_s,
    )


def commit(
    producer: TransactionalProducer,
    context: OpenContext,
    sink: str,
    progress_topic: str,
    handle: CommitHandle,
    decision: Mapping[str, JSON] | None,
    ranges: Mapping[TopicPartition, tuple[int, int]],
    riding: Sequence[RidingRecord] = (),
    open_s: float | None = None,
    longest_open_s: float | None = None,
) -> None:
    """Produce the epoch's progress record, and those of the sinks `riding` in its
    transaction, into the transaction and commit it: all of them, and every member's
    records, become visible at once. `open_s`, `longest_open_s`: how long its transaction
    has been open, and the longest of the recent epochs' (timeouts.py)."""
    epoch = handle.epoch
    for other in riding:
        producer.send_one(
            "writing a riding sink's progress record", other.topic, other.value, other.key, epoch
        )
    record = progress_record(context, handle, decision, ranges, open_s, longest_open_s)
    producer.send_one(
        "writing the progress record",
        progress_topic,
        record.encode(),
        progress_key(context.job_id, sink),
        epoch,
    )
    producer.flush(epoch)
    producer.commit(epoch)


def by_topic(
    ranges: Mapping[TopicPartition, tuple[int, int]],
) -> dict[str, dict[int, tuple[int, int]]]:
    """`ranges` grouped by topic, as a progress record holds them."""
    grouped: dict[str, dict[int, tuple[int, int]]] = {}
    for part, span in ranges.items():
        grouped.setdefault(part.topic, {})[part.partition] = span
    return grouped


def committed_before(
    progress: ProgressReader, job_id: str, sink: str, progress_topic: str, handle: CommitHandle
) -> bool:
    """Whether the progress topic records `handle`'s participant as its epoch's commit."""
    record, _ = latest_progress(
        progress, job_id, sink, progress_topic, lambda r: r.epoch == handle.epoch
    )
    return record is not None and record.participant == handle.participant


def decision_of(
    progress: ProgressReader, job_id: str, sink: str, progress_topic: str, epoch: int
) -> Mapping[str, JSON] | None:
    """The decision the commit of `epoch` carried, or None."""
    record, _ = latest_progress(progress, job_id, sink, progress_topic, lambda r: r.epoch <= epoch)
    if record is None or record.epoch != epoch:
        return None
    return record.decision
