"""What `durable-sinks` reads from Kafka (core/operations.py), read_committed and read only:

- in doubt: a Kafka transaction cannot be listed by transactional id with confluent-kafka
  (no DescribeTransactions), so a partition of the topic whose last stable offset (LSO) lags
  its high watermark is reported: a transaction is open there (this job's, whose next start
  aborts it, or another writer's; `kafka-transactions.sh --describe` names its producer);
- holdings: the job's progress records per epoch (the sink's markers: participant, rows,
  when) and, with `epoch_header` (the default), the committed records of each epoch counted
  by their `ds-epoch` header over the whole topic.
"""

from __future__ import annotations

import time
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
    """Every committed record of `parts`, from the start to the last stable offset as it was
    when the read began (read_committed: aborted records and control records skipped)."""
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
        todo = {p.partition for p in parts if ends[p.partition] > 0}
        consumer.assign([TopicPartition(p.topic, p.partition, 0) for p in parts])
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
    markers: dict[int, tuple[ProgressRecord, float]] = {}
    for message in committed(settings, partitions(admin, progress_topic, timeout), timeout):
        if message.key() != progress_key:
            continue
        record = ProgressRecord.decode(message.value(), f"{progress_topic}@{message.offset()}")
        if first <= record.epoch <= last:
            markers[record.epoch] = (record, message.timestamp()[1] / 1e3)
    counts: dict[int, int] = {}
    if epoch_header:
        for message in committed(settings, partitions(admin, topic, timeout), timeout):
            for name, value in message.headers() or ():
                if name == EPOCH_HEADER and value is not None and value.isdigit():
                    epoch = int(value)
                    if first <= epoch <= last:
                        counts[epoch] = counts.get(epoch, 0) + 1
    found = {}
    for epoch in sorted(set(markers) | set(counts)):
        marker = markers.get(epoch)
        found[epoch] = Holding(
            epoch,
            marker=marker is not None,
            participants=frozenset([marker[0].participant]) if marker else frozenset(),
            rows=counts.get(epoch, 0) if epoch_header else (marker[0].rows if marker else None),
            counted=epoch_header,
            at=marker[1] if marker else None,
        )
    return found


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
