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
the producer epoch so any older producer's next call fails fatally (`FencedError`), checks
the fence record again (now exact), then writes its own generation as the new fence record.
So fence records only grow: a coordinator whose `init_transactions` came before a newer one's
is fenced before its fence record commits. A generation claim of a decision store the sink
keeps (decisions.py) is a fence record too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version as distribution_version

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer, TopicPartition, libversion

from durable_sinks.core.bad_rows import BadRowsError, Refusal, RefusalReason, RefusedRows
from durable_sinks.core.errors import (
    LOST_EPOCHS_DOC,
    CommittedEpochLostError,
    DurableSinkError,
    FencedError,
    InDoubtError,
    ParticipantLostError,
    SchemaMismatchError,
    TransientError,
    UsageError,
)
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Bookkeeping, Holding, Prepared
from durable_sinks.core.protocol import (
    JSON,
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.sink_base import SinkBase, Step, guarded

from . import committer, errors, kip939, operations, recovery, spark_shape, timeouts
from .admin import Cluster, TopicFacts
from .clientlog import ClientLog
from .config import MAX_TOPIC_LENGTH, SPARK_SHAPE, Kafka, bootstrap_hosts, valid_topic
from .decisions import KafkaDecisionHost
from .handles import KafkaHandleDetails
from .progress import (
    ProgressReader,
    encode_fence,
    fence_key,
    progress_key,
    transactional_id,
)
from .records import Encoded, encode_records, millis
from .transaction import RidingRecord, SharedTransaction, join, leave
from .writer import KafkaParticipant, TransactionalProducer

#: How much nearer than the topic's timestamp limits a record's timestamp must be to now (the
#: broker checks against its own clock, later): rows within it of a limit are refused.
TIMESTAMP_MARGIN_MS = 60_000

#: The longest the KIP-939 probe waits for a bootstrap broker's ApiVersions answer (seconds).
KIP939_PROBE_TIMEOUT_S = 3.0

#: What settles a commit whose outcome a failure left unknown.
_COMMIT_IN_DOUBT = (
    "the progress record tells whether the epoch committed: the epoch's replay or the next "
    "start reads it and commits or rolls back the job's other sinks accordingly"
)


@dataclass
class _Group:
    """The rows of one batch bound for one topic."""

    topic: str
    facts: TopicFacts
    batch: pa.RecordBatch
    #: The rows' indices in the batch given to write_batch (None: all of them, in order).
    rows: list[int] | None


class _Opened:
    """The clients `open` makes for one generation."""

    def __init__(self, sink: KafkaSink, context: OpenContext) -> None:
        self.context = context
        #: Every client's librdkafka logs and error callbacks, rate-limited (clientlog.py).
        self.clientlog = ClientLog(context.job_id, sink.name)
        settings = {**sink.config.connection_settings(), **self.clientlog.settings()}
        log = sink.logger()
        members = () if context.inspect else context.transaction
        carrier = members[0] if members else sink.name
        txn_id = transactional_id(context.job_id, carrier)
        #: The producer's transaction timeout (timeouts.py), shared by this process's sinks
        #: of the same transactional id: a ride-out's new sink continues from what it learnt.
        self.timeouts = timeouts.shared(
            sink.config.bootstrap_servers, txn_id, sink.config.transaction_timeout_s
        )

        def producer() -> TransactionalProducer:
            made = TransactionalProducer(
                sink.config, txn_id, sink.where, log, self.clientlog, sink._newer_owner
            )
            made.timeouts = self.timeouts
            # Every producer setting is checked before any client connects or topic is made.
            made.check_settings()
            return made

        if members:  # the job's other Kafka sinks on this cluster share the transaction
            self.shared = join(context.job_id, context.generation, members, sink.config, producer)
        else:
            self.shared = SharedTransaction(producer(), (sink.name,), {sink.name})
        self.producer = self.shared.producer
        #: Whether this sink's commit commits the transaction (else it rides in the carrier's).
        self.carries = carrier == sink.name
        self.cluster = Cluster(sink.config, settings, sink.where, log, self.clientlog.refusals)
        self.progress = ProgressReader(
            self.cluster.admin,
            settings,
            sink.config.progress_topic_name,
            sink.config.progress_scan_timeout_s,
            sink.where,
            request_timeout=sink.config.request_timeout_s,
        )
        #: The sink's topic (None: rows name theirs).
        self.topic: TopicFacts | None = None
        #: Each topic rows named, once checked.
        self.routed: dict[str, TopicFacts] = {}


class KafkaSink(SinkBase[Kafka]):
    """Exactly-once into one Kafka topic; the job's last resource (see the module docs)."""

    KEEPS_COMMIT_RECORD = True

    def __init__(self, config: Kafka) -> None:
        super().__init__(config, counters=("commit_seconds",))
        self._opened: _Opened | None = None
        self._current: KafkaParticipant | None = None
        self._last_known = False
        self._checked_schema: pa.Schema | None = None
        self._checked_shape: str | None = None
        #: Whether the progress topic is missing, once an operator's tool asked.
        self._progress_missing: bool | None = None

    def _target(self) -> str:
        if self.config.topic is not None:
            return f"topic={self.config.topic!r}"
        return f"topics by row ({self.config.bounds()})"

    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        return errors.translate(exc, step, self)

    # -- context -------------------------------------------------------------------------------
    def _state(self) -> _Opened:
        if self._opened is None:
            raise self._not_open()
        return self._opened

    @property
    def transactional_id(self) -> str:
        return self._state().producer.transactional_id

    @property
    def transaction_timeout_s(self) -> float:
        """The transaction timeout (seconds) of the producer the sink runs now."""
        return self._state().producer.started_timeout_s

    # -- open ----------------------------------------------------------------------------------
    @guarded("opening the sink")
    def open(self, context: OpenContext) -> None:
        self._opening(context)
        self._opened = opened = _Opened(self, context)
        if context.inspect:  # an operator's tool: read only (no topic made, no producer)
            return
        try:
            versions = self._ask_broker_versions()  # beside the checks, in a thread
            opened.topic = opened.cluster.check()
            if opened.topic is not None:
                opened.producer.batch_limit = opened.topic.record_limit
            self.logger().info("%s", self._kip939(versions).line())
            self._start_producer(context.generation, opening=True)
        except BaseException:
            self.close()  # a refused open holds no client
            raise

    def _start_producer(self, generation: int, *, opening: bool = False) -> None:
        """Refuse if a newer generation holds the fence; take over the transactional.id
        (aborting what an older producer left open); write this generation as the fence;
        read the last committed epoch. `opening`: the sink's open, which also checks that the
        topics still hold the newest committed epoch (a producer replaced mid-run committed
        that epoch itself)."""
        state = self._state()
        job, topic = state.context.job_id, self.config.progress_topic_name
        # Before init_transactions, which would abort a newer generation's transaction: is
        # there a newer fence? Read uncommitted: a fence record of any transaction, even one
        # still open or aborted, was written by a generation that was claimed, so a newer one
        # means this coordinator is fenced; and the read never waits for a transaction an
        # older producer of this transactional.id left open (a commit whose answer was lost),
        # which init_transactions settles below. The progress record found here only sizes
        # the transaction timeout.
        latest, found = recovery.latest_progress(
            state.progress,
            job,
            self.name,
            topic,
            lambda r: True,
            with_fence=True,
            committed=False,
        )
        self._check_fence(found, generation)
        producer = state.producer
        if not state.shared.started:  # the first member of a shared transaction starts it
            stored = None if latest is None else latest.longest_open_s or latest.open_s
            producer.transaction_timeout_s = state.timeouts.bounded(
                state.cluster.transaction_ceiling_s(), stored
            )
            producer.start()
            state.shared.restarted()
        # The older producer's transaction is settled now: the progress topic is exact, and
        # holds every fence written before this producer's init_transactions. One written
        # after it came with a later init_transactions, which fenced this producer: the
        # fence record below then fails instead of lowering the fence.
        record, holder = recovery.latest_progress(
            state.progress, job, self.name, topic, lambda r: True, with_fence=True
        )
        self._check_fence(holder, generation)
        if opening and record is not None and record.ranges:
            self._check_held(record.epoch, record.ranges)
        producer.write_alone(
            "writing the fence record", topic, encode_fence(generation), fence_key(job, self.name)
        )
        self._last_committed = record.epoch if record is not None else None
        self._last_known = True
        self.logger().info(
            "producer %s ready for generation %d; last committed epoch %s; transaction "
            "timeout %g s (%s)",
            producer.transactional_id,
            generation,
            self._last_committed,
            producer.started_timeout_s,
            self._timeout_origin(),
        )

    def _check_held(self, epoch: int, ranges: Mapping[str, Mapping[int, tuple[int, int]]]) -> None:
        """The topics must still hold the newest committed epoch's records (its progress
        record's offset ranges): CommittedEpochLostError, before anything is written,
        when a topic lost them."""
        lost = self._state().cluster.lost_ranges(ranges, epoch)
        if not lost:
            return
        raise CommittedEpochLostError(
            f"the topics no longer hold epoch {epoch}, which this sink committed: "
            f"{'; '.join(lost)} (a topic deleted and made again, or an unclean leader "
            "election)",
            **self.where(epoch),
            first_lost=epoch,
            last_lost=epoch,
            holder=self.name,
            fix="write the lost records into the topics again from the source before "
            "restarting (Kafka has no repair command); if the topic was deleted on purpose, "
            f"start the query under a new job_id; see {LOST_EPOCHS_DOC}",
        )

    def _timeout_origin(self) -> str:
        """Where the producer's transaction timeout comes from, for the log."""
        chosen = self._state().timeouts
        if chosen.explicit_s is not None:
            return "transaction_timeout_s"
        longest = chosen.longest_recent_s
        if longest is None:
            return f"nothing measured yet: the ceiling, {chosen.ceiling_s:g} s"
        return (
            f"derived: the longest recent transaction was open {longest:.1f} s; ceiling "
            f"{chosen.ceiling_s:g} s"
        )

    def _ask_broker_versions(self) -> kip939.BrokerVersions:
        """The KIP-939 probe's ApiVersions request to a bootstrap broker, started now."""
        protocol = str(self.config.producer_config.get("security.protocol", "plaintext"))
        hosts = bootstrap_hosts(
            self.config.bootstrap_servers, protocol, f"kafka sink {self.name!r}"
        )
        return kip939.BrokerVersions(
            hosts, protocol, min(self.config.request_timeout_s, KIP939_PROBE_TIMEOUT_S)
        )

    def _kip939(self, versions: kip939.BrokerVersions) -> kip939.Kip939Probe:
        """What the KIP-939 probe found, once the broker's settings were read."""
        cluster = self._state().cluster
        return kip939.Kip939Probe(
            kip939.versions_answer(versions.result()),
            kip939.setting_answer(cluster.broker_settings, cluster.broker_settings_unread),
            kip939.client_answer(
                Producer, (distribution_version("confluent-kafka"), libversion()[0])
            ),
        )

    @guarded("probing the cluster for KIP-939")
    def notes(self) -> list[tuple[str, str]]:
        """What `durable-sinks doctor` reports beside its checks: the KIP-939 probe (reads
        the broker's settings and API versions; works on a sink opened to inspect)."""
        versions = self._ask_broker_versions()
        cluster = self._state().cluster
        if not cluster.broker_described:
            cluster.describe_broker()
        return [(f"kafka sink {self.name!r}", self._kip939(versions).line())]

    def _newer_owner(self) -> bool:
        """Whether a newer generation than this sink's holds the fence record (read when
        the producer must tell a fence from a transaction time-out)."""
        state = self._state()
        topic = self.config.progress_topic_name
        found = recovery.fence_holder(state.progress, state.context.job_id, self.name, topic)
        holder = recovery.holder(found, topic)
        return holder is not None and holder > state.context.generation

    def _check_fence(self, found: tuple[int, bytes] | None, generation: int) -> None:
        """`found` is the latest fence record (offset, value), if any."""
        holder = recovery.holder(found, self.config.progress_topic_name)
        if holder is not None and holder > generation:
            self._state().producer.refuse(
                FencedError(
                    f"generation {holder} of this job already opened the sink; this "
                    f"coordinator (generation {generation}) is older and must stop",
                    **self.where(),
                    fix="nothing to do here: the newer coordinator owns the job",
                )
            )

    # -- protocol ------------------------------------------------------------------------------
    def transaction_group(self) -> str:
        """The job's Kafka sinks with the same bootstrap servers share one transaction
        (transaction.py): one cluster. Named by the servers as given (the same cluster reached
        through other bootstrap servers counts as another)."""
        protocol = str(self.config.producer_config.get("security.protocol", "plaintext"))
        hosts = bootstrap_hosts(self.config.bootstrap_servers, protocol, self.name)
        servers = ",".join(sorted({f"{host}:{port}" for host, port in hosts}))
        return f"kafka cluster {servers}"

    def capabilities(self) -> SinkCapabilities:
        # New columns need nothing of the topic: the JSON record shape sends every column
        # the batch has, Spark's record shape ignores columns it does not know.
        return SinkCapabilities(exactly_once=True, two_phase_commit=True, schema_evolution=True)

    def schema(self) -> pa.Schema | None:
        return self._checked_schema

    def metrics(self) -> Mapping[str, float]:
        aborts = 0 if self._opened is None else self._opened.producer.aborts
        return {**super().metrics(), "rollbacks": float(aborts)}

    @guarded("checking the Kafka cluster")
    def health_check(self) -> None:
        state = self._state()
        state.producer.require()
        state.cluster.health_check()

    @guarded("closing the sink")
    def close(self) -> None:
        """Release the clients. An open transaction is left to the broker (it aborts it at
        transaction.timeout.ms, or the next open aborts it at once). Every client handle is
        dropped, so a closed sink that something still references holds none (each
        librdkafka client takes one of the process's 1,024 thread-local keys until freed)."""
        opened, self._opened, self._current = self._opened, None, None
        if opened is not None:
            leave(opened.shared, self.name)
            opened.progress.close()
            opened.clientlog.flush()

    @guarded("beginning the epoch")
    def begin_epoch(self, epoch: int) -> None:
        state = self._state()
        producer = state.producer
        wanted = state.timeouts.current_s
        if producer.broken and producer.fenced is None:
            self.logger(epoch).warning("replacing the producer after a fatal error")
            state.shared.started = False
            self._start_producer(self.context.generation)
        elif (
            self._current is None
            and not state.shared.number  # no member began this epoch's transaction yet
            and producer.fenced is None
            and wanted is not None
            and wanted != producer.started_timeout_s
        ):
            # transaction.timeout.ms is fixed per producer (init_transactions sends it)
            self.logger(epoch).info(
                "transaction timeout %g s -> %g s (the longest of the last %d epochs' "
                "transactions was open %.1f s): starting a new producer",
                producer.started_timeout_s,
                wanted,
                len(state.timeouts.recent),
                state.timeouts.longest_recent_s or 0.0,
            )
            state.shared.started = False
            self._start_producer(self.context.generation)
        producer.require(epoch)
        if self._current is not None:
            self._abort()
        name = self._next_participant(epoch)
        current = KafkaParticipant(epoch, name)
        current.number = state.shared.begin(epoch)
        known = list(state.routed.items())
        if state.topic is not None and self.config.topic is not None:
            known.append((self.config.topic, state.topic))
            current.topics[self.config.topic] = state.topic.partitions
        # The ranges' starts of the topics the epoch likely writes, asked now, awaited before
        # its first record; a topic first named later is asked then (`_started_topic`).
        ahead = [TopicPartition(t, p) for t, facts in known for p in range(facts.partitions)]
        if ahead:
            current.pending = state.cluster.high_watermarks_soon(ahead, epoch)
        self._current = current

    def _require_current(self, epoch: int | None = None) -> KafkaParticipant:
        current = self._current
        if current is None or (epoch is not None and current.epoch != epoch):
            raise self._no_epoch(epoch)
        return current

    @guarded("writing a batch")
    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """Produce the batch's records into the epoch's transaction, each to the sink's topic
        or, without one, to the topic its row names; but none of a row the topic cannot take
        (a record over the size limit, a partition the topic does not have, a Spark-shape row
        Spark's sink would fail on, a topic that is null, invalid, outside `topics` /
        `topic_pattern` or missing): by the job's bad-row policy such rows fail the batch
        before any of its records is produced (BadRowsError), or are left out and returned as
        refused rows."""
        current = self._require_current()
        state = self._state()
        state.producer.require(current.epoch)
        shape = self._check_schema(batch, current.epoch)
        if self.config.topic is not None and state.topic is not None:
            groups = [_Group(self.config.topic, state.topic, batch, None)]
            refused = RefusedRows()
        else:
            groups, refused = self._route(batch, shape, current.epoch)
        encoded: list[Encoded] = []
        for group in groups:
            found, group_encoded = self._group_refusals(group, shape)
            encoded.append(group_encoded)
            refused = refused.merged(found if group.rows is None else found.through(group.rows))
        kept = None
        if refused:
            self._refused(batch, refused, current.epoch)
            kept = refused.kept_mask(batch.num_rows)
        rows = written = 0
        for group, group_encoded in zip(groups, encoded, strict=True):
            to_send = group_encoded
            if kept is not None:
                mask = kept if group.rows is None else pc.take(kept, pa.array(group.rows))
                to_send = group_encoded.kept(mask)
            records = to_send.records(current.checksum)
            if len(records) == 0:
                continue
            self._started_topic(current, group.topic, group.facts)
            state.producer.send(records, current.epoch, group.topic)
            rows += len(records)
            written += records.total_bytes()
            current.checksum = records.checksum
        current.rows += rows
        current.bytes += written
        return WriteResult(rows, written, refused)

    def _group_refusals(self, group: _Group, shape: str) -> tuple[RefusedRows, Encoded]:
        """One topic's rows encoded, and what of them the topic cannot take (rows of
        `group.batch`)."""
        batch, topic, facts = group.batch, group.topic, group.facts
        if shape == SPARK_SHAPE:
            encoded = spark_shape.encode_spark_records(batch)
            found = spark_shape.row_refusals(batch, topic, facts.partitions)
        else:
            encoded = encode_records(batch, self.config.layout)
            found = self._partition_refusals(encoded, topic, facts)
        refused = self._size_refusals(encoded, topic, facts).merged(
            found, self._timestamp_refusals(encoded, topic, facts, shape)
        )
        return refused, encoded

    def _route(
        self, batch: pa.RecordBatch, shape: str, epoch: int
    ) -> tuple[list[_Group], RefusedRows]:
        """The batch's rows by the topic each names (in their order within each topic), and
        the rows no topic takes: a null or invalid name, one outside the sink's bounds, or a
        topic that does not exist (and is not to be created)."""
        column_name = spark_shape.TOPIC if shape == SPARK_SHAPE else self.config.topic_column
        if column_name is None:  # checked with the schema; here for the type checker
            raise self._no_topic_column(epoch)
        column = batch.column(column_name)
        encoded = pc.dictionary_encode(column)
        names = encoded.dictionary.to_pylist()
        indices = encoded.indices
        refusals: list[RefusedRows] = [
            RefusedRows.where(
                pc.is_null(column),
                Refusal(
                    RefusalReason.INVALID_VALUE,
                    "the topic is null; without the sink's topic option every row must name "
                    "its topic",
                    column_name,
                ),
            )
        ]
        groups: list[_Group] = []
        for code, name in enumerate(names):
            mask = pc.equal(indices, code)
            why = self._unusable_topic(name, epoch)
            if why is not None:
                refusals.append(
                    RefusedRows.where(mask, Refusal(RefusalReason.INVALID_VALUE, why, column_name))
                )
                continue
            facts = self._state().routed[name]
            rows = pc.indices_nonzero(mask)
            sub = batch if len(rows) == batch.num_rows else batch.take(rows)
            groups.append(_Group(name, facts, sub, rows.to_pylist()))
        return groups, RefusedRows().merged(*refusals)

    def _unusable_topic(self, name: str, epoch: int) -> str | None:
        """Why rows cannot go to topic `name`, or None (it is checked, or created when
        allowed, the first time a row names it)."""
        state = self._state()
        if not valid_topic(name):
            return (
                f"topic {name!r} is not a valid Kafka topic name (1-{MAX_TOPIC_LENGTH} "
                "characters of [A-Za-z0-9._-])"
            )
        if not self.config.allows(name):
            return f"topic {name!r} is not among the sink's topics ({self.config.bounds()})"
        if name == self.config.progress_topic_name:
            return f"topic {name!r} is the sink's progress topic"
        current = self._require_current(epoch)
        if name not in state.routed and name not in current.missing:
            facts = state.cluster.routed_topic(name, epoch)
            if facts is None:
                current.missing.add(name)  # looked up again in a later epoch
            else:
                state.routed[name] = facts
                self.logger(epoch).info("writing topic %s (%d partitions)", name, facts.partitions)
        if name in current.missing:
            return (
                f"topic {name!r} does not exist (or this principal may not see it), and the "
                "sink does not create it"
            )
        return None

    def _started_topic(self, current: KafkaParticipant, topic: str, facts: TopicFacts) -> None:
        """Make sure the epoch's offset ranges in `topic` have their starts before its first
        record is produced (the high watermarks asked at begin_epoch, or now)."""
        if current.pending is not None:
            pending, current.pending = current.pending, None
            current.starts.update(pending())
        parts = [TopicPartition(topic, p) for p in range(facts.partitions)]
        if any(p not in current.starts for p in parts):
            current.starts.update(self._state().cluster.high_watermarks(parts, current.epoch))
        current.topics.setdefault(topic, facts.partitions)

    def _no_topic_column(self, epoch: int | None) -> SchemaMismatchError:
        return SchemaMismatchError(
            "the sink has no topic option, so each row must name its topic, but the JSON "
            "record shape has no topic_column",
            **self.where(epoch),
            fix="set topic_column='<a string column>' (or topic= for one topic)",
        )

    def _check_schema(self, batch: pa.RecordBatch, epoch: int) -> str:
        """The batch's record shape, once its schema is checked against it (once per
        schema)."""
        if self._checked_shape is not None and batch.schema.equals(self._checked_schema):
            return self._checked_shape
        shape = self.config.record_shape_for(batch.schema)
        if shape == SPARK_SHAPE:
            problems = spark_shape.schema_problems(batch.schema)
            fix = (
                "cast the columns to Spark's Kafka types (value and key string or binary, "
                "headers array<struct<key:string,value:binary>>, partition int, topic string, "
                "timestamp timestamp), or set record_shape='json' to send each row as a JSON "
                "object"
            )
        else:
            problems = self.config.layout.problems(batch.schema)
            fix = "change the sink's column roles or the query's columns"
            if self.config.routed and self.config.topic_column is None:
                raise self._no_topic_column(epoch)
        routed = shape == SPARK_SHAPE and self.config.routed
        if routed and spark_shape.TOPIC not in batch.schema.names:
            problems.append(
                "the sink has no topic option, so each row must name its topic in a 'topic' "
                f"column (columns: {batch.schema.names})"
            )
            fix = "add a string column 'topic' naming each row's topic, or give the sink topic="
        if problems:
            raise SchemaMismatchError(
                f"the batch does not fit the {shape} record shape: " + "; ".join(problems),
                **self.where(epoch),
                fix=fix,
            )
        self._checked_schema, self._checked_shape = batch.schema, shape
        return shape

    def _size_refusals(self, encoded: Encoded, topic: str, facts: TopicFacts) -> RefusedRows:
        """Records heavier than the topic or the producer takes (RECORD_TOO_LARGE)."""
        over = pc.greater(encoded.wire_sizes, facts.record_limit)
        if not pc.any(over).as_py():
            return RefusedRows()
        rows = pc.indices_nonzero(over)
        limit = facts.record_limit
        return RefusedRows(
            tuple(rows.to_pylist()),
            tuple(
                Refusal(
                    RefusalReason.RECORD_TOO_LARGE,
                    f"the record is about {size} bytes; the limit is {limit} bytes (the "
                    f"smaller of topic {topic!r} max.message.bytes and the "
                    "producer's message.max.bytes)",
                )
                for size in pc.take(encoded.wire_sizes, rows).to_pylist()
            ),
        )

    def _partition_refusals(self, encoded: Encoded, topic: str, facts: TopicFacts) -> RefusedRows:
        """Rows whose partition_column names a partition the topic does not have (null or -1:
        the partitioner chooses)."""
        column = encoded.partitions
        if column is None:
            return RefusedRows()
        outside = pc.fill_null(
            pc.or_(pc.less(column, -1), pc.greater_equal(column, facts.partitions)), False
        )
        if not pc.any(outside).as_py():
            return RefusedRows()
        rows = pc.indices_nonzero(outside)
        name = self.config.layout.partition_column
        return RefusedRows(
            tuple(rows.to_pylist()),
            tuple(
                Refusal(
                    RefusalReason.INVALID_VALUE,
                    f"partition {value}, but topic {topic!r} has partitions "
                    f"0..{facts.partitions - 1}",
                    name,
                )
                for value in pc.take(column, rows).to_pylist()
            ),
        )

    def _timestamp_refusals(
        self, encoded: Encoded, topic: str, facts: TopicFacts, shape: str
    ) -> RefusedRows:
        """Records whose timestamp the topic would refuse (TIMESTAMP_OUT_OF_RANGE): before
        1970, or outside its window around now (message.timestamp.before/after.max.ms), less
        a margin for the clocks of this host and the broker, which checks later."""
        if encoded.timestamps is None:
            return RefusedRows()
        stamps = millis(encoded.timestamps)
        outside = pc.less(stamps, 0)
        window = facts.timestamps
        now = int(time.time() * 1000)
        if window is not None and window.before_ms is not None:
            earliest = now - window.before_ms + TIMESTAMP_MARGIN_MS
            outside = pc.or_(outside, pc.less(stamps, earliest))
        if window is not None and window.after_ms is not None:
            latest = now + window.after_ms - TIMESTAMP_MARGIN_MS
            outside = pc.or_(outside, pc.greater(stamps, latest))
        outside = pc.fill_null(outside, False)
        if not pc.any(outside).as_py():
            return RefusedRows()
        rows = pc.indices_nonzero(outside)
        column = (
            spark_shape.TIMESTAMP if shape == SPARK_SHAPE else self.config.layout.timestamp_column
        )

        def why(ms: int) -> str:
            if ms < 0:
                return f"timestamp {ms} ms is before 1970: Kafka takes no negative timestamp"
            return (
                f"timestamp {ms} ms is {(ms - now) / 1000:+.0f} s from now, outside what topic "
                f"{topic!r} takes (message.timestamp.before.max.ms "
                f"{_limit(window.before_ms if window else None)}, after.max.ms "
                f"{_limit(window.after_ms if window else None)})"
            )

        return RefusedRows(
            tuple(rows.to_pylist()),
            tuple(
                Refusal(RefusalReason.TIMESTAMP_OUT_OF_RANGE, why(ms), column)
                for ms in pc.take(stamps, rows).to_pylist()
            ),
        )

    def _refused(self, batch: pa.RecordBatch, refused: RefusedRows, epoch: int) -> None:
        """Apply the job's bad-row policy to `refused` (SinkBase._refuse): with "fail", raise
        BadRowsError with the fix for what was refused; nothing of the batch was produced."""
        try:
            self._refuse(batch, refused, epoch)
        except BadRowsError as exc:
            raise BadRowsError(
                exc.message,
                refused=exc.refused,
                job=exc.job,
                sink=exc.sink,
                epoch=exc.epoch,
                fix=self._refusal_fix(refused),
            ) from None

    def _refusal_fix(self, refused: RefusedRows) -> str:
        columns = {r.column for r in refused.refusals if r.column is not None}
        fixes = []
        if RefusalReason.RECORD_TOO_LARGE in refused.counts():
            fixes.append(
                "filter or split oversize rows before the sink, or raise max.message.bytes on "
                "the topic and message.max.bytes in producer_config"
            )
        if columns & {spark_shape.PARTITION, self.config.layout.partition_column}:
            fixes.append(
                "compute partitions modulo the topic's partition count, or leave the column "
                "null to let the partitioner choose"
            )
        if {spark_shape.TOPIC, self.config.topic_column} & columns:
            fixes.append(
                "name an existing topic in each row's topic column, within "
                f"{self.config.bounds()} (or let the sink create topics: create_topic=True "
                "with topics= or topic_pattern=)"
            )
        if spark_shape.HEADERS in columns:
            fixes.append("give every header a key")
        if RefusalReason.TIMESTAMP_OUT_OF_RANGE in refused.counts():
            fixes.append(
                "check the timestamp column: integers are milliseconds since the Unix epoch "
                "(not microseconds or nanoseconds); or widen the topic's "
                "message.timestamp.before.max.ms / after.max.ms"
            )
        fixes.append(
            "or route such rows to a dead letter: durable_sink(..., on_bad_rows='dead_letter', "
            "dead_letter=sink(...)); nothing of the epoch was committed"
        )
        return "; ".join(fixes)

    @guarded("preparing the epoch")
    def pre_commit(self, epoch: int) -> CommitHandle:
        """Phase 1: every record acknowledged inside the still-open transaction."""
        current = self._require_current(epoch)
        state = self._state()
        producer = state.producer
        self._require_open(current)
        producer.flush(epoch)
        current.prepared = CommitHandle(
            self.name,
            epoch,
            str(current.name),
            current.rows,
            current.bytes,
            f"crc32:{current.checksum:08x}",
            KafkaHandleDetails(
                producer.transactional_id,
                tuple(sorted(current.topics)),
                self.config.progress_topic_name,
            ).to_json(),
        )
        if not state.carries:  # its progress record rides in the carrier's commit
            current.written = self._written(current)
            record = committer.progress_record(
                state.context, current.prepared, None, self._ranges(current, current.written)
            )
            state.shared.riding[self.name] = RidingRecord(
                self.config.progress_topic_name,
                progress_key(state.context.job_id, self.name),
                record.encode(),
            )
        return current.prepared

    def _require_open(self, current: KafkaParticipant) -> None:
        """TransientError when the epoch's transaction ended under this participant (another
        member of a shared transaction aborted it): nothing of it is visible."""
        if not self._state().shared.is_open(current.number):
            raise TransientError(
                "the epoch's Kafka transaction was aborted (another Kafka sink of the job on "
                "this cluster, which shares it, rolled it back); nothing of it is visible",
                **self.where(current.epoch),
            )

    def _written(self, current: KafkaParticipant) -> dict[TopicPartition, int]:
        """The high watermarks of the epoch's partitions (after its flush: past its
        records)."""
        parts = [TopicPartition(t, p) for t, count in current.topics.items() for p in range(count)]
        current.pending = None  # nothing was written when it is still pending: ranges empty
        return self._state().cluster.high_watermarks(parts, current.epoch) if parts else {}

    @staticmethod
    def _ranges(
        current: KafkaParticipant, written: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        return {p: (current.starts.get(p, end), end) for p, end in written.items()}

    @guarded("committing the epoch with its decision", in_doubt=_COMMIT_IN_DOUBT)
    def commit_with_decision(
        self, epoch: int, handle: CommitHandle, decision: Mapping[str, JSON]
    ) -> None:
        """The commit point: the progress record (carrying `decision`) and the epoch's
        records become visible atomically. Raises FencedError (nothing committed) if a newer
        producer took over before the commit request, TransientError (transaction aborted,
        nothing committed) when the transaction had to be aborted, InDoubtError when the
        outcome is unknown: an answer lost, or the commit request itself fenced (it may have
        committed before the fence; the progress topic tells)."""
        self._commit(epoch, handle, decision)

    def _commit(
        self, epoch: int, handle: CommitHandle, decision: Mapping[str, JSON] | None
    ) -> None:
        current = self._require_current(epoch)
        if current.prepared is None or current.prepared.participant != handle.participant:
            raise UsageError(
                f"participant {handle.participant} is not this sink's prepared one",
                **self.where(epoch),
            )
        state = self._state()
        producer = state.producer
        producer.require(epoch)
        self._require_open(current)
        started = time.perf_counter()
        written = self._written(current)
        shared = state.shared
        open_s = producer.open_s()
        try:
            committer.commit(
                producer,
                state.context,
                self.name,
                self.config.progress_topic_name,
                handle,
                decision,
                self._ranges(current, written),
                list(shared.riding.values()),
                open_s,
                max(open_s, state.timeouts.longest_recent_s or 0.0),
            )
        except InDoubtError:
            self._last_known = False
            shared.ended(current.number, committed=False)
            raise
        except (TransientError, FencedError):
            shared.abort_quietly(current.number)
            self._current = None
            raise
        shared.ended(current.number, committed=True)
        self._current = None
        self._committed_up_to(epoch)
        state.timeouts.committed(open_s)  # a change takes effect at the next begin_epoch
        state.cluster.await_visible(written, epoch)
        self._count("rows", handle.rows)
        self._count("bytes", handle.bytes)
        self._count("epochs_committed")
        self._count("commit_seconds", time.perf_counter() - started)

    def _abort(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            self._state().shared.abort(current.number)

    @guarded("committing the epoch", in_doubt=_COMMIT_IN_DOUBT)
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        """Commit outside the last-resource path: a job that asks for at-least-once (only the
        producer that prepared the participant can), or a sink riding in another Kafka sink's
        transaction (committed with the carrier's commit, or not at all). A participant whose
        progress record is already committed is ALREADY_COMMITTED."""
        current = self._current
        prepared = current.prepared if current is not None else None
        state, topic = self._state(), self.config.progress_topic_name
        if (
            current is not None
            and prepared is not None
            and prepared.participant == (handle.participant)
        ):
            if state.carries:
                self._commit(epoch, handle, None)
                return CommitOutcome.COMMITTED
            if state.shared.committed == current.number:
                self._current = None
                self._committed_up_to(epoch)
                state.cluster.await_visible(current.written, epoch)
                self._count("rows", handle.rows)
                self._count("bytes", handle.bytes)
                self._count("epochs_committed")
                return CommitOutcome.COMMITTED
        if committer.committed_before(
            state.progress, state.context.job_id, self.name, topic, handle
        ):
            return CommitOutcome.ALREADY_COMMITTED
        raise ParticipantLostError(
            f"Kafka participant {handle.participant} cannot be committed: its transaction "
            "ended with the producer that opened it",
            **self.where(epoch),
            fix="Kafka must be the job's last resource (the coordinator does this for "
            "exactly-once jobs); replay the epoch",
        )

    @guarded("rolling the epoch back")
    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        """Abort this sink's open transaction for `epoch`, if any. A transaction opened by
        another (dead or fenced) producer is aborted by `open`'s init_transactions."""
        current = self._current
        if current is None or current.epoch != epoch:
            return
        if handle is not None and current.name != ParticipantName.parse(handle.participant):
            return
        self._abort()
        self.logger(epoch).info("rolled back participant %s", current.name)

    @guarded("recovering prepared participants")
    def recover_prepared(self) -> list[CommitHandle]:
        """Nothing to resolve: `open`'s init_transactions already aborted whatever an older
        producer of this transactional.id left open."""
        self._state()  # UsageError before open
        return []

    @guarded("reading the last committed epoch")
    def last_committed_epoch(self) -> int | None:
        if not self._last_known:
            self._last_committed = self._read_last_committed()
            self._last_known = True
        return self._last_committed

    def _no_progress_topic(self) -> bool:
        """For an operator's tool only (`OpenContext(inspect=True)`, which creates no topic):
        whether the progress topic does not exist (a job never started, or dropped), so the
        job has no progress records to read. A running sink made it at open: always False."""
        state = self._state()
        if not state.context.inspect:
            return False
        if self._progress_missing is None:
            topic, timeout = self.config.progress_topic_name, self.config.request_timeout_s
            self._progress_missing = not operations.partitions(state.cluster.admin, topic, timeout)
        return self._progress_missing

    @guarded("reading the last committed epoch")
    def _read_last_committed(self) -> int | None:
        state = self._state()
        if self._no_progress_topic():
            return None
        return recovery.last_committed(
            state.progress, state.context.job_id, self.name, self.config.progress_topic_name
        )

    # -- operations (durable-sinks status/inspect/verify; operations.py) -----------------------
    @guarded("looking for open transactions")
    def in_doubt(self) -> list[Prepared]:
        return operations.sink_in_doubt(self, self._state(), self.last_committed_epoch())

    @guarded("reading the topic and the progress records")
    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        if self._no_progress_topic():
            return {}
        return operations.sink_holdings(self.config, self._state(), first, last)

    def live_generations(self) -> list[int]:
        return []  # a transactional id's producer cannot be seen from outside

    @guarded("dropping the job's progress records")
    def drop_job(self, *, apply: bool, epoch_markers: bool = False) -> list[Bookkeeping]:
        """The job's records in the progress topic (tombstones, or the topic when only this
        sink writes it) and its transactional.id (kept); never a record of the user's
        topics (operations.drop_job)."""
        state = self._state()
        if self._no_progress_topic():
            return operations.drop_job(
                self.config, state, state.context.job_id, self.name, apply=False, records=False
            )
        return operations.drop_job(self.config, state, state.context.job_id, self.name, apply=apply)

    def decision_host(self) -> KafkaDecisionHost:
        """The progress topic as the job's decision store when this sink is the job's only
        one (decisions.py): generations claimed there, decisions read from the progress
        records. A new host with clients of its own."""
        return KafkaDecisionHost(self.config)

    @guarded("reading the epoch's decision")
    def read_decision(self, epoch: int) -> Mapping[str, JSON] | None:
        state, topic = self._state(), self.config.progress_topic_name
        if self._no_progress_topic():
            return None
        return committer.decision_of(state.progress, state.context.job_id, self.name, topic, epoch)


def _limit(ms: int | None) -> str:
    return "unlimited" if ms is None else f"{ms} ms"
