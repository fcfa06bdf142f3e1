"""What `durable-sinks` reads from Kafka (core/operations.py), read_committed and read only:

- in doubt: a Kafka transaction cannot be listed by transactional id with confluent-kafka
  (no DescribeTransactions), so a partition of the topic whose last stable offset (LSO) lags
  its high watermark is reported: a transaction is open there (this job's, whose next start
  aborts it, or another writer's; `kafka-transactions.sh --describe` names its producer);
- holdings: the job's progress records per epoch (the sink's markers: participant, rows,
  when) and the committed records of each epoch, counted: with `epoch_header`, by their
  `ds-epoch` header over the whole topic; without it (the default), inside the offset
  ranges the epoch's progress records name (progress.py). A range holds every record of its
  epoch and, when another producer wrote the same partitions during the epoch, theirs too:
  its progress record says how many offsets the range spans against the epoch's rows, so
  such a range is known. Where a range holds only the epoch's records, the count proves the
  epoch once, with its rows; where it is shared and the count stays within what the other
  offsets can hold, the epoch's rows are reported from its markers (not counted: the records
  carry nothing that tells theirs from ours); a count outside that is a problem.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from durable_sinks.core.errors import TransientError
from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import CommitHandle

from .admin import list_offsets
from .config import PROGRESS_READER_GROUP
from .handles import KafkaHandleDetails
from .progress import ProgressRecord
from .records import EPOCH_HEADER


def partitions(admin: AdminClient, topic: str, timeout: float) -> list[TopicPartition]:
    found = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if found is None or found.error is not None:
        return []
    return [TopicPartition(topic, p) for p in sorted(found.partitions)]


def in_doubt(
    admin: AdminClient,
    topic: str,
    timeout: float,
    handle: Callable[[str], CommitHandle],
) -> list[Prepared]:
    """One entry when some partition of `topic` has an open transaction (LSO < high
    watermark); `handle(what)` names the participant it most likely is."""
    parts = partitions(admin, topic, timeout)
    if not parts:
        return []
    stable = list_offsets(admin, parts, IsolationLevel.READ_COMMITTED, timeout)
    high = list_offsets(admin, parts, IsolationLevel.READ_UNCOMMITTED, timeout)
    held = [p.partition for p in parts if stable[p] < high[p]]
    if not held:
        return []
    what = (
        f"an open transaction holds partition{'s' if len(held) > 1 else ''} "
        f"{', '.join(map(str, held))} of topic {topic!r} (last stable offset behind the high "
        "watermark): this job's producer's, or another writer's"
    )
    return [Prepared(handle(what), what)]


def committed(
    settings: Mapping[str, Any], parts: list[TopicPartition], timeout: float
) -> Iterator[Any]:
    """Every committed record of `parts`, from each one's offset (its start when none is
    set) to the last stable offset as it was when the read began (read_committed: aborted
    records and control records skipped)."""
    if not parts:
        return
    consumer = Consumer(
        {
            **settings,
            "group.id": PROGRESS_READER_GROUP,  # one group to grant (docs/security.md)
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
    )
    try:
        ends: dict[int, int] = {}
        for p in parts:
            _low, high = consumer.get_watermark_offsets(p, timeout=timeout, cached=False)
            ends[p.partition] = high
        begins = {p.partition: max(p.offset, 0) for p in parts}
        todo = {p.partition for p in parts if ends[p.partition] > begins[p.partition]}
        consumer.assign([TopicPartition(p.topic, p.partition, begins[p.partition]) for p in parts])
        deadline = time.monotonic() + max(timeout, 10.0) * 6
        while todo:
            if time.monotonic() > deadline:
                raise TransientError(
                    f"reading topic {parts[0].topic!r} to its end did not finish in time: an "
                    "open transaction may hold it",
                    fix="run the command again once the transaction ended (or timed out)",
                )
            for message in consumer.consume(num_messages=1000, timeout=0.2):
                if message.error() is not None:
                    raise KafkaException(message.error())
                yield message
            positions = consumer.position([TopicPartition(p.topic, p.partition) for p in parts])
            for position in positions:
                if position.offset >= ends[position.partition]:
                    todo.discard(position.partition)
    finally:
        consumer.close()


def holdings(
    settings: Mapping[str, Any],
    admin: AdminClient,
    topic: str,
    progress_topic: str,
    progress_key: bytes,
    epoch_header: bool,
    first: int,
    last: int,
    timeout: float,
) -> dict[int, Holding]:
    markers: dict[int, list[tuple[ProgressRecord, float]]] = {}
    for message in committed(settings, partitions(admin, progress_topic, timeout), timeout):
        if message.key() != progress_key:
            continue
        record = ProgressRecord.decode(message.value(), f"{progress_topic}@{message.offset()}")
        if first <= record.epoch <= last:
            markers.setdefault(record.epoch, []).append((record, message.timestamp()[1] / 1e3))
    if epoch_header:
        counts = _counts_by_header(settings, admin, topic, first, last, timeout)
    else:
        records = [record for found in markers.values() for record, _ in found]
        counts = _counts_in_ranges(settings, admin, topic, records, timeout)
    held = {}
    for epoch in sorted(set(markers) | set(counts)):
        marked = markers.get(epoch, [])
        rows: int | None = counts.get(epoch, 0)
        counted = True
        problems: tuple[str, ...] = ()
        if not epoch_header:
            rows, counted, problems = _attributed(epoch, [r for r, _ in marked], counts)
        held[epoch] = Holding(
            epoch,
            marker=bool(marked),
            participants=frozenset(r.participant for r, _ in marked),
            rows=rows,
            counted=counted,
            at=max(at for _, at in marked) if marked else None,
            problems=problems,
        )
    return held


def _counts_by_header(
    settings: Mapping[str, Any],
    admin: AdminClient,
    topic: str,
    first: int,
    last: int,
    timeout: float,
) -> dict[int, int]:
    """Committed records per epoch in `first..last`, by their `ds-epoch` header."""
    counts: dict[int, int] = {}
    for message in committed(settings, partitions(admin, topic, timeout), timeout):
        for name, value in message.headers() or ():
            if name == EPOCH_HEADER and value is not None and value.isdigit():
                epoch = int(value)
                if first <= epoch <= last:
                    counts[epoch] = counts.get(epoch, 0) + 1
    return counts


def _counts_in_ranges(
    settings: Mapping[str, Any],
    admin: AdminClient,
    topic: str,
    records: list[ProgressRecord],
    timeout: float,
) -> dict[int, int]:
    """Committed records per epoch inside the offset ranges `records` name (every
    progress record of an epoch counts: an epoch committed twice holds both ranges)."""
    ranges: dict[int, list[tuple[int, int, int]]] = {}
    for record in records:
        for partition, (start, end) in (record.ranges or {}).items():
            if end > start:
                ranges.setdefault(partition, []).append((start, end, record.epoch))
    for spans in ranges.values():
        spans.sort()
    starts = {p: [start for start, _, _ in spans] for p, spans in ranges.items()}
    counts = {record.epoch: 0 for record in records if record.ranges is not None}
    parts = [p for p in partitions(admin, topic, timeout) if p.partition in ranges]
    for p in parts:  # read from the first range on
        p.offset = ranges[p.partition][0][0]
    for message in committed(settings, parts, timeout):
        partition, offset = message.partition(), message.offset()
        at = bisect_right(starts[partition], offset) - 1
        if at >= 0:
            _start, end, epoch = ranges[partition][at]
            if offset < end:
                counts[epoch] += 1
    return counts


def _attributed(
    epoch: int, marked: list[ProgressRecord], counts: Mapping[int, int]
) -> tuple[int | None, bool, tuple[str, ...]]:
    """(rows, counted, problems) of an epoch counted in its offset ranges (the module
    docstring says when the count is the epoch's own)."""
    if not marked:
        return None, False, ()
    rows = sum(r.rows for r in marked)
    spans = [r.span() for r in marked]
    if any(span is None for span in spans):  # written before progress records had ranges
        return rows, False, ()
    counted = counts.get(epoch, 0)
    shared = sum(span or 0 for span in spans) - rows  # offsets in the ranges not the epoch's
    if counted == rows or shared <= 0:
        return counted, True, ()
    if rows < counted <= rows + shared:
        return rows, False, ()
    return (
        counted,
        True,
        (
            f"its offset ranges hold {counted} committed records for {rows} rows, though "
            f"only {shared} of their offsets can be another writer's",
        ),
    )


def sink_in_doubt(sink: Any, opened: Any, last_committed: int | None) -> list[Prepared]:
    """`in_doubt` of an open KafkaSink (`opened` its clients): an open transaction is most
    likely the epoch after the last committed one, by the job's own producer."""
    transactional_id = opened.producer.transactional_id
    epoch = 0 if last_committed is None else last_committed + 1

    def handle(what: str) -> CommitHandle:
        return CommitHandle(
            sink.name,
            epoch,
            f"{transactional_id} (open transaction)",
            0,
            0,
            "",
            KafkaHandleDetails(transactional_id, note=what).to_json(),
        )

    return in_doubt(opened.cluster.admin, sink.config.topic, sink.config.request_timeout_s, handle)


def sink_holdings(config: Any, opened: Any, first: int, last: int) -> dict[int, Holding]:
    """`holdings` of an open KafkaSink (`opened` its clients)."""
    from .progress import progress_key

    context = opened.context
    return holdings(
        config.connection_settings(),
        opened.cluster.admin,
        config.topic,
        config.progress_topic_name,
        progress_key(context.job_id, context.sink),
        config.epoch_header,
        first,
        last,
        config.request_timeout_s,
    )
