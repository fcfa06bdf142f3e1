"""Exactly-once into a Kafka topic through Kafka transactions (confluent-kafka / librdkafka).

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

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import pyarrow as pa
from confluent_kafka import (
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from ._api import (
    JSON,
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from ._kafka_progress import (
    ProgressReader,
    ProgressRecord,
    decode_fence,
    encode_fence,
    fence_key,
    list_offsets,
    progress_key,
)
from ._kafka_records import EPOCH_HEADER, RECORD_OVERHEAD, RecordLayout, Records, build_records
from ._log import JobLogger
from .errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    InDoubtError,
    ParticipantLostError,
    SchemaMismatchError,
    TransientError,
)
from .naming import ParticipantName, component

#: librdkafka's own log lines go here (never with secrets: it redacts sensitive settings).
client_log = logging.getLogger("durable_sinks.sinks.kafka.client")

ConfigValue = str | int | float | bool

#: Producer settings chosen for throughput (docs/kafka.md explains each); `producer_config`
#: overrides any of them.
THROUGHPUT_DEFAULTS: Mapping[str, ConfigValue] = {
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "batch.num.messages": 10_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "sticky.partitioning.linger.ms": 20,
}
#: Settings the sink owns: giving them in `producer_config` is a ConfigError.
RESERVED = frozenset(
    {
        "bootstrap.servers",
        "transactional.id",
        "enable.idempotence",
        "transaction.timeout.ms",
        "acks",
        "isolation.level",
        "on_delivery",
        "dr_cb",
        "dr_msg_cb",
    }
)
#: Settings copied from `producer_config` to the sink's admin and consumer clients (how to
#: reach and authenticate to the cluster).
_CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.")
_SECRET_WORDS = ("password", "secret", "key", "token", "jaas", "credential")
#: librdkafka codes that mean a newer producer took over this transactional.id.
_FENCED_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)
#: Retries of a retriable transactional call (init, commit, abort) before giving up.
_CALL_ATTEMPTS = 5


def _is_secret(setting: str) -> bool:
    return any(word in setting.lower() for word in _SECRET_WORDS)


def redacted(settings: Mapping[str, ConfigValue]) -> dict[str, ConfigValue]:
    """`settings` with every secret-looking value replaced (for reprs and messages)."""
    return {k: ("***" if _is_secret(k) else v) for k, v in settings.items()}


@dataclass(frozen=True)
class KafkaSinkConfig:
    """Configuration of a KafkaSink (picklable; checked when built, the cluster at `open`).

    Records:
    - value_column: a string/binary column sent as the value (null = tombstone); None (the
      default) sends a JSON object of every column not used as key, header, timestamp or
      partition.
    - key_column, header_columns, timestamp_column (timestamp, or int64 milliseconds),
      partition_column (integer; null = the partitioner's choice): optional. Every record
      also carries the header `ds-epoch`.
    Topics:
    - topic: must exist, or set create_topic (with topic_partitions, replication_factor).
    - progress_topic: default `<topic>-ds-progress`; created if missing (one partition,
      compacted), checked if present. Jobs may share it (records are keyed by job and sink).
    Transactions:
    - transaction_timeout_ms: the broker aborts a transaction open longer than this. Must
      exceed expected_epoch_ms (the longest time from an epoch's first write to its commit)
      and must not exceed the broker's transaction.max.timeout.ms (checked at open).
    - producer_config: extra librdkafka settings (SASL/SSL, tuning); overrides
      THROUGHPUT_DEFAULTS. Secrets here are never shown.
    """

    bootstrap_servers: str
    topic: str
    name: str = "kafka"
    value_column: str | None = None
    key_column: str | None = None
    header_columns: tuple[str, ...] = ()
    timestamp_column: str | None = None
    partition_column: str | None = None
    progress_topic: str | None = None
    create_topic: bool = False
    topic_partitions: int = 1
    replication_factor: int = -1
    transaction_timeout_ms: int = 60_000
    expected_epoch_ms: int = 30_000
    producer_config: Mapping[str, ConfigValue] = field(default_factory=dict, repr=False)
    request_timeout_s: float = 30.0
    progress_scan_timeout_s: float = 60.0
    visibility_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        where = f"kafka sink {self.name!r}"
        if not self.bootstrap_servers:
            raise ConfigError(f"{where}: `bootstrap_servers` is empty", fix="host:port[,...]")
        for what, topic in (("topic", self.topic), ("progress_topic", self.progress_topic)):
            if topic is not None and not _valid_topic(topic):
                raise ConfigError(
                    f"{where}: {what} {topic!r} is not a valid topic name",
                    fix="use 1-249 characters of [A-Za-z0-9._-]",
                )
        if self.progress_topic_name == self.topic:
            raise ConfigError(
                f"{where}: progress_topic must differ from topic",
                fix="leave progress_topic unset (default: '<topic>-ds-progress') or name "
                "another topic",
            )
        if isinstance(self.header_columns, str):
            object.__setattr__(self, "header_columns", (self.header_columns,))
        roles = [
            self.value_column,
            self.key_column,
            self.timestamp_column,
            self.partition_column,
            *self.header_columns,
        ]
        used = [r for r in roles if r is not None]
        if len(used) != len(set(used)):
            raise ConfigError(
                f"{where}: a column is given more than one role: {used}",
                fix="give value_column, key_column, timestamp_column, partition_column and "
                "header_columns different columns",
            )
        if self.expected_epoch_ms <= 0 or self.transaction_timeout_ms <= 0:
            raise ConfigError(
                f"{where}: expected_epoch_ms and transaction_timeout_ms must be > 0",
                fix="leave the defaults or give positive milliseconds",
            )
        if self.transaction_timeout_ms <= self.expected_epoch_ms:
            raise ConfigError(
                f"{where}: transaction_timeout_ms ({self.transaction_timeout_ms}) must exceed "
                f"expected_epoch_ms ({self.expected_epoch_ms}), or the broker aborts epochs "
                "that take as long as expected",
                fix="raise transaction_timeout_ms (up to the broker's "
                "transaction.max.timeout.ms) or make epochs shorter",
            )
        reserved = sorted(RESERVED & set(self.producer_config))
        if reserved:
            raise ConfigError(
                f"{where}: producer_config sets {reserved}, which the sink owns",
                fix="remove them (use bootstrap_servers= and transaction_timeout_ms=)",
            )
        if self.topic_partitions < 1:
            raise ConfigError(
                f"{where}: topic_partitions must be >= 1",
                fix="leave the default or give the partition count for a topic to create",
            )
        for timeout in (
            self.request_timeout_s,
            self.progress_scan_timeout_s,
            self.visibility_timeout_s,
        ):
            if timeout <= 0:
                raise ConfigError(
                    f"{where}: time-outs must be > 0",
                    fix="give request_timeout_s, progress_scan_timeout_s and "
                    "visibility_timeout_s in positive seconds, or leave the defaults",
                )

    @property
    def progress_topic_name(self) -> str:
        return self.progress_topic or f"{self.topic}-ds-progress"

    @property
    def layout(self) -> RecordLayout:
        return RecordLayout(
            self.value_column,
            self.key_column,
            tuple(self.header_columns),
            self.timestamp_column,
            self.partition_column,
        )

    def connection_settings(self) -> dict[str, ConfigValue]:
        """What every client of the sink needs to reach the cluster (may hold secrets)."""
        settings: dict[str, ConfigValue] = {"bootstrap.servers": self.bootstrap_servers}
        for key, value in self.producer_config.items():
            if key.startswith(_CONNECTION_PREFIXES):
                settings[key] = value
        return settings

    def __repr__(self) -> str:
        return (
            f"KafkaSinkConfig(bootstrap_servers={self.bootstrap_servers!r}, "
            f"topic={self.topic!r}, name={self.name!r}, "
            f"producer_config={redacted(self.producer_config)!r})"
        )


def _valid_topic(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    return 0 < len(name) <= 249 and set(name) <= allowed and name not in (".", "..")


def kafka_error_of(exc: BaseException) -> KafkaError | None:
    """The KafkaError behind `exc`: confluent-kafka raises KafkaException(KafkaError), and a
    producer call that fails inside a callback raises SystemError whose cause or context is
    the KafkaError itself (not an exception object)."""
    seen: Any = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, KafkaError):
            return seen
        if isinstance(seen, KafkaException) and seen.args and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = getattr(seen, "__cause__", None) or getattr(seen, "__context__", None)
    return None


class _Epoch:
    def __init__(self, epoch: int, name: ParticipantName) -> None:
        self.epoch = epoch
        self.name = name
        self.rows = 0
        self.bytes = 0
        self.checksum = 0
        self.prepared: CommitHandle | None = None


class KafkaSink:
    """Exactly-once into one Kafka topic; the job's last resource (see the module docs)."""

    def __init__(self, config: KafkaSinkConfig) -> None:
        self.config = config
        self._context: OpenContext | None = None
        self._admin_client: AdminClient | None = None
        self._reader: ProgressReader | None = None
        self._producer: Producer | None = None
        self._current: _Epoch | None = None
        self._attempts: dict[int, int] = {}
        self._last_committed: int | None = None
        self._last_known = False
        self._fenced: FencedError | None = None
        #: A fatal, non-fencing producer error: the next epoch starts a new producer.
        self._producer_broken = False
        self._delivery_errors: list[KafkaError] = []
        self._partitions = 0
        self._record_limit = 0
        self._schema: pa.Schema | None = None
        self._checked_schema: pa.Schema | None = None
        self._counters = {
            "rows": 0.0,
            "bytes": 0.0,
            "epochs_committed": 0.0,
            "rollbacks": 0.0,
            "commit_seconds": 0.0,
        }

    @property
    def name(self) -> str:
        return self.config.name

    def __repr__(self) -> str:
        return f"KafkaSink(name={self.name!r}, topic={self.config.topic!r})"

    # -- context and errors --------------------------------------------------------------------
    def _ctx(self) -> OpenContext:
        if self._context is None:
            raise ConfigError(f"{self!r} is not open; the coordinator opens sinks")
        return self._context

    def _where(self, epoch: int | None = None) -> dict[str, Any]:
        context = self._context
        return {
            "job": context.job_id if context else None,
            "sink": self.name,
            "epoch": epoch,
        }

    def _log(self, epoch: int | None = None) -> JobLogger:
        job = self._context.job_id if self._context else "-"
        return JobLogger(job, self.name, epoch, component="sinks.kafka")

    @property
    def transactional_id(self) -> str:
        ctx = self._ctx()
        return f"ds:{component(ctx.job_id)}:{component(self.name)}"

    def _raise(self, exc: BaseException, what: str, epoch: int | None = None) -> NoReturn:
        """Translate a client error: fenced -> FencedError (remembered: every later call
        fails the same way); needs abort or retriable -> TransientError; other fatal errors
        break the producer (the next epoch starts a new one)."""
        if isinstance(exc, DurableSinkError):
            raise exc
        error = kafka_error_of(exc)
        if error is None and isinstance(exc, SystemError):
            if self._fenced is not None:
                raise self._fenced from None
            # A call that failed inside a callback may leave no exception behind; the
            # delivery reports say why (a fenced producer's records fail with an old epoch).
            error = next((e for e in self._delivery_errors if e.code() in _FENCED_CODES), None)
        if error is None:
            raise TransientError(
                f"{what} failed: {type(exc).__name__}: {exc}", **self._where(epoch)
            ) from exc
        if error.code() in _FENCED_CODES:
            self._fenced = FencedError(
                f"{what}: a newer producer with transactional.id {self.transactional_id!r} "
                f"took over ({error.name()}); this coordinator must stop",
                **self._where(epoch),
                fix="nothing to do here: the newer coordinator owns the job",
            )
            raise self._fenced from None
        if error.fatal():
            self._producer_broken = True
            raise TransientError(
                f"{what}: the producer hit a fatal error ({error.name()}: {error.str()}); "
                "the next attempt starts a new producer",
                **self._where(epoch),
            ) from None
        raise TransientError(
            f"{what} failed: {error.name()}: {error.str()}", **self._where(epoch)
        ) from None

    def _call(self, what: str, call: Callable[[], Any], epoch: int | None = None) -> Any:
        """Run a transactional call, retrying what librdkafka marks retriable."""
        for attempt in range(_CALL_ATTEMPTS):
            try:
                return call()
            except KafkaException as exc:
                error = kafka_error_of(exc)
                if error is not None and error.retriable() and attempt + 1 < _CALL_ATTEMPTS:
                    self._log(epoch).info("%s: retriable %s, retrying", what, error.name())
                    time.sleep(0.1 * 2**attempt)
                    continue
                self._raise(exc, what, epoch)
            except Exception as exc:  # noqa: BLE001 - translated, never swallowed
                self._raise(exc, what, epoch)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- clients -------------------------------------------------------------------------------
    def _client_settings(self) -> dict[str, Any]:
        return {**self.config.connection_settings(), "logger": client_log, "log_level": 3}

    def _admin(self) -> AdminClient:
        if self._admin_client is None:
            self._admin_client = AdminClient(self._client_settings())
        return self._admin_client

    def _progress(self) -> ProgressReader:
        if self._reader is None:
            self._reader = ProgressReader(
                self._admin(),
                self._client_settings(),
                self.config.progress_topic_name,
                self.config.progress_scan_timeout_s,
                self._where,
            )
        return self._reader

    def _new_producer(self) -> Producer:
        settings: dict[str, Any] = {
            **THROUGHPUT_DEFAULTS,
            **self.config.producer_config,
            "bootstrap.servers": self.config.bootstrap_servers,
            "transactional.id": self.transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": self.config.transaction_timeout_ms,
            # Only failures are reported: no Python call per delivered record.
            "delivery.report.only.error": True,
            "on_delivery": self._on_delivery_error,
            "logger": client_log,
        }
        try:
            return Producer(settings)
        except KafkaException as exc:
            raise ConfigError(
                f"the producer settings are invalid: {kafka_error_of(exc) or exc}",
                **self._where(),
                fix="check producer_config against librdkafka's CONFIGURATION.md",
            ) from None

    def _on_delivery_error(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            self._delivery_errors.append(error)

    def _require_producer(self, epoch: int | None = None) -> Producer:
        if self._fenced is not None:
            raise self._fenced
        if self._producer is None:
            raise ConfigError(f"{self!r} is not open", **self._where(epoch))
        return self._producer

    # -- open ----------------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._context = context
        self._check_broker()
        self._ensure_topics()
        self._start_producer(context.generation)

    def _start_producer(self, generation: int) -> None:
        """Refuse if a newer generation holds the fence; take over the transactional.id
        (aborting what an older producer left open); write this generation as the fence;
        read the last committed epoch."""
        fence = fence_key(self._ctx().job_id, self.name)
        self._check_fence(self._progress().latest({fence: _any}).get(fence), generation)
        if self._producer is not None:
            with contextlib.suppress(Exception):
                self._producer.close()
        self._producer = self._new_producer()
        self._fenced, self._producer_broken = None, False
        producer = self._producer
        self._call("init_transactions", lambda: producer.init_transactions(self._timeout))
        self._call("begin_transaction", producer.begin_transaction)
        try:
            producer.produce(
                self.config.progress_topic_name, encode_fence(generation), fence, partition=0
            )
        except Exception as exc:  # noqa: BLE001 - translated
            self._raise(exc, "writing the fence record")
        self._call("commit_transaction", lambda: producer.commit_transaction(self._timeout))
        # The older producer's transaction is settled now: the progress topic is exact.
        record, holder = self._latest_progress(lambda r: True, fence)
        self._check_fence(holder, generation)
        self._last_committed = record.epoch if record is not None else None
        self._last_known = True
        self._log().info(
            "producer %s ready for generation %d; last committed epoch %s",
            self.transactional_id,
            generation,
            self._last_committed,
        )

    @property
    def _timeout(self) -> float:
        return self.config.request_timeout_s

    def _check_fence(self, found: tuple[int, bytes] | None, generation: int) -> None:
        """`found` is the latest fence record (offset, value), if any."""
        if found is None:
            return
        offset, value = found
        holder = decode_fence(value, f"{self.config.progress_topic_name}@{offset}")
        if holder > generation:
            self._fenced = FencedError(
                f"generation {holder} of this job already opened the sink; this coordinator "
                f"(generation {generation}) is older and must stop",
                **self._where(),
                fix="nothing to do here: the newer coordinator owns the job",
            )
            raise self._fenced

    def _check_broker(self) -> None:
        """transaction.timeout.ms must not exceed the broker's transaction.max.timeout.ms."""
        admin = self._admin()
        try:
            cluster = admin.describe_cluster(request_timeout=self._timeout).result()
            broker = ConfigResource(ConfigResource.Type.BROKER, str(cluster.nodes[0].id))
            configs = admin.describe_configs([broker], request_timeout=self._timeout)
            entries = configs[broker].result()
        except KafkaException as exc:
            raise TransientError(
                f"cannot reach the Kafka cluster at {self.config.bootstrap_servers}: "
                f"{kafka_error_of(exc) or exc}",
                **self._where(),
                fix="check that the brokers run and bootstrap_servers and the security "
                "settings are right",
            ) from None
        entry = entries.get("transaction.max.timeout.ms")
        limit = int(entry.value) if entry is not None and entry.value else 900_000
        if self.config.transaction_timeout_ms > limit:
            raise ConfigError(
                f"transaction_timeout_ms {self.config.transaction_timeout_ms} exceeds the "
                f"broker's transaction.max.timeout.ms ({limit})",
                **self._where(),
                fix=f"set transaction_timeout_ms <= {limit}, or raise transaction.max.timeout.ms "
                "in the brokers' server.properties",
            )

    def _ensure_topics(self) -> None:
        admin = self._admin()
        topic, progress = self.config.topic, self.config.progress_topic_name
        metadata = admin.list_topics(timeout=self._timeout)
        wanted: list[NewTopic] = []
        if topic not in metadata.topics:
            if not self.config.create_topic:
                raise ConfigError(
                    f"topic {topic!r} does not exist",
                    **self._where(),
                    fix="create it, or set create_topic=True (with topic_partitions=)",
                )
            wanted.append(
                NewTopic(topic, self.config.topic_partitions, self.config.replication_factor)
            )
        if progress not in metadata.topics:
            wanted.append(
                NewTopic(
                    progress,
                    1,
                    self.config.replication_factor,
                    config={"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"},
                )
            )
        created = admin.create_topics(wanted, request_timeout=self._timeout) if wanted else {}
        for name, future in created.items():
            try:
                future.result()
                self._log().info("created topic %s", name)
            except KafkaException as exc:
                error = kafka_error_of(exc)
                if error is None or error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise ConfigError(
                        f"cannot create topic {name!r}: {error or exc}",
                        **self._where(),
                        fix="create it yourself, or grant the CREATE permission",
                    ) from None
        if wanted:
            metadata = self._wait_for_topics(admin, [t.topic for t in wanted])
        self._partitions = len(metadata.topics[topic].partitions)
        progress_partitions = len(metadata.topics[progress].partitions)
        if progress_partitions != 1:
            raise ConfigError(
                f"progress topic {progress!r} has {progress_partitions} partitions; it needs 1",
                **self._where(),
                fix="give the sink another progress_topic (it is created with 1 partition)",
            )
        self._check_topic_configs(admin, topic, progress)

    def _wait_for_topics(self, admin: AdminClient, names: list[str]) -> Any:
        deadline = time.monotonic() + self._timeout
        while True:
            metadata = admin.list_topics(timeout=self._timeout)
            ready = all(
                n in metadata.topics
                and metadata.topics[n].error is None
                and metadata.topics[n].partitions
                and all(p.leader >= 0 for p in metadata.topics[n].partitions.values())
                for n in names
            )
            if ready or time.monotonic() > deadline:
                return metadata
            time.sleep(0.05)

    def _check_topic_configs(self, admin: AdminClient, topic: str, progress: str) -> None:
        resources = [
            ConfigResource(ConfigResource.Type.TOPIC, topic),
            ConfigResource(ConfigResource.Type.TOPIC, progress),
        ]
        futures = admin.describe_configs(resources, request_timeout=self._timeout)
        topic_config, progress_config = (futures[r].result() for r in resources)
        cleanup = progress_config["cleanup.policy"].value or ""
        retention = int(progress_config["retention.ms"].value or -1)
        if "compact" not in cleanup and 0 <= retention < 7 * 24 * 3600 * 1000:
            raise ConfigError(
                f"progress topic {progress!r} has cleanup.policy={cleanup} and retention.ms="
                f"{retention}: the last committed epoch could be deleted",
                **self._where(),
                fix="set cleanup.policy=compact on it (or retention.ms=-1)",
            )
        limits = [int(topic_config["max.message.bytes"].value)]
        limits.append(int(self.config.producer_config.get("message.max.bytes", 1_000_000)))
        self._record_limit = min(limits)

    def _read_last_committed(self) -> None:
        record, _ = self._latest_progress(lambda r: True)
        self._last_committed = record.epoch if record is not None else None
        self._last_known = True

    def _latest_progress(
        self, accept: Callable[[ProgressRecord], bool], fence: bytes | None = None
    ) -> tuple[ProgressRecord | None, tuple[int, bytes] | None]:
        """The latest progress record `accept`s and, in the same scan, the latest fence
        record (offset, value) when `fence` is given."""
        key = progress_key(self._ctx().job_id, self.name)
        topic = self.config.progress_topic_name
        decoded: dict[int, ProgressRecord] = {}

        def check(value: bytes, offset: int) -> bool:
            decoded[offset] = ProgressRecord.decode(value, f"{topic}@{offset}")
            return accept(decoded[offset])

        want: dict[bytes, Callable[[bytes, int], bool]] = {key: check}
        if fence is not None:
            want[fence] = _any
        found = self._progress().latest(want)
        record = decoded[found[key][0]] if key in found else None
        return record, found.get(fence) if fence is not None else None

    # -- protocol ------------------------------------------------------------------------------
    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(
            exactly_once=True,
            two_phase_commit=True,
            resumable_prepare=False,
            distributed_prepare=False,
            partitioned=False,
        )

    def schema(self) -> pa.Schema | None:
        return self._schema

    def metrics(self) -> Mapping[str, float]:
        return dict(self._counters)

    def health_check(self) -> None:
        self._require_producer()
        try:
            self._admin().list_topics(self.config.topic, timeout=self._timeout)
        except KafkaException as exc:
            raise TransientError(
                f"the Kafka cluster does not answer: {kafka_error_of(exc) or exc}",
                **self._where(),
                fix="check that the brokers run",
            ) from None

    def close(self) -> None:
        """Release the clients. An open transaction is left to the broker (it aborts it at
        transaction.timeout.ms, or the next open aborts it at once)."""
        producer, self._producer = self._producer, None
        self._current = None
        if producer is not None:
            with warnings.catch_warnings(record=True) as caught, contextlib.suppress(Exception):
                warnings.simplefilter("always")
                producer.close()  # aborts an open transaction; fails harmlessly when fenced
            for warning in caught:
                self._log().debug("closing the producer: %s", warning.message)
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(Exception):
                reader.close()
        self._admin_client = None

    def begin_epoch(self, epoch: int) -> None:
        if self._producer_broken and self._fenced is None:
            self._log(epoch).warning("replacing the producer after a fatal error")
            self._start_producer(self._ctx().generation)
        producer = self._require_producer(epoch)
        if self._current is not None:
            self._abort(self._current.epoch)
        attempt = self._attempts.get(epoch, 0)
        self._attempts[epoch] = attempt + 1
        self._delivery_errors.clear()
        self._call("begin_transaction", producer.begin_transaction, epoch)
        self._current = _Epoch(epoch, self._ctx().participant(epoch, attempt))

    def _require_current(self, epoch: int) -> _Epoch:
        current = self._current
        if current is None or current.epoch != epoch:
            raise ConfigError(f"epoch {epoch} was not begun on this sink", **self._where(epoch))
        return current

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        current = self._current
        if current is None:
            raise ConfigError("write_batch before begin_epoch", **self._where())
        producer = self._require_producer(current.epoch)
        self._check_schema(batch, current.epoch)
        records = build_records(batch, self.config.layout, current.checksum)
        self._check_records(records, current)
        topic = self.config.topic
        epoch_header: tuple[str, str | bytes | None] = (EPOCH_HEADER, str(current.epoch).encode())
        produce, poll = producer.produce, producer.poll
        plain = (
            records.headers is None and records.timestamps is None and records.partitions is None
        )
        try:
            if plain:
                headers: list[tuple[str, str | bytes | None]] = [epoch_header]
                keys = records.keys if records.keys is not None else [None] * len(records)
                for value, key in zip(records.values, keys, strict=True):
                    try:
                        produce(topic, value, key, headers=headers)
                    except BufferError:
                        poll(0.05)
                        produce(topic, value, key, headers=headers)
            else:
                for value, key, extra, ts, part in records.produce_args():
                    row_headers = [epoch_header, *extra] if extra else [epoch_header]
                    try:
                        produce(topic, value, key, part, timestamp=ts, headers=row_headers)
                    except BufferError:
                        poll(0.05)
                        produce(topic, value, key, part, timestamp=ts, headers=row_headers)
            poll(0)
        except BufferError:
            self._raise_full(current.epoch)
        except Exception as exc:  # noqa: BLE001 - translated
            self._raise(exc, "producing records", current.epoch)
        self._check_delivery(current.epoch)
        written = records.total_bytes()
        current.rows += len(records)
        current.bytes += written
        current.checksum = records.checksum
        return WriteResult(len(records), written)

    def _raise_full(self, epoch: int) -> NoReturn:
        raise TransientError(
            "the producer's queue stayed full (the brokers do not keep up)",
            **self._where(epoch),
            fix="raise queue.buffering.max.messages/kbytes in producer_config, or check the "
            "brokers",
        )

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
        self._checked_schema = self._schema = batch.schema

    def _check_records(self, records: Records, current: _Epoch) -> None:
        """Refuse, before producing any record of the batch, a record over the size limit
        or a partition the topic does not have."""
        limit = self._record_limit - RECORD_OVERHEAD
        row, biggest = records.largest()
        if biggest > limit:
            raise SchemaMismatchError(
                f"row {current.rows + row} of the epoch makes a record of about "
                f"{biggest + RECORD_OVERHEAD} bytes; the limit is {self._record_limit} bytes "
                f"(min of topic {self.config.topic!r} max.message.bytes and the producer's "
                "message.max.bytes)",
                **self._where(current.epoch),
                fix="filter or split oversize rows before the sink, or raise max.message.bytes "
                "on the topic and message.max.bytes in producer_config",
            )
        if records.partitions is not None:
            bad = [p for p in records.partitions if p >= self._partitions or p < -1]
            if bad:
                raise SchemaMismatchError(
                    f"partition_column holds {bad[0]}, but topic {self.config.topic!r} has "
                    f"partitions 0..{self._partitions - 1}",
                    **self._where(current.epoch),
                    fix="compute partitions modulo the topic's partition count, or leave the "
                    "column null to let the partitioner choose",
                )

    def _check_delivery(self, epoch: int) -> None:
        if self._delivery_errors:
            error = self._delivery_errors[0]
            if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise SchemaMismatchError(
                    f"the broker refused a record as too large ({error.str()})",
                    **self._where(epoch),
                    fix="raise max.message.bytes on the topic, or make rows smaller",
                )
            self._raise(KafkaException(error), "delivering records", epoch)

    def pre_commit(self, epoch: int) -> CommitHandle:
        """Phase 1: every record acknowledged inside the still-open transaction."""
        current = self._require_current(epoch)
        producer = self._require_producer(epoch)
        try:
            remaining = producer.flush(self._timeout)
        except Exception as exc:  # noqa: BLE001 - translated
            self._raise(exc, "flushing records", epoch)
        self._check_delivery(epoch)
        if remaining:
            raise TransientError(
                f"{remaining} records were not acknowledged within {self._timeout:g} s",
                **self._where(epoch),
            )
        current.prepared = CommitHandle(
            self.name,
            epoch,
            str(current.name),
            current.rows,
            current.bytes,
            f"crc32:{current.checksum:08x}",
            {
                "transactional_id": self.transactional_id,
                "topic": self.config.topic,
                "progress_topic": self.config.progress_topic_name,
            },
        )
        return current.prepared

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
            raise ConfigError(
                f"participant {handle.participant} is not this sink's prepared one",
                **self._where(epoch),
            )
        producer = self._require_producer(epoch)
        started = time.perf_counter()
        record = ProgressRecord(
            epoch,
            self._ctx().generation,
            handle.participant,
            handle.rows,
            handle.checksum,
            decision,
        )
        key = progress_key(self._ctx().job_id, self.name)
        written = self._high_watermarks()
        try:
            producer.produce(self.config.progress_topic_name, record.encode(), key, partition=0)
        except Exception as exc:  # noqa: BLE001 - translated
            self._abort_after_failure(epoch)
            self._raise(exc, "writing the progress record", epoch)
        # commit_transaction flushes the progress record first; if it cannot be delivered
        # the transaction needs an abort (handled there) and nothing becomes visible.
        self._commit_transaction(producer, epoch)
        self._current = None
        self._last_committed = (
            epoch if self._last_committed is None else max(self._last_committed, epoch)
        )
        self._await_visible(written, epoch)
        self._counters["rows"] += handle.rows
        self._counters["bytes"] += handle.bytes
        self._counters["epochs_committed"] += 1
        self._counters["commit_seconds"] += time.perf_counter() - started

    def _commit_transaction(self, producer: Producer, epoch: int) -> None:
        for attempt in range(_CALL_ATTEMPTS):
            try:
                producer.commit_transaction(self._timeout)
            except KafkaException as exc:
                error = kafka_error_of(exc)
                if error is not None and error.txn_requires_abort():
                    self._abort_after_failure(epoch)
                    raise TransientError(
                        f"the transaction had to be aborted ({error.name()}: {error.str()}); "
                        "nothing of the epoch is visible",
                        **self._where(epoch),
                    ) from None
                if error is not None and error.retriable() and attempt + 1 < _CALL_ATTEMPTS:
                    time.sleep(0.1 * 2**attempt)
                    continue
                if error is not None and (error.code() in _FENCED_CODES):
                    self._raise(exc, "commit_transaction", epoch)
                self._last_known = False
                raise InDoubtError(
                    f"commit_transaction failed ({error or exc}); the epoch may or may not be "
                    "committed",
                    **self._where(epoch),
                    fix="restart the job: recovery reads the outcome from the progress topic",
                ) from None
            except Exception as exc:  # a fenced producer raises SystemError
                if self._fenced is not None or isinstance(exc, SystemError):
                    self._raise(exc, "commit_transaction", epoch)
                self._last_known = False
                raise InDoubtError(
                    f"commit_transaction failed ({type(exc).__name__}: {exc})",
                    **self._where(epoch),
                ) from exc
            else:
                return

    def _abort_after_failure(self, epoch: int) -> None:
        with contextlib.suppress(DurableSinkError):
            self._abort(epoch)

    def _abort(self, epoch: int) -> None:
        producer = self._producer
        self._current = None
        if producer is None or self._fenced is not None or self._producer_broken:
            return  # a fenced or broken producer's transaction is aborted by the next init
        self._call("abort_transaction", lambda: producer.abort_transaction(self._timeout), epoch)
        self._counters["rollbacks"] += 1

    def _high_watermarks(self) -> dict[TopicPartition, int]:
        """High watermarks (read_uncommitted) of the topic's partitions: after pre_commit's
        flush they are past the epoch's records. The progress record needs no wait: its
        readers (recovery) read up to the high watermark with read_committed, which waits
        for the commit markers by itself."""
        partitions = [TopicPartition(self.config.topic, p) for p in range(self._partitions)]
        return self._offsets(partitions, IsolationLevel.READ_UNCOMMITTED)

    def _offsets(
        self, partitions: list[TopicPartition], level: IsolationLevel
    ) -> dict[TopicPartition, int]:
        return list_offsets(self._admin(), partitions, level, self._timeout)

    def _await_visible(self, written: dict[TopicPartition, int], epoch: int) -> None:
        """Wait until read_committed readers can see the epoch (the commit markers landed on
        every partition): the last stable offsets reach the high watermarks taken before the
        commit. Bounded: another writer's open transaction can hold them back."""
        deadline = time.monotonic() + self.config.visibility_timeout_s
        pending = dict(written)
        delay = 0.001
        while pending:
            try:
                stable = self._offsets(list(pending), IsolationLevel.READ_COMMITTED)
            except KafkaException:
                stable = {}
            pending = {p: o for p, o in pending.items() if stable.get(p, -1) < o}
            if not pending:
                return
            if time.monotonic() > deadline:
                self._log(epoch).warning(
                    "committed, but read_committed readers do not see it yet after %.1f s "
                    "(another transaction holds %s)",
                    self.config.visibility_timeout_s,
                    ", ".join(f"{p.topic}[{p.partition}]" for p in pending),
                )
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

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

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        """Abort this sink's open transaction for `epoch`, if any. A transaction opened by
        another (dead or fenced) producer is aborted by `open`'s init_transactions."""
        current = self._current
        if current is None or current.epoch != epoch:
            return
        if handle is not None and current.name != ParticipantName.parse(handle.participant):
            return
        self._abort(epoch)
        self._log(epoch).info("rolled back participant %s", current.name)

    def recover_prepared(self) -> list[CommitHandle]:
        """Nothing to resolve: `open`'s init_transactions already aborted whatever an older
        producer of this transactional.id left open."""
        self._ctx()
        return []

    def last_committed_epoch(self) -> int | None:
        if not self._last_known:
            self._read_last_committed()
        return self._last_committed

    def read_decision(self, epoch: int) -> Mapping[str, JSON] | None:
        record, _ = self._latest_progress(lambda r: r.epoch <= epoch)
        if record is None or record.epoch != epoch:
            return None
        return record.decision


_EMPTY = pa.schema([])


def _any(value: bytes, offset: int) -> bool:
    return True
