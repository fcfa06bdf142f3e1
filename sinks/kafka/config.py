"""The Kafka sink's configuration: a picklable dataclass checked when it is built (on the
driver, before anything connects); the cluster is checked at `open` (admin.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.redaction import redact

from .records import RecordLayout

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
CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.")


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
            if key.startswith(CONNECTION_PREFIXES):
                settings[key] = value
        return settings

    def __repr__(self) -> str:
        return (
            f"KafkaSinkConfig(bootstrap_servers={self.bootstrap_servers!r}, "
            f"topic={self.topic!r}, name={self.name!r}, "
            f"producer_config={redact(self.producer_config)!r})"
        )


def _valid_topic(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    return 0 < len(name) <= 249 and set(name) <= allowed and name not in (".", "..")
