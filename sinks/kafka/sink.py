"""Exactly-once into a Kafka topic through Kafka transactions (confluent-kafka / librdkafka):
the protocol's methods; the pieces they use are in config, admin, producer, errors, records,
progress, and operations (what `durable-sinks` reads).

A Kafka transaction cannot be prepared and resumed by another process, so this sink is the
job's *last resource* (docs/protocol.md): the coordinator prepares every other sink first,
then commits this sink's transaction, which carries the epoch's decision in a progress record,
then commits the others. Its commit is the job's commit point.

What is durable when:
- after `pre_commit`: every record of the epoch is acknowledged by the brokers (acks=all)
  inside an open transaction: invisible to read_committed readers, lost if this process dies;
- after `commit_with_decision`: the records and the progress record
  `(job, sink, epoch, decision)` are committed atomically, and read_committed readers of the
  partitions written see them (the sink waits for the last stable offset to pass them);
- a crash before that commit leaves an open transaction that the next `open` (its
  `init_transactions` on the same transactional.id) aborts: nothing becomes visible.

Fencing: one stable `transactional.id` per (job, sink). `open` first checks the fence record
in the progress topic (an older coordinator refuses to start), then `init_transactions` bumps
the producer epoch so any older producer's next call fails fatally (`FencedError`), then it
writes its own generation as the new fence record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from durable_sinks.core.errors import (
    FencedError,
    InDoubtError,
    ParticipantLostError,
    SchemaMismatchError,
    TransientError,
    UsageError,
)
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.naming import ParticipantName, component
from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import (
    JSON,
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)

from . import operations
from .admin import Cluster, TopicFacts
from .clientlog import ClientLog
from .config import Kafka
from .errors import typed
from .producer import TransactionalProducer
from .progress import (
    ProgressReader,
    ProgressRecord,
    decode_fence,
    encode_fence,
    fence_key,
    progress_key,
)
from .records import RECORD_OVERHEAD, Records, build_records


class _Epoch:
    """One attempt at an epoch: what its open transaction holds so far."""

    def __init__(self, epoch: int, name: ParticipantName) -> None:
        self.epoch = epoch
        self.name = name
        self.rows = 0
        self.bytes = 0
        self.checksum = 0
        self.prepared: CommitHandle | None = None


class _Opened:
    """The clients `open` makes for one generation."""

    def __init__(self, sink: KafkaSink, context: OpenContext) -> None:
        self.context = context
        #: Every client's librdkafka logs and error callbacks, rate-limited (clientlog.py).
        self.clientlog = ClientLog(context.job_id, sink.name)
        settings = {**sink.config.connection_settings(), **self.clientlog.settings()}
        log = JobLogger(context.job_id, sink.name, component="sinks.kafka")
        transactional_id = f"ds:{component(context.job_id)}:{component(sink.name)}"
        self.producer = TransactionalProducer(
            sink.config, transactional_id, sink._where, log, self.clientlog, sink._newer_owner
        )
        # Every producer setting is checked before any client connects or topic is made.
        self.producer.check_settings()
        self.cluster = Cluster(sink.config, settings, sink._where, log, self.clientlog.refusals)
        self.progress = ProgressReader(
            self.cluster.admin,
            settings,
            sink.config.progress_topic_name,
            sink.config.progress_scan_timeout_s,
            sink._where,
        )
        self.topic = TopicFacts(0, 0)


class KafkaSink:
    """Exactly-once into one Kafka topic; the job's last resource (see the module docs)."""

    def __init__(self, config: Kafka) -> None:
        self.config = config
        self._opened: _Opened | None = None
        self._job: str | None = None  # the job that opens it, for errors while opening
        self._current: _Epoch | None = None
        self._attempts: dict[int, int] = {}
        self._last_committed: int | None = None
        self._last_known = False
        self._checked_schema: pa.Schema | None = None
        self._counters = dict.fromkeys(("rows", "bytes", "epochs_committed", "commit_seconds"), 0.0)

    @property
    def name(self) -> str:
        return self.config.name

    def __repr__(self) -> str:
        return f"KafkaSink(name={self.name!r}, topic={self.config.topic!r})"

    # -- context -------------------------------------------------------------------------------
    def _state(self) -> _Opened:
        if self._opened is None:
            raise UsageError(f"{self!r} is not open; the coordinator opens sinks")
        return self._opened

    def _ctx(self) -> OpenContext:
        return self._state().context

    def _where(self, epoch: int | None = None) -> dict[str, Any]:
        return {"job": self._job, "sink": self.name, "epoch": epoch}

    def _log(self, epoch: int | None = None) -> JobLogger:
        job = self._opened.context.job_id if self._opened else "-"
        return JobLogger(job, self.name, epoch, component="sinks.kafka")

    @property
    def transactional_id(self) -> str:
        return self._state().producer.transactional_id

    # -- open ----------------------------------------------------------------------------------
    @typed("opening the sink")
    def open(self, context: OpenContext) -> None:
        self._job = context.job_id
        self._opened = opened = _Opened(self, context)
        if context.inspect:  # an operator's tool: read only (no topic made, no producer)
            return
        try:
            opened.topic = opened.cluster.check()
            self._start_producer(context.generation)
        except BaseException:
            self.close()  # a refused open holds no client
            raise

    def _start_producer(self, generation: int) -> None:
        """Refuse if a newer generation holds the fence; take over the transactional.id
        (aborting what an older producer left open); write this generation as the fence;
        read the last committed epoch."""
        state = self._state()
        fence = fence_key(state.context.job_id, self.name)
        self._check_fence(state.progress.latest({fence: _any}).get(fence), generation)
        producer = state.producer
        producer.start()
        producer.write_alone(
            "writing the fence record",
            self.config.progress_topic_name,
            encode_fence(generation),
            fence,
        )
        # The older producer's transaction is settled now: the progress topic is exact.
        record, holder = self._latest_progress(lambda r: True, fence)
        self._check_fence(holder, generation)
        self._last_committed = record.epoch if record is not None else None
        self._last_known = True
        self._log().info(
            "producer %s ready for generation %d; last committed epoch %s",
            producer.transactional_id,
            generation,
            self._last_committed,
        )

    def _newer_owner(self) -> bool:
        """Whether a newer generation than this sink's holds the fence record (read when
        the producer must tell a fence from a transaction time-out)."""
        state = self._state()
        fence = fence_key(state.context.job_id, self.name)
        holder = self._holder(state.progress.latest({fence: _any}).get(fence))
        return holder is not None and holder > state.context.generation

    def _holder(self, found: tuple[int, bytes] | None) -> int | None:
        """The generation in a fence record (offset, value), if any."""
        if found is None:
            return None
        return decode_fence(found[1], f"{self.config.progress_topic_name}@{found[0]}")

    def _check_fence(self, found: tuple[int, bytes] | None, generation: int) -> None:
        """`found` is the latest fence record (offset, value), if any."""
        holder = self._holder(found)
        if holder is not None and holder > generation:
            self._state().producer.refuse(
                FencedError(
                    f"generation {holder} of this job already opened the sink; this "
                    f"coordinator (generation {generation}) is older and must stop",
                    **self._where(),
                    fix="nothing to do here: the newer coordinator owns the job",
                )
            )

    def _latest_progress(
        self, accept: Callable[[ProgressRecord], bool], fence: bytes | None = None
    ) -> tuple[ProgressRecord | None, tuple[int, bytes] | None]:
        """The latest progress record `accept`s and, in the same scan, the latest fence
        record (offset, value) when `fence` is given."""
        state = self._state()
        key = progress_key(state.context.job_id, self.name)
        topic = self.config.progress_topic_name
        decoded: dict[int, ProgressRecord] = {}

        def check(value: bytes, offset: int) -> bool:
            decoded[offset] = ProgressRecord.decode(value, f"{topic}@{offset}")
            return accept(decoded[offset])

        want: dict[bytes, Callable[[bytes, int], bool]] = {key: check}
        if fence is not None:
            want[fence] = _any
        found = state.progress.latest(want)
        record = decoded[found[key][0]] if key in found else None
        return record, found.get(fence) if fence is not None else None

    # -- protocol ------------------------------------------------------------------------------
    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(exactly_once=True, two_phase_commit=True)

    def schema(self) -> pa.Schema | None:
        return self._checked_schema

    def metrics(self) -> Mapping[str, float]:
        aborts = 0 if self._opened is None else self._opened.producer.aborts
        return {**self._counters, "rollbacks": float(aborts)}

    @typed("checking the Kafka cluster")
    def health_check(self) -> None:
        state = self._state()
        state.producer.require()
        state.cluster.health_check()

    @typed("closing the sink")
    def close(self) -> None:
        """Release the clients. An open transaction is left to the broker (it aborts it at
        transaction.timeout.ms, or the next open aborts it at once). Every client handle is
        dropped, so a closed sink that something still references holds none (each
        librdkafka client takes one of the process's 1,024 thread-local keys until freed)."""
        opened, self._opened, self._current = self._opened, None, None
        if opened is not None:
            opened.producer.close()
            opened.progress.close()
            opened.clientlog.flush()

    @typed("beginning the epoch")
    def begin_epoch(self, epoch: int) -> None:
        producer = self._state().producer
        if producer.broken and producer.fenced is None:
            self._log(epoch).warning("replacing the producer after a fatal error")
            self._start_producer(self._ctx().generation)
        producer.require(epoch)
        if self._current is not None:
            self._abort()
        attempt = self._attempts.get(epoch, 0)
        self._attempts[epoch] = attempt + 1
        producer.begin(epoch)
        self._current = _Epoch(epoch, self._ctx().participant(epoch, attempt))

    def _require_current(self, epoch: int | None = None) -> _Epoch:
        current = self._current
        if current is None or (epoch is not None and current.epoch != epoch):
            what = "no epoch is open" if epoch is None else f"epoch {epoch} is not open"
            raise UsageError(f"{what}; call begin_epoch first", **self._where(epoch))
        return current

    @typed("writing a batch")
    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        current = self._require_current()
        state = self._state()
        state.producer.require(current.epoch)
        self._check_schema(batch, current.epoch)
        records = build_records(batch, self.config.layout, current.checksum)
        self._check_records(records, current, state.topic)
        state.producer.send(records, current.epoch)
        written = records.total_bytes()
        current.rows += len(records)
        current.bytes += written
        current.checksum = records.checksum
        return WriteResult(len(records), written)

    def _check_schema(self, batch: pa.RecordBatch, epoch: int) -> None:
        if batch.schema.equals(self._checked_schema or _EMPTY):
            return
        problems = self.config.layout.problems(batch.schema)
        if problems:
            raise SchemaMismatchError(
                "the batch does not fit the record layout: " + "; ".join(problems),
                **self._where(epoch),
                fix="change the sink's column roles or the query's columns",
            )
        self._checked_schema = batch.schema

    def _check_records(self, records: Records, current: _Epoch, topic: TopicFacts) -> None:
        """Refuse, before producing any record of the batch, a record over the size limit
        or a partition the topic does not have."""
        limit = topic.record_limit - RECORD_OVERHEAD
        row, biggest = records.largest()
        if biggest > limit:
            raise SchemaMismatchError(
                f"row {current.rows + row} of the epoch makes a record of about "
                f"{biggest + RECORD_OVERHEAD} bytes; the limit is {topic.record_limit} bytes "
                f"(min of topic {self.config.topic!r} max.message.bytes and the producer's "
                "message.max.bytes)",
                **self._where(current.epoch),
                fix="filter or split oversize rows before the sink, or raise max.message.bytes "
                "on the topic and message.max.bytes in producer_config",
            )
        if records.partitions is not None:
            bad = [p for p in records.partitions if p >= topic.partitions or p < -1]
            if bad:
                raise SchemaMismatchError(
                    f"partition_column holds {bad[0]}, but topic {self.config.topic!r} has "
                    f"partitions 0..{topic.partitions - 1}",
                    **self._where(current.epoch),
                    fix="compute partitions modulo the topic's partition count, or leave the "
                    "column null to let the partitioner choose",
                )

    @typed("preparing the epoch")
    def pre_commit(self, epoch: int) -> CommitHandle:
        """Phase 1: every record acknowledged inside the still-open transaction."""
        current = self._require_current(epoch)
        producer = self._state().producer
        producer.flush(epoch)
        current.prepared = CommitHandle(
            self.name,
            epoch,
            str(current.name),
            current.rows,
            current.bytes,
            f"crc32:{current.checksum:08x}",
            {
                "transactional_id": producer.transactional_id,
                "topic": self.config.topic,
                "progress_topic": self.config.progress_topic_name,
            },
        )
        return current.prepared

    @typed("committing the epoch with its decision", unknown=InDoubtError)
    def commit_with_decision(
        self, epoch: int, handle: CommitHandle, decision: Mapping[str, JSON]
    ) -> None:
        """The commit point: the progress record (carrying `decision`) and the epoch's
        records become visible atomically. Raises FencedError (nothing committed) if a newer
        producer took over, TransientError (transaction aborted, nothing committed) when the
        transaction had to be aborted, InDoubtError when the outcome is unknown."""
        self._commit(epoch, handle, decision)

    def _commit(
        self, epoch: int, handle: CommitHandle, decision: Mapping[str, JSON] | None
    ) -> None:
        current = self._require_current(epoch)
        if current.prepared is None or current.prepared.participant != handle.participant:
            raise UsageError(
                f"participant {handle.participant} is not this sink's prepared one",
                **self._where(epoch),
            )
        state = self._state()
        producer = state.producer
        producer.require(epoch)
        started = time.perf_counter()
        record = ProgressRecord(
            epoch,
            state.context.generation,
            handle.participant,
            handle.rows,
            handle.checksum,
            decision,
        )
        key = progress_key(state.context.job_id, self.name)
        written = state.cluster.high_watermarks(state.topic.partitions, epoch)
        try:
            producer.send_one(
                "writing the progress record",
                self.config.progress_topic_name,
                record.encode(),
                key,
                epoch,
            )
            # commit_transaction flushes the progress record first; if it cannot be
            # delivered the transaction needs an abort (below): nothing becomes visible.
            producer.commit(epoch)
        except InDoubtError:
            self._last_known = False
            raise
        except (TransientError, FencedError):
            producer.abort_quietly(epoch)
            self._current = None
            raise
        self._current = None
        self._last_committed = (
            epoch if self._last_committed is None else max(self._last_committed, epoch)
        )
        state.cluster.await_visible(written, epoch)
        self._counters["rows"] += handle.rows
        self._counters["bytes"] += handle.bytes
        self._counters["epochs_committed"] += 1
        self._counters["commit_seconds"] += time.perf_counter() - started

    def _abort(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            self._state().producer.abort(current.epoch)

    @typed("committing the epoch", unknown=InDoubtError)
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        """Commit outside the last-resource path (a job that asks for at-least-once): only
        the producer that prepared the participant can. A participant whose progress record
        is already committed is ALREADY_COMMITTED."""
        current = self._current
        prepared = current.prepared if current is not None else None
        if prepared is not None and prepared.participant == handle.participant:
            self._commit(epoch, handle, None)
            return CommitOutcome.COMMITTED
        record, _ = self._latest_progress(lambda r: r.epoch == epoch)
        if record is not None and record.participant == handle.participant:
            return CommitOutcome.ALREADY_COMMITTED
        raise ParticipantLostError(
            f"Kafka participant {handle.participant} cannot be committed: its transaction "
            "ended with the producer that opened it",
            **self._where(epoch),
            fix="Kafka must be the job's last resource (the coordinator does this for "
            "exactly-once jobs); replay the epoch",
        )

    @typed("rolling the epoch back")
    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        """Abort this sink's open transaction for `epoch`, if any. A transaction opened by
        another (dead or fenced) producer is aborted by `open`'s init_transactions."""
        current = self._current
        if current is None or current.epoch != epoch:
            return
        if handle is not None and current.name != ParticipantName.parse(handle.participant):
            return
        self._abort()
        self._log(epoch).info("rolled back participant %s", current.name)

    @typed("recovering prepared participants")
    def recover_prepared(self) -> list[CommitHandle]:
        """Nothing to resolve: `open`'s init_transactions already aborted whatever an older
        producer of this transactional.id left open."""
        self._ctx()
        return []

    @typed("reading the last committed epoch")
    def last_committed_epoch(self) -> int | None:
        if not self._last_known:
            record, _ = self._latest_progress(lambda r: True)
            self._last_committed = record.epoch if record is not None else None
            self._last_known = True
        return self._last_committed

    # -- operations (durable-sinks status/inspect/verify; operations.py) -----------------------
    @typed("looking for open transactions")
    def in_doubt(self) -> list[Prepared]:
        return operations.sink_in_doubt(self, self._state(), self.last_committed_epoch())

    @typed("reading the topic and the progress records")
    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        return operations.sink_holdings(self.config, self._state(), first, last)

    def live_generations(self) -> list[int]:
        return []  # a transactional id's producer cannot be seen from outside

    @typed("reading the epoch's decision")
    def read_decision(self, epoch: int) -> Mapping[str, JSON] | None:
        record, _ = self._latest_progress(lambda r: r.epoch <= epoch)
        if record is None or record.epoch != epoch:
            return None
        return record.decision


_EMPTY = pa.schema([])


def _any(value: bytes, offset: int) -> bool:
    return True
