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

from collections.abc import Mapping

from confluent_kafka import TopicPartition

from durable_sinks.core.protocol import JSON, CommitHandle, OpenContext

from .progress import ProgressReader, ProgressRecord, progress_key
from .recovery import latest_progress
from .writer import TransactionalProducer


def commit(
    producer: TransactionalProducer,
    context: OpenContext,
    sink: str,
    progress_topic: str,
    handle: CommitHandle,
    decision: Mapping[str, JSON] | None,
    ranges: Mapping[TopicPartition, tuple[int, int]],
    open_s: float | None = None,
    longest_open_s: float | None = None,
) -> None:
    """Produce the epoch's progress record into its transaction and commit it. `ranges`:
    each data partition's (start, end) offsets of the epoch; `open_s`, `longest_open_s`: how
    long its transaction has been open, and the longest of the recent epochs' (timeouts.py)."""
    epoch = handle.epoch
    record = ProgressRecord(
        epoch,
        context.generation,
        handle.participant,
        handle.rows,
        handle.checksum,
        decision,
        {p.partition: span for p, span in ranges.items()},
        open_s,
        longest_open_s,
    )
    producer.send_one(
        "writing the progress record",
        progress_topic,
        record.encode(),
        progress_key(context.job_id, sink),
        epoch,
    )
    producer.flush(epoch)
    producer.commit(epoch)


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
