"""The progress topic (after Materialize's): where a Kafka sink records, inside each epoch's
transaction, which epoch it committed and the decision that epoch carried.

One partition, compacted. Two keys per (job, sink):
- `<owner>progress`: one record per committed epoch `{epoch, generation, participant, rows,
  checksum, decision, ranges, open_s, longest_open_s}`; compaction keeps at least the latest,
  which is all recovery needs. `ranges` maps each topic the epoch wrote, and each of its
  partitions, to `[start, end)`: the partition's high watermark read before the epoch's first
  record to that topic was produced and after its last was acknowledged, so every record of
  the epoch lies inside (the audit counts them there: operations.py). `open_s` is how long
  the epoch's transaction was open (from its first record to its progress record),
  `longest_open_s` the longest of the job's recent epochs (timeouts.py): a restarted job
  derives its transaction timeout from it;
- `<owner>fence`: `{generation}`, written when a coordinator opens the sink, so an older
  coordinator that opens it later refuses to start instead of fencing the newer producer;
- `<owner>generation`: `{generation}`, written only by a generation claim of the job's
  decision store when the sink keeps it (decisions.py), in one transaction with a fence
  record of the same generation.

Readers find a key's latest record by reading `read_committed` backwards in chunks from the
high watermark (a read_committed reader stops at the last stable offset, so a transaction left
open by another writer of the topic delays the read until it ends or times out). A read that
fails raises TransientError (UnreachableError when the cluster cannot be reached), never a
raw client error.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from durable_sinks.core.errors import (
    MALFORMED,
    DurableSinkError,
    ManifestCorruptError,
    TransientError,
)
from durable_sinks.core.formats import stored_format
from durable_sinks.core.naming import component, owner_prefix
from durable_sinks.core.protocol import JSON

from .admin import list_offsets
from .config import PROGRESS_READER_GROUP
from .errors import RAW, client_failure

PROGRESS_RECORD = stored_format(
    "Kafka progress record",
    current=1,
    oldest=1,
    where='the progress topic, key `<owner>progress`: JSON with `"version"`',
)
FENCE_RECORD = stored_format(
    "Kafka fence record",
    current=1,
    oldest=1,
    where='the progress topic, keys `<owner>fence` and `<owner>generation`: JSON with `"version"`',
)
PROGRESS_VERSION = PROGRESS_RECORD.current
#: Records read per step of a backwards scan.
SCAN_CHUNK = 2_000
#: The first chunk of a backwards scan, each next one 4x larger up to SCAN_CHUNK: the keys
#: looked for are usually among the newest records, so a long topic is not read 2,000
#: records deep for them at each start.
FIRST_CHUNK = 32
#: The longest a read of a chunk (or, for the operator's views, of a topic to its end)
#: waits for records in one call (s). A call that gets fewer records than it asks for
#: returns only when this has passed, and a chunk usually holds fewer than it asks for (it
#: ends at the high watermark, and transaction markers take offsets too), so a short wait,
#: repeated until the reader passes the chunk's end, makes a read take about the broker's
#: fetch time instead of a whole wait.
READ_WAIT = 0.002


def progress_key(job_id: str, sink: str) -> bytes:
    return (owner_prefix(job_id, sink) + "progress").encode()


def fence_key(job_id: str, sink: str) -> bytes:
    return (owner_prefix(job_id, sink) + "fence").encode()


def generation_key(job_id: str, sink: str) -> bytes:
    return (owner_prefix(job_id, sink) + "generation").encode()


def transactional_id(job_id: str, sink: str) -> str:
    """The one transactional.id of a job's sink: its producer's, and its generation claims'."""
    return f"ds:{component(job_id)}:{component(sink)}"


@dataclass(frozen=True)
class ProgressRecord:
    """One committed epoch of one sink, as stored in the progress topic."""

    epoch: int
    generation: int
    participant: str
    rows: int
    checksum: str
    decision: Mapping[str, JSON] | None
    #: Topic -> partition -> (start, end) offsets holding every record of the epoch
    #: (others' records may share them: see the module docstring).
    ranges: Mapping[str, Mapping[int, tuple[int, int]]] | None = None
    #: Seconds the epoch's transaction was open (first record to progress record), and the
    #: longest of the sink's recent epochs (timeouts.py); None in records of older versions.
    open_s: float | None = None
    longest_open_s: float | None = None

    def encode(self) -> bytes:
        fields: dict[str, Any] = {
            "version": PROGRESS_VERSION,
            "epoch": self.epoch,
            "generation": self.generation,
            "participant": self.participant,
            "rows": self.rows,
            "checksum": self.checksum,
            "decision": self.decision,
        }
        if self.ranges is not None:
            fields["ranges"] = {
                topic: {str(p): [s, e] for p, (s, e) in sorted(spans.items())}
                for topic, spans in sorted(self.ranges.items())
            }
        if self.open_s is not None:
            fields["open_s"] = round(self.open_s, 3)
        if self.longest_open_s is not None:
            fields["longest_open_s"] = round(self.longest_open_s, 3)
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    def span(self) -> int | None:
        """Offsets the ranges cover (the epoch's records, and whatever shares them)."""
        if self.ranges is None:
            return None
        return sum(end - start for spans in self.ranges.values() for start, end in spans.values())

    def topics(self) -> list[str]:
        """The topics the epoch wrote records into, sorted."""
        return sorted(self.ranges or {})

    @classmethod
    def decode(cls, value: bytes, where: str) -> ProgressRecord:
        try:
            data = json.loads(value)
            PROGRESS_RECORD.check(data.get("version"), source=f"progress record at {where}")
            return cls(
                epoch=int(data["epoch"]),
                generation=int(data["generation"]),
                participant=str(data["participant"]),
                rows=int(data["rows"]),
                checksum=str(data["checksum"]),
                decision=data.get("decision"),
                ranges=_ranges(data.get("ranges")),
                open_s=_seconds(data.get("open_s")),
                longest_open_s=_seconds(data.get("longest_open_s")),
            )
        except MALFORMED as exc:
            raise ManifestCorruptError(
                f"unreadable progress record at {where}: {exc!r}"[:500],
                fix="the progress topic holds a record this version cannot read; do not write "
                "to a progress topic by hand",
            ) from None


def _ranges(data: Any) -> dict[str, dict[int, tuple[int, int]]] | None:
    if data is None:
        return None
    ranges = {
        str(topic): {int(p): (int(r[0]), int(r[1])) for p, r in spans.items()}
        for topic, spans in data.items()
    }
    for spans in ranges.values():
        if any(end < start or start < 0 for start, end in spans.values()):
            raise ValueError(f"an offset range ends before it starts: {data!r}")
    return ranges


def _seconds(data: Any) -> float | None:
    if data is None:
        return None
    seconds = float(data)
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"a time in seconds that is not one: {data!r}")
    return seconds


def encode_fence(generation: int) -> bytes:
    return json.dumps({"version": FENCE_RECORD.current, "generation": generation}).encode()


def decode_fence(value: bytes, where: str) -> int:
    try:
        data = json.loads(value)
        FENCE_RECORD.check(data.get("version"), source=f"fence record at {where}")
        return int(data["generation"])
    except MALFORMED as exc:
        raise ManifestCorruptError(f"unreadable fence record at {where}: {exc!r}"[:500]) from None


def fence_holder(topic: str, found: Mapping[bytes, tuple[int, bytes]]) -> int | None:
    """The newest generation in `found`: fence and generation records only, key -> (offset,
    value) as ProgressReader.latest returns them; None when it is empty."""
    held = [decode_fence(value, f"{topic}@{offset}") for offset, value in found.values()]
    return max(held, default=None)


def _left(deadline: float) -> float:
    """The seconds left before `deadline`, at least a moment for one request."""
    return max(deadline - time.monotonic(), 0.1)


class ProgressReader:
    """Reads the latest records of given keys from a one-partition progress topic, through
    one read_committed consumer kept for the reader's life (`close` releases it). A read
    takes `timeout` seconds at most (progress_scan_timeout_s), of which its requests for the
    topic's metadata and offsets `request_timeout` (request_timeout_s): a topic that cannot
    be found (deleted, or its leader unknown) fails the read after that."""

    def __init__(
        self,
        admin: AdminClient,
        client_config: Mapping[str, Any],
        topic: str,
        timeout: float,
        describe: Callable[[], dict[str, Any]],
        *,
        request_timeout: float,
    ) -> None:
        self.admin = admin
        self.client_config = dict(client_config)
        self.topic = topic
        self.timeout = timeout
        self.request_timeout = request_timeout
        #: The job/sink context for errors.
        self.describe = describe
        #: The consumers by isolation level (read_committed, read_uncommitted), made when
        #: first needed.
        self._consumers: dict[str, Consumer] = {}

    def _reader(self, deadline: float, isolation: str) -> Consumer:
        consumer = self._consumers.get(isolation)
        if consumer is None:
            consumer = Consumer(  # settings checked at open: only memory can fail here
                {
                    **self.client_config,
                    "group.id": PROGRESS_READER_GROUP,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": isolation,
                    "enable.partition.eof": False,
                    "fetch.wait.max.ms": 10,
                }
            )
            self._consumers[isolation] = consumer
            # The topic's metadata now: an assignment to a topic librdkafka knows nothing of
            # starts fetching only at its once-a-second scan for unknown topics.
            consumer.list_topics(self.topic, timeout=_left(deadline))
        return consumer

    def close(self) -> None:
        """Release the consumers (a failure to leave cleanly is of no consequence: they have
        no group membership nor offsets to commit)."""
        consumers, self._consumers = list(self._consumers.values()), {}
        for consumer in consumers:
            try:
                consumer.close()
            except (*RAW, RuntimeError):
                pass

    def _failed(self, exc: BaseException) -> DurableSinkError:
        return client_failure(
            exc, f"cannot read the progress topic {self.topic!r}", self.describe()
        )

    def watermarks(self, deadline: float) -> tuple[int, int]:
        """(low, high) of the partition, read_uncommitted; both read before `deadline`
        (time.monotonic())."""
        partition = TopicPartition(self.topic, 0)
        level = IsolationLevel.READ_UNCOMMITTED
        try:
            low = list_offsets(self.admin, [partition], level, _left(deadline), earliest=True)
            high = list_offsets(self.admin, [partition], level, _left(deadline))
        except KafkaException as exc:
            raise self._failed(exc) from None
        return low[partition], high[partition]

    def latest(
        self, want: Mapping[bytes, Callable[[bytes, int], bool]], *, committed: bool = True
    ) -> dict[bytes, tuple[int, bytes]]:
        """For each key of `want`, the value and offset of the latest committed record with
        that key for which `want[key](value, offset)` is true; keys never found are absent.
        Scans backwards from the high watermark, in chunks growing from FIRST_CHUNK to
        SCAN_CHUNK records, until every key is found or the partition's start is reached;
        raises TransientError after `timeout` seconds (`request_timeout` when the topic's
        offsets cannot be read). A committed read waits for every
        transaction open below the high watermark to end; `committed=False` reads the records
        of open and aborted transactions too, and never waits for one."""
        deadline = time.monotonic() + self.timeout
        requests = min(deadline, time.monotonic() + self.request_timeout)
        low, end = self.watermarks(requests)
        found: dict[bytes, tuple[int, bytes]] = {}
        isolation = "read_committed" if committed else "read_uncommitted"
        try:
            consumer = self._reader(requests, isolation)
            try:
                size = FIRST_CHUNK
                while end > low and len(found) < len(want):
                    start = max(low, end - size)
                    size = min(size * 4, SCAN_CHUNK)
                    chunk = self._read(consumer, start, end, deadline)
                    for offset, key, value in reversed(chunk):
                        check = want.get(key)
                        if check is not None and key not in found and check(value, offset):
                            found[key] = (offset, value)
                    end = start
            finally:
                consumer.unassign()  # an assigned consumer keeps fetching in the background
        except RAW as exc:
            raise self._failed(exc) from None
        return found

    def _read(
        self, consumer: Consumer, start: int, end: int, deadline: float
    ) -> list[tuple[int, bytes, bytes]]:
        """The records `consumer` reads in [start, end): waits until it passes `end - 1`
        (control records are skipped, and a read_committed consumer's aborted records)."""
        partition = TopicPartition(self.topic, 0, start)
        # Without unassign, a new assignment keeps reporting the previous one's position.
        consumer.unassign()
        consumer.assign([partition])
        records: list[tuple[int, bytes, bytes]] = []
        while True:
            position = consumer.position([TopicPartition(self.topic, 0)])[0].offset
            if position >= end:
                return [r for r in records if r[0] < end]
            if time.monotonic() > deadline:
                raise TransientError(
                    f"reading the progress topic {self.topic!r} took more than {self.timeout:g} s: "
                    f"a read_committed reader is held at offset {position} (of {end}), most likely "
                    "by another writer's transaction that is still open",
                    **self.describe(),
                    fix="wait for that transaction to end or time out (transaction.timeout.ms), "
                    "or give this sink a progress topic of its own (progress_topic=...)",
                )
            messages = consumer.consume(num_messages=500, timeout=READ_WAIT)
            for message in messages:
                error = message.error()
                if error is not None:
                    raise self._failed(KafkaException(error))
                offset, key, value = message.offset(), message.key(), message.value()
                if offset is not None and key is not None and value is not None:
                    records.append((offset, key, value))
