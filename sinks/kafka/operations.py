"""What `durable-sinks` reads from Kafka (core/operations.py), read_committed and read only:

- in doubt: a Kafka transaction cannot be listed by transactional id with confluent-kafka
  (no DescribeTransactions), so a partition of the sink's topics (its topic, or those its
  newest progress record names) whose last stable offset (LSO) lags its high watermark is
  reported: a transaction is open there (this job's, whose next start aborts it, or another
  writer's; `kafka-transactions.sh --describe` names its producer);
- holdings: the job's progress records per epoch (the sink's markers: participant, rows,
  when) and the committed records of each epoch, counted in every topic the epoch wrote:
  with `epoch_header`, by their `ds-epoch` header over those whole topics; without it (the
  default), inside the offset ranges the epoch's progress records name (progress.py). A
  range holds every record of its epoch and, when another producer wrote the same
  partitions during the epoch, theirs too:
  its progress record says how many offsets the range spans against the epoch's rows, so
  such a range is known. Where a range holds only the epoch's records, the count proves the
  epoch once, with its rows; where it is shared and the count stays within what the other
  offsets can hold, the epoch's rows are reported from its markers (not counted: the records
  carry nothing that tells theirs from ours); a count outside that is a problem;
- drop (`drop_job`, the one call here that writes, with `apply`): the job's progress, fence
  and generation records, by a tombstone per key, or the whole progress topic when it is
  the sink's default one and holds no other job's or sink's records.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from durable_sinks.core.errors import DurableSinkError, TransientError
from durable_sinks.core.naming import owner_prefix
from durable_sinks.core.operations import Bookkeeping, Holding, Prepared
from durable_sinks.core.protocol import CommitHandle

from .admin import list_offsets
from .config import PROGRESS_READER_GROUP
from .handles import KafkaHandleDetails
from .progress import READ_WAIT, ProgressRecord
from .records import EPOCH_HEADER


def partitions(admin: AdminClient, topic: str, timeout: float) -> list[TopicPartition]:
    found = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if found is None or found.error is not None:
        return []
    return [TopicPartition(topic, p) for p in sorted(found.partitions)]


def in_doubt(
    admin: AdminClient,
    topics: list[str],
    timeout: float,
    handle: Callable[[str], CommitHandle],
) -> list[Prepared]:
    """One entry when some partition of `topics` has an open transaction (LSO < high
    watermark); `handle(what)` names the participant it most likely is."""
    parts = [p for topic in topics for p in partitions(admin, topic, timeout)]
    if not parts:
        return []
    stable = list_offsets(admin, parts, IsolationLevel.READ_COMMITTED, timeout)
    high = list_offsets(admin, parts, IsolationLevel.READ_UNCOMMITTED, timeout)
    held: dict[str, list[int]] = {}
    for p in parts:
        if stable[p] < high[p]:
            held.setdefault(p.topic, []).append(p.partition)
    if not held:
        return []
    where = "; ".join(
        f"partition{'s' if len(found) > 1 else ''} {', '.join(map(str, found))} of topic {topic!r}"
        for topic, found in sorted(held.items())
    )
    what = (
        f"an open transaction holds {where} (last stable offset behind the high watermark): "
        "this job's producer's, or another writer's"
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
        ends: dict[tuple[str, int], int] = {}
        for p in parts:
            _low, high = consumer.get_watermark_offsets(p, timeout=timeout, cached=False)
            ends[(p.topic, p.partition)] = high
        begins = {(p.topic, p.partition): max(p.offset, 0) for p in parts}
        todo = {key for key in ends if ends[key] > begins[key]}
        consumer.assign([TopicPartition(t, n, begins[(t, n)]) for t, n in begins])
        deadline = time.monotonic() + max(timeout, 10.0) * 6
        while todo:
            if time.monotonic() > deadline:
                names = ", ".join(sorted({t for t, _ in todo}))
                raise TransientError(
                    f"reading {names} to the end did not finish in time: an open transaction "
                    "may hold it",
                    fix="run the command again once the transaction ended (or timed out)",
                )
            for message in consumer.consume(num_messages=1000, timeout=READ_WAIT):
                if message.error() is not None:
                    raise KafkaException(message.error())
                yield message
            positions = consumer.position([TopicPartition(t, n) for t, n in begins])
            for position in positions:
                key = (position.topic, position.partition)
                if position.offset >= ends[key]:
                    todo.discard(key)
    finally:
        consumer.close()


def holdings(
    settings: Mapping[str, Any],
    admin: AdminClient,
    topic: str | None,
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
    records = [record for found in markers.values() for record, _ in found]
    if epoch_header:
        topics = sorted({t for r in records for t in r.topics()} | ({topic} if topic else set()))
        counts = _counts_by_header(settings, admin, topics, first, last, timeout)
    else:
        counts = _counts_in_ranges(settings, admin, records, timeout)
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
    topics: list[str],
    first: int,
    last: int,
    timeout: float,
) -> dict[int, int]:
    """Committed records per epoch in `first..last` over `topics`, by their `ds-epoch`
    header."""
    counts: dict[int, int] = {}
    parts = [p for topic in topics for p in partitions(admin, topic, timeout)]
    for message in committed(settings, parts, timeout):
        for name, value in message.headers() or ():
            if name == EPOCH_HEADER and value is not None and value.isdigit():
                epoch = int(value)
                if first <= epoch <= last:
                    counts[epoch] = counts.get(epoch, 0) + 1
    return counts


def _counts_in_ranges(
    settings: Mapping[str, Any],
    admin: AdminClient,
    records: list[ProgressRecord],
    timeout: float,
) -> dict[int, int]:
    """Committed records per epoch inside the offset ranges `records` name, in every topic
    (every progress record of an epoch counts: an epoch committed twice holds both ranges).
    A partition a range names that the topic no longer has counts nothing."""
    ranges: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for record in records:
        for topic, spans in (record.ranges or {}).items():
            for partition, (start, end) in spans.items():
                if end > start:
                    ranges.setdefault((topic, partition), []).append((start, end, record.epoch))
    for found in ranges.values():
        found.sort()
    starts = {key: [start for start, _, _ in found] for key, found in ranges.items()}
    counts = {record.epoch: 0 for record in records if record.ranges is not None}
    topics = sorted({topic for topic, _ in ranges})
    parts = [
        p
        for topic in topics
        for p in partitions(admin, topic, timeout)
        if (p.topic, p.partition) in ranges
    ]
    for p in parts:  # read from the first range on
        p.offset = ranges[(p.topic, p.partition)][0][0]
    for message in committed(settings, parts, timeout):
        key, offset = (message.topic(), message.partition()), message.offset()
        at = bisect_right(starts[key], offset) - 1
        if at >= 0:
            _start, end, epoch = ranges[key][at]
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

    topics = set(opened.routed) | ({sink.config.topic} if sink.config.topic else set())
    if sink.config.topic is None:  # the topics the newest epoch wrote, too
        from .recovery import latest_progress

        record, _ = latest_progress(
            opened.progress,
            opened.context.job_id,
            sink.name,
            sink.config.progress_topic_name,
            lambda r: True,
        )
        topics |= set(record.topics() if record is not None else ())
    timeout = sink.config.request_timeout_s
    return in_doubt(opened.cluster.admin, sorted(topics), timeout, handle)


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


#: Why the transactional.id stays.
TRANSACTIONAL_ID_KEPT = (
    "Kafka has no call to delete a transactional.id: the broker forgets it after "
    "transactional.id.expiration.ms (7 days by default) without use"
)


def progress_keys(config: Any, opened: Any) -> dict[bytes, bool]:
    """Every key of the progress topic, read_committed from its start, with whether its
    latest record is a value (True) or a tombstone (False)."""
    reader = opened.progress
    deadline = time.monotonic() + config.progress_scan_timeout_s
    requests = min(deadline, time.monotonic() + config.request_timeout_s)
    low, high = reader.watermarks(requests)
    latest: dict[bytes, bool] = {}
    if high <= low:
        return latest
    consumer = reader._reader(requests, "read_committed")
    try:
        consumer.unassign()
        consumer.assign([TopicPartition(reader.topic, 0, low)])
        while True:
            position = consumer.position([TopicPartition(reader.topic, 0)])[0].offset
            if position >= high:
                return latest
            if time.monotonic() > deadline:
                raise TransientError(
                    f"reading the progress topic {reader.topic!r} took more than "
                    f"{config.progress_scan_timeout_s:g} s (held at offset {position} of {high}, "
                    "most likely by another writer's open transaction)",
                    **reader.describe(),
                    fix="wait for that transaction to end or time out, then run drop again",
                )
            for message in consumer.consume(num_messages=500, timeout=READ_WAIT):
                error = message.error()
                if error is not None:
                    raise KafkaException(error)
                offset, key = message.offset(), message.key()
                if offset is not None and offset < high and key is not None:
                    latest[key] = message.value() is not None
    finally:
        consumer.unassign()


def drop_job(
    config: Any, opened: Any, job_id: str, sink: str, *, apply: bool, records: bool = True
) -> list[Bookkeeping]:
    """The job and sink's records in the progress topic (progress, fence, generation) and
    its transactional.id (kept: Kafka cannot delete one). With `apply`: when the progress
    topic is the sink's default `<topic>-ds-progress` and every key in it is this sink's,
    the topic is deleted; otherwise a tombstone is produced for each of the sink's keys
    (log compaction then removes them; other jobs' records stay). The user's topics are
    never touched. `records=False`: the progress topic does not exist (nothing to read)."""
    from .progress import transactional_id

    topic = config.progress_topic_name
    owner = owner_prefix(job_id, sink).encode()
    keys = progress_keys(config, opened) if records else {}
    ours = sorted(k for k, live in keys.items() if k.startswith(owner) and live)
    own_topic = config.progress_topic is None and all(k.startswith(owner) for k in keys)
    found = []
    if own_topic and keys:
        found.append(Bookkeeping("progress topic (only this sink's records)", topic, len(ours)))
    elif ours:
        found.append(Bookkeeping("progress records (tombstones)", topic, len(ours)))
    txn = transactional_id(job_id, sink)
    found.append(Bookkeeping("transactional.id", txn, 1, TRANSACTIONAL_ID_KEPT))
    if apply and own_topic and keys:
        _delete_topic(opened.cluster.admin, topic, config.request_timeout_s, job_id, sink)
    elif apply and ours:
        _tombstones(config, topic, ours, job_id, sink)
    return found


def _delete_topic(admin: AdminClient, topic: str, timeout: float, job: str, sink: str) -> None:
    futures = admin.delete_topics([topic], operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[topic].result(timeout=timeout + 5)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if getattr(error, "name", lambda: "")() == "UNKNOWN_TOPIC_OR_PART":
            return  # deleted already
        raise DurableSinkError(
            f"could not delete the progress topic {topic!r}: {error}",
            job=job,
            sink=sink,
            fix="grant DeleteTopics on it (or delete it with kafka-topics --delete), then run "
            "drop --apply again",
        ) from None


def _tombstones(config: Any, topic: str, keys: list[bytes], job: str, sink: str) -> None:
    from confluent_kafka import Producer

    failed: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(str(error))

    producer = Producer({**config.connection_settings(), "acks": "all", "enable.idempotence": True})
    for key in keys:
        producer.produce(topic, key=key, value=None, partition=0, on_delivery=delivered)
    left = producer.flush(config.request_timeout_s)
    if left or failed:
        raise DurableSinkError(
            f"could not write {len(keys)} tombstone(s) into the progress topic {topic!r}: "
            f"{failed[0] if failed else f'{left} not acknowledged in time'}",
            job=job,
            sink=sink,
            fix="check the cluster and Write on the topic, then run drop --apply again",
        )
