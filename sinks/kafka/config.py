"""The Kafka sink's configuration, `durable_sinks.Kafka`: a frozen, picklable dataclass checked
when it is built (on the driver, before anything connects); the cluster is checked at `open`
(admin.py). Importing it loads no part of the `kafka` extra (confluent-kafka, orjson)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.redaction import is_secret, redact
from durable_sinks.core.secrets import resolve_settings
from durable_sinks.core.settings import apply_conveniences

from .timeouts import CLIENT_MAX_S, CLIENT_MIN_S

if TYPE_CHECKING:
    from .records import RecordLayout

ConfigValue = str | int | float | bool

#: The record shape of Spark's own Kafka sink: columns `value`, `key`, `headers`,
#: `partition`, `topic`, `timestamp` (spark_shape.py).
SPARK_SHAPE = "spark"
#: The sink's own record shape: the `*_column` options name the columns; without
#: `value_column` the value is a JSON object of the row's other columns.
JSON_SHAPE = "json"
RECORD_SHAPES = (SPARK_SHAPE, JSON_SHAPE)
#: The column whose presence chooses the Spark shape when no shape is configured.
SPARK_VALUE_COLUMN = "value"


def record_shape_of(configured: str | None, layout: RecordLayout, names: Sequence[str]) -> str:
    """The record shape a batch with columns `names` is written in: the configured one; else
    the JSON shape when any `*_column` option is set; else Spark's when the batch has a
    `value` column, the JSON shape otherwise."""
    if configured is not None:
        return configured
    if layout.roles():
        return JSON_SHAPE
    return SPARK_SHAPE if SPARK_VALUE_COLUMN in names else JSON_SHAPE


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
    # Connect to the brokers as soon as they are known: sparse, init_transactions often
    # waits 50-500 ms for a broker connection (benchmarks/kafka_startup.py).
    "enable.sparse.connections": False,
    # A keyed record goes to the partition Java's clients (Spark's Kafka sink, Kafka Streams,
    # Flink) put it in: murmur2 of the key, not librdkafka's own CRC-32 (`consistent_random`).
    # Records without a key go to a random partition, as with the Java client.
    "partitioner": "murmur2_random",
}
#: How soon every client of the sink tries a broker again after losing it. librdkafka doubles
#: its pause after each failed attempt up to `reconnect.backoff.max.ms` (10 s by default), so
#: a broker that answered again after a restart was used only up to ~10 s later (seen: a
#: batch went on 2.7-10 s after the broker answered, 5 s down). 1 s caps that wait at about
#: a second, for at most one connection attempt a second per broker while it is down.
#: TCP keepalives end a connection to a peer gone at the TCP level (host down, packets
#: dropped) that sits idle; a request waiting for an answer ends at the call's own bound
#: (request_timeout_s, docs/kafka.md "Bounded waits"). `producer_config` overrides both.
CONNECTION_DEFAULTS: Mapping[str, ConfigValue] = {
    "reconnect.backoff.max.ms": 1000,
    "socket.keepalive.enable": True,
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
CONNECTION_PREFIXES = (
    "security.",
    "sasl.",
    "ssl.",
    "client.",
    "socket.",
    "broker.",
    "reconnect.",
)


@dataclass(frozen=True)
class Kafka:
    """A Kafka topic as a sink: `durable_sink(Kafka(bootstrap_servers=..., topic="events"),
    job_id="orders")`.

    Each epoch is one Kafka transaction holding the records and the epoch's progress record
    (in the progress topic); the sink is the job's last resource: its commit is the job's
    commit point (docs/kafka.md). Frozen and picklable; checked when built, on the driver,
    the cluster at `open`.
    """

    kind: ClassVar[str] = "kafka"

    bootstrap_servers: str
    """`host:port[,host:port...]`, checked as librdkafka reads it: entries separated by commas
    (spaces around them ignored, empty ones skipped), a port of 1-65535 (absent: 9092), an IPv6
    address in brackets (`[::1]:9092`), an optional `PLAINTEXT://`-style prefix that must match
    `security.protocol`. Anything else (`localhost:abc`, `host:99999`, `http://...`, `a:9092
    b:9092`) is a ConfigError naming the entry. Required."""
    topic: str | None = None
    """The topic every record goes to; it must exist unless `create_topic`. As in Spark's
    Kafka sink it takes precedence over a `topic` column, which is then ignored. At most 237
    characters with the default progress topic (`<topic>-ds-progress` must fit Kafka's 249),
    or give `progress_topic`. Default None: each row goes to the topic its `topic` column
    names (`topic_column` in the JSON record shape), within `topics` / `topic_pattern`
    ([kafka.md](kafka.md#a-topic-per-row)); `progress_topic` is then required."""
    topics: tuple[str, ...] = ()
    """Without `topic`: the topics rows may name. A row naming another topic is a bad row
    (INVALID_VALUE). With `topic_pattern`, a topic may match either. Default none: any topic
    that exists (then `create_topic` is refused: a bad row must not create topics)."""
    topic_pattern: str | None = None
    """Without `topic`: a regular expression (Python `re`, whole name) the topics rows name
    must match, like `topics`. Default None."""
    topic_column: str | None = None
    """The JSON record shape's column naming each row's topic when `topic` is not set (a
    string column, left out of the JSON value); the Spark record shape always reads `topic`.
    Default None."""
    name: str = "kafka"
    """The sink's name within the job: part of the `transactional.id` `ds:<job>:<name>`, of
    progress records and of logs. Default "kafka"."""
    value_column: str | None = None
    """A string or binary column sent as each record's value (a null is a tombstone). Default
    None: a JSON object of every column not used as key, header, timestamp or partition."""
    key_column: str | None = None
    """A string or binary column sent as each record's key. Default None (and a null): no
    key."""
    header_columns: tuple[str, ...] = ()
    """String or binary columns sent as record headers of the same name (with
    `epoch_header=True`, after `ds-epoch`, the batch id). Default none."""
    timestamp_column: str | None = None
    """A timestamp column, or an integer column of milliseconds since the Unix epoch, used as
    each record's timestamp. Default None: the producer's clock."""
    partition_column: str | None = None
    """An integer column naming each record's partition (a null: the partitioner's choice, a
    hash of the key); a partition the topic lacks is refused. Default None."""
    progress_topic: str | None = None
    """The one-partition, compacted topic holding each committed batch's progress record (with
    the decision) and the fence ([kafka.md](kafka.md#the-progress-topic)). Default
    `<topic>-ds-progress`; created if missing, checked if present; jobs may share it. It must
    differ from `topic` by more than `.` against `_` (Kafka counts those as one character)."""
    create_topic: bool = False
    """Create `topic` if it is missing (with topic_partitions and replication_factor); with
    a topic per row, create a missing topic of `topics` / `topic_pattern` when a row first
    names it. Default False: a missing `topic` is a ConfigError at start, a row naming a
    missing topic a bad row."""
    topic_partitions: int = 1
    """Partitions of a topic this sink creates. Default 1."""
    replication_factor: int = -1
    """Replication factor of a topic this sink creates. Default -1: the broker's default."""
    transaction_timeout_s: float | None = None
    """Seconds after which the broker aborts an epoch's transaction left open (the producer's
    `transaction.timeout.ms`), used as is; above the broker's `transaction.max.timeout.ms`
    (read at start) it is a ConfigError. Default None: derived from how long the job's epochs
    keep their transaction open (four times the longest of the last 20, on a ladder from
    60 s up to the broker's limit; a job's first epoch ever takes the limit), and raised to
    the limit for the next attempt when the broker aborts a transaction for its age
    ([kafka.md](kafka.md#transaction-timeout))."""
    max_transaction_timeout_s: float | None = None
    """Seconds: the longest transaction timeout the sink derives by itself, and so the longest
    a driver that died with an epoch's transaction open holds `read_committed` readers of
    its partitions back ([kafka.md](kafka.md#transaction-timeout)). Default None: the
    broker's `transaction.max.timeout.ms` (Kafka's default 900 s). Not with
    `transaction_timeout_s`."""
    producer_config: Mapping[str, ConfigValue] = field(default_factory=dict, repr=False)
    """Extra librdkafka producer settings: SASL/SSL (`security.protocol`, `sasl.*`, `ssl.*`),
    tuning; they override `THROUGHPUT_DEFAULTS` ([kafka.md](kafka.md#throughput-settings)).
    Settings the sink owns are refused: `bootstrap.servers`, `transactional.id`,
    `enable.idempotence`, `transaction.timeout.ms`, `acks`, delivery callbacks. Settings
    starting with `security.`, `sasl.`, `ssl.`, `client.`, `socket.`, `broker.`, `reconnect.`
    also go to the sink's admin and consumer clients. Values may be `${env:NAME}` references;
    secrets here are never shown. Default none."""
    request_timeout_s: float = 30.0
    """Seconds any call to the cluster may take (init, flush, commit, admin and metadata
    requests). Default 30."""
    progress_scan_timeout_s: float = 60.0
    """Seconds the sink may spend reading the progress topic (at start, its last committed
    epoch; the fence record when it must tell a fence from a time-out). Its requests for the
    topic's offsets take request_timeout_s at most. Default 60."""
    visibility_timeout_s: float = 10.0
    """Seconds the sink waits after a commit until `read_committed` readers see the batch
    ([kafka.md](kafka.md#visibility)). Default 10."""
    epoch_header: bool = False
    """True: every record also carries the header `ds-epoch` (the epoch that wrote it), at
    twice the producer's per-record cost (docs/kafka.md, "The epoch header"). Either way
    read_committed readers see each epoch exactly once, and each progress record names the
    offset ranges its epoch's records occupy, which the audit counts. Default False."""
    produce_in_bulk: bool = True
    """True: a batch's records without headers, timestamps or partitions of their own reach
    librdkafka in one call per record batch, read from the Arrow buffers (about twice as fast
    as a call per record; docs/kafka.md, "Throughput settings"), when the installed
    confluent-kafka is one the sink can verify this on; else, and with False, one `produce()`
    call per record. Default True."""
    record_shape: str | None = None
    """How a row becomes a record (docs/kafka.md, "Record shape"): "spark", Spark's Kafka
    sink's columns `value`, `key`, `headers`, `partition`, `topic`, `timestamp`, written as
    that sink writes them; "json", the `*_column` options (without `value_column` the value
    is a JSON object of the row's other columns). None (the default): "json" when any
    `*_column` option is set, else "spark" for a batch with a `value` column and "json" for
    one without."""

    def __post_init__(self) -> None:
        apply_conveniences(self)
        where = f"kafka sink {self.name!r}"
        _check_producer_config(self.producer_config, where)
        resolve_settings(self.producer_config, f"{where}: producer_config")  # refs resolve here
        protocol = str(self.producer_config.get("security.protocol", "plaintext"))
        bootstrap_hosts(self.bootstrap_servers, protocol, where)
        _check_topics(self.topic, self.progress_topic, where)
        _check_routing(self, where)
        roles = [
            self.value_column,
            self.key_column,
            self.timestamp_column,
            self.partition_column,
            self.topic_column,
            *self.header_columns,
        ]
        used = [r for r in roles if r is not None]
        _check_record_shape(self.record_shape, self.layout, where)
        if len(used) != len(set(used)):
            raise ConfigError(
                f"{where}: a column is given more than one role: {used}",
                fix="give value_column, key_column, timestamp_column, partition_column and "
                "header_columns different columns",
            )
        for what, seconds in (
            ("transaction_timeout_s", self.transaction_timeout_s),
            ("max_transaction_timeout_s", self.max_transaction_timeout_s),
        ):
            if seconds is not None and not (
                isinstance(seconds, int | float) and CLIENT_MIN_S <= seconds <= CLIENT_MAX_S
            ):
                raise ConfigError(
                    f"{where}: {what} must be from {CLIENT_MIN_S:g} to {CLIENT_MAX_S:g} s "
                    f"(librdkafka's range of transaction.timeout.ms), not {seconds!r}",
                    fix=f"give {what} in seconds, or leave it unset for the derived timeout",
                )
        if self.transaction_timeout_s is not None and self.max_transaction_timeout_s is not None:
            raise ConfigError(
                f"{where}: transaction_timeout_s and max_transaction_timeout_s are both set; "
                "the first fixes the timeout, the second bounds the derived one",
                fix="give transaction_timeout_s alone (a fixed timeout) or "
                "max_transaction_timeout_s alone (the derived timeout, at most this)",
            )
        reserved = sorted(RESERVED & set(self.producer_config))
        if reserved:
            raise ConfigError(
                f"{where}: producer_config sets {reserved}, which the sink owns",
                fix="remove them (use bootstrap_servers= and transaction_timeout_s=)",
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
        return progress_topic_of(self.topic, self.progress_topic)

    @property
    def routed(self) -> bool:
        """Whether each row names its topic (no `topic` option)."""
        return self.topic is None

    def allows(self, topic: str) -> bool:
        """Whether rows may name `topic` (always, when neither `topics` nor `topic_pattern`
        bounds them)."""
        if not self.topics and self.topic_pattern is None:
            return True
        if topic in self.topics:
            return True
        return (
            self.topic_pattern is not None and re.fullmatch(self.topic_pattern, topic) is not None
        )

    def bounds(self) -> str:
        """The topics rows may name, as the options say it."""
        said = []
        if self.topics:
            said.append(f"topics={list(self.topics)!r}")
        if self.topic_pattern is not None:
            said.append(f"topic_pattern={self.topic_pattern!r}")
        return " or ".join(said) or "any existing topic"

    def record_shape_for(self, schema: pa.Schema) -> str:
        """The record shape a batch of `schema` is written in (record_shape_of)."""
        return record_shape_of(self.record_shape, self.layout, schema.names)

    @property
    def layout(self) -> RecordLayout:
        """How a row becomes a record (loads the record encoder, and with it orjson)."""
        from .records import RecordLayout

        return RecordLayout(
            self.value_column,
            self.key_column,
            tuple(self.header_columns),
            self.timestamp_column,
            self.partition_column,
            self.topic_column,
        )

    def connection_settings(self) -> dict[str, ConfigValue]:
        """What every client of the sink needs to reach the cluster (may hold secrets)."""
        wanted = {
            k: v for k, v in self.producer_config.items() if k.startswith(CONNECTION_PREFIXES)
        }
        where = f"kafka sink {self.name!r}: producer_config"
        return {
            "bootstrap.servers": self.bootstrap_servers,
            **CONNECTION_DEFAULTS,
            **resolve_settings(wanted, where),
        }

    def __repr__(self) -> str:
        return (
            f"Kafka(bootstrap_servers={self.bootstrap_servers!r}, "
            f"topic={self.topic!r}, name={self.name!r}, "
            f"producer_config={redact(self.producer_config)!r})"
        )


#: Kafka's limit on a topic name's length.
MAX_TOPIC_LENGTH = 249
PROGRESS_SUFFIX = "-ds-progress"
#: The progress reader's consumer group: never joined and no offset is committed, but
#: librdkafka looks up its coordinator, which needs DESCRIBE on the group (docs/security.md).
PROGRESS_READER_GROUP = "durable-sinks-progress-reader"
#: librdkafka's port when a bootstrap entry names none.
DEFAULT_PORT = 9092
#: The `proto://` prefixes librdkafka accepts on a bootstrap entry (it must match
#: security.protocol).
SECURITY_PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_BOOTSTRAP_FIX = "bootstrap_servers='host:port[,host:port...]', e.g. 'broker1:9092,broker2:9092'"


def _valid_topic(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    return isinstance(name, str) and (
        0 < len(name) <= MAX_TOPIC_LENGTH and set(name) <= allowed and name not in (".", "..")
    )


def valid_topic(name: str) -> bool:
    """Whether Kafka takes `name` as a topic name."""
    return _valid_topic(name)


def progress_topic_of(topic: str | None, progress_topic: str | None) -> str:
    """The progress topic's name: the one given, else `<topic>-ds-progress` (a sink with a
    topic per row must give one: checked when the configuration is built)."""
    if progress_topic is not None:
        return progress_topic
    if topic is None:
        raise ConfigError(
            "a Kafka sink without `topic` needs progress_topic",
            fix="progress_topic='<job>-ds-progress'",
        )
    return f"{topic}{PROGRESS_SUFFIX}"


def _check_routing(config: Kafka, where: str) -> None:
    """A topic per row: a progress topic named, the bounds valid, and `create_topic` only
    within bounds; with `topic`, no bounds (the column is ignored)."""
    for name in config.topics:
        if not _valid_topic(name):
            raise ConfigError(
                f"{where}: topics holds {name!r}, which is not a valid topic name",
                fix=f"use 1-{MAX_TOPIC_LENGTH} characters of [A-Za-z0-9._-]",
            )
    if config.topic_pattern is not None:
        try:
            re.compile(config.topic_pattern)
        except (re.error, TypeError) as exc:
            raise ConfigError(
                f"{where}: topic_pattern {config.topic_pattern!r} is not a regular expression "
                f"({exc})",
                fix="give a Python regular expression matched against whole topic names, "
                "e.g. topic_pattern=r'events\\.[a-z]+'",
            ) from None
    if not config.routed:
        given = [
            n
            for n, v in (
                ("topics", config.topics),
                ("topic_pattern", config.topic_pattern),
                ("topic_column", config.topic_column),
            )
            if v
        ]
        if given:
            raise ConfigError(
                f"{where}: topic={config.topic!r} sends every row to that topic (it takes "
                f"precedence over a topic column, as in Spark's Kafka sink), so {given} "
                "would have no effect",
                fix="remove topic= to send each row to the topic its topic column names, or "
                f"remove {', '.join(given)}",
            )
        return
    if config.progress_topic is None:
        raise ConfigError(
            f"{where}: without topic=, each row names its topic, and the sink needs a "
            "progress topic of its own name",
            fix="give progress_topic='<job>-ds-progress' (a stable name: the job's progress "
            "and fence live there; jobs may share it), or give topic= for one topic",
        )
    if config.progress_topic in config.topics or (
        config.topic_pattern is not None and config.allows(config.progress_topic)
    ):
        raise ConfigError(
            f"{where}: progress_topic {config.progress_topic!r} is among the topics rows may "
            f"name ({config.bounds()})",
            fix="give the progress topic a name outside topics and topic_pattern",
        )
    if config.create_topic and not (config.topics or config.topic_pattern is not None):
        raise ConfigError(
            f"{where}: create_topic=True with a topic per row and no bound: any row could "
            "create a topic",
            fix="name the topics rows may create: topics=['orders', 'refunds'] or "
            "topic_pattern=r'events\\..*'; or create the topics yourself and leave "
            "create_topic=False",
        )


def collision_name(topic: str) -> str:
    """Kafka refuses two topics whose names differ only by '.' against '_' (their metric
    names would collide): both have the same collision name."""
    return topic.replace(".", "_")


def _check_topics(topic: str | None, progress_topic: str | None, where: str) -> None:
    """Both names valid, the derived progress topic's too, and distinct for Kafka (without
    `topic`, _check_routing checks the progress topic)."""
    for what, name in (("topic", topic), ("progress_topic", progress_topic)):
        if name is not None and not _valid_topic(name):
            raise ConfigError(
                f"{where}: {what} {name!r} is not a valid topic name",
                fix=f"use 1-{MAX_TOPIC_LENGTH} characters of [A-Za-z0-9._-]",
            )
    if topic is None:
        return
    progress = progress_topic_of(topic, progress_topic)
    if progress_topic is None and not _valid_topic(progress):
        room = MAX_TOPIC_LENGTH - len(PROGRESS_SUFFIX)
        raise ConfigError(
            f"{where}: topic {topic!r} has {len(topic)} characters, so its progress topic "
            f"{progress!r} would have {len(progress)}, over Kafka's limit of "
            f"{MAX_TOPIC_LENGTH}",
            fix=f"use a topic name of at most {room} characters, or name the progress topic "
            "yourself: progress_topic='<a valid name of at most 249 characters>'",
        )
    if progress == topic:
        raise ConfigError(
            f"{where}: progress_topic must differ from topic",
            fix="leave progress_topic unset (default: '<topic>-ds-progress') or name another topic",
        )
    if collision_name(progress) == collision_name(topic):
        raise ConfigError(
            f"{where}: topic {topic!r} and progress_topic {progress!r} differ only by '.' "
            "against '_'; Kafka treats such names as colliding",
            fix="give progress_topic a name that differs by more than '.' and '_'",
        )


def _check_record_shape(shape: object, layout: RecordLayout, where: str) -> None:
    """A known shape, and no `*_column` option with the Spark shape (its columns are fixed)."""
    if shape is not None and shape not in RECORD_SHAPES:
        raise ConfigError(
            f"{where}: record_shape {shape!r} is not a record shape",
            fix=f"record_shape='{SPARK_SHAPE}' (columns value, key, headers, partition, topic, "
            f"timestamp, as Spark's Kafka sink), '{JSON_SHAPE}' (the *_column options), or "
            "leave it unset to choose by the batch's columns",
        )
    if shape == SPARK_SHAPE and layout.roles():
        raise ConfigError(
            f"{where}: record_shape='spark' takes its columns by Spark's names, but "
            f"{sorted(set(layout.roles().values()))} are set too",
            fix="remove the *_column options (name the columns value, key, headers, partition, "
            "topic, timestamp), or set record_shape='json' to keep them",
        )


def _check_producer_config(config: object, where: str) -> None:
    """Keys are strings, values plain scalars (what librdkafka reads); the values themselves
    are checked by librdkafka at open, before anything is created."""
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"{where}: producer_config must be a mapping of librdkafka settings, not "
            f"{type(config).__name__}",
            fix="producer_config={'linger.ms': 50, 'security.protocol': 'SASL_SSL', ...}",
        )
    for key, value in config.items():
        if not isinstance(key, str):
            raise ConfigError(
                f"{where}: producer_config has the key {key!r} ({type(key).__name__}); "
                "setting names are strings",
                fix="write librdkafka setting names as strings, e.g. 'linger.ms'",
            )
        if not isinstance(value, str | int | float | bool):
            shown = "***" if is_secret(key) else repr(value)
            raise ConfigError(
                f"{where}: producer_config[{key!r}] is {shown} ({type(value).__name__}); "
                "librdkafka settings are strings, numbers or booleans",
                fix=f"give {key!r} a str, int, float or bool (see librdkafka's CONFIGURATION.md)",
            )


def bootstrap_hosts(servers: object, protocol: str, where: str) -> list[tuple[str, int]]:
    """The (host, port) of each entry of `servers` as librdkafka reads it: comma-separated
    `[proto://]host[:port]` (port 9092 when absent; an IPv6 address in brackets; `proto`
    must match security.protocol). ConfigError naming the first bad entry: librdkafka would
    drop or misread it and the client would wait its whole request time-out instead."""
    if not isinstance(servers, str) or not servers.strip():
        raise ConfigError(
            f"{where}: `bootstrap_servers` is empty"
            if isinstance(servers, str) or servers is None
            else f"{where}: bootstrap_servers must be a string, not {type(servers).__name__}",
            fix=_BOOTSTRAP_FIX,
        )
    hosts: list[tuple[str, int]] = []
    for raw in servers.split(","):
        entry = raw.strip()
        if not entry:
            continue  # librdkafka skips empty entries ("a:9092,")
        parsed = _parse_entry(entry, protocol)
        if isinstance(parsed, str):
            raise ConfigError(
                f"{where}: bootstrap_servers entry {entry!r} is malformed: {parsed}",
                fix=_BOOTSTRAP_FIX,
            )
        hosts.append(parsed)
    if not hosts:
        raise ConfigError(f"{where}: bootstrap_servers names no broker", fix=_BOOTSTRAP_FIX)
    return hosts


def _parse_entry(entry: str, protocol: str) -> tuple[str, int] | str:
    """(host, port) of one bootstrap entry, or what is wrong with it."""
    rest = entry
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        if scheme.lower() not in SECURITY_PROTOCOLS:
            known = ", ".join(p.upper() + "://" for p in SECURITY_PROTOCOLS)
            return f"{scheme}:// is not a Kafka protocol (librdkafka accepts {known})"
        if scheme.lower() != protocol.lower():
            return (
                f"{scheme}:// does not match security.protocol={protocol} (librdkafka ignores "
                "such an entry)"
            )
    rest = rest.rstrip("/")
    if any(c.isspace() for c in rest):
        return "it holds a space (separate entries with commas)"
    if rest.startswith("["):
        host, bracket, after = rest[1:].partition("]")
        if not bracket or not _ipv6(host):
            return f"{rest!r} is not an [IPv6 address]"
        if after and not after.startswith(":"):
            return "write an IPv6 address as [address]:port"
        port_text = after[1:] if after else None
    elif rest.count(":") > 1:
        return "an IPv6 address must be in brackets: [address]:port"
    else:
        host, colon, port_text_ = rest.partition(":")
        port_text = port_text_ if colon else None
        if not _HOST.fullmatch(host):
            return f"{host!r} is not a host name or address"
    if port_text is None:
        return host, DEFAULT_PORT
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) <= 65535:
        return f"the port {port_text!r} is not a number from 1 to 65535"
    return host, int(port_text)


def _ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True
