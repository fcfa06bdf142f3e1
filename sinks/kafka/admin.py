"""What the sink asks of the cluster through its admin API: at `open`, that the broker's
transaction limit fits the sink's time-out and that the topic and progress topic exist (or are
created) with settings that keep the progress; per epoch, offsets, to wait until
read_committed readers see a committed epoch."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    TransientError,
    UnreachableError,
)
from durable_sinks.core.joblog import JobLogger

from .access import check_access
from .config import Kafka, bootstrap_hosts
from .errors import Where, client_failure, kafka_error_of
from .refusals import Refusals, explain
from .timeouts import KAFKA_MAX_S

#: Errors a just-created partition (or a moving leader, or a broker that just restarted)
#: gives until the metadata settles. `_NOENT` is list_offsets' "Failed to query partition
#: leaders: No leaders found" (not marked retriable by librdkafka): seen for a short while
#: after a broker restart, and for a partition that does not exist.
_METADATA_LAG = frozenset(
    {
        KafkaError._NOENT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.NOT_COORDINATOR,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    }
)


#: The longest one list_offsets request may wait (seconds): a request to a broker that just
#: died waits for it until its time-out, so a retry with fresh metadata, which names the new
#: leader, goes on seconds after the election instead of at the caller's whole timeout.
ATTEMPT_TIMEOUT_S = 3.0
#: How much longer than its request_timeout a list_offsets answer is awaited (librdkafka's
#: own time-out normally ends it first, with the real error).
ANSWER_GRACE_S = 0.5


def _spec(earliest: bool) -> OffsetSpec:
    """The offset spec of a partition's start or end (typed: confluent-kafka's is not)."""
    spec: OffsetSpec = (
        OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        if earliest
        else OffsetSpec.latest()  # type: ignore[no-untyped-call]
    )
    return spec


def list_offsets(
    admin: AdminClient,
    partitions: Sequence[TopicPartition],
    level: IsolationLevel,
    timeout: float,
    *,
    earliest: bool = False,
) -> dict[TopicPartition, int]:
    """End (or start) offsets of `partitions` as a reader with `level` sees them. Retries
    what the broker calls retriable (a new partition's leader not known yet) until `timeout`;
    raises KafkaException otherwise (the sink's callers translate it). Every offset returned
    is a real one (>= 0): an answer without one is asked again (`_require_offsets`)."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        spec = _spec(earliest)
        attempt = min(max(deadline - time.monotonic(), 0.1), ATTEMPT_TIMEOUT_S)
        try:
            futures = admin.list_offsets(
                {p: spec for p in partitions}, isolation_level=level, request_timeout=attempt
            )
            return _require_offsets(_awaited_offsets(futures, attempt + ANSWER_GRACE_S))
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = isinstance(error, KafkaError) and (
                error.retriable() or error.code() in _METADATA_LAG
            )
            if not retriable or time.monotonic() + delay > deadline:
                raise
        finally:
            admin.poll(0)  # serves the client's log and error callbacks
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
        _refresh_metadata(admin, partitions, deadline)


def _awaited_offsets(
    futures: Mapping[TopicPartition, Future[Any]], seconds: float
) -> dict[TopicPartition, int]:
    """The offsets `futures` answer within `seconds`. librdkafka does not always end a
    list_offsets at its request_timeout: for a topic deleted while the client still holds its
    metadata, the answer ("No leaders found") came after 60 s (seen with librdkafka 2.16). No
    answer in time is a retriable _TIMED_OUT; the request left behind ends on its own."""
    deadline = time.monotonic() + seconds
    found: dict[TopicPartition, int] = {}
    for partition, future in futures.items():
        try:
            found[partition] = future.result(max(deadline - time.monotonic(), 0.0)).offset
        except FutureTimeout:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"list_offsets answered nothing for {partition.topic}[{partition.partition}] "
                    f"in {seconds:.1f} s",
                    retriable=True,
                )
            ) from None
    return found


def _refresh_metadata(
    admin: AdminClient, partitions: Sequence[TopicPartition], deadline: float
) -> None:
    """Ask the cluster for the partitions' metadata again before a retry. The admin client
    keeps the leaders it last learnt; while they name a broker that died (a cluster's leader
    moving) or none (a topic just created), each list_offsets is sent to that broker, or
    fails with "No leaders found", until the cached metadata ages out (minutes), not when
    the cluster has elected a new leader (seconds). A failed refresh is left to the next
    attempt."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return
    for topic in sorted({p.topic for p in partitions}):
        try:
            admin.list_topics(topic, timeout=min(remaining, ATTEMPT_TIMEOUT_S))
        except KafkaException:
            return


def _require_offsets(found: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """`found`, unless a partition has no offset in it: while a partition's leader moves (a
    broker killed or restarted in a cluster), list_offsets may answer a partition with
    OFFSET_INVALID (-1001) and no error. Such an answer raises a retriable
    LEADER_NOT_AVAILABLE (asked again until the caller's timeout): taken as an offset, it
    made an epoch's progress record name the range [start, -1001), which every later start
    refused as unreadable."""
    missing = sorted(f"{p.topic}[{p.partition}]" for p, offset in found.items() if offset < 0)
    if missing:
        raise KafkaException(
            KafkaError(
                KafkaError.LEADER_NOT_AVAILABLE,
                f"list_offsets answered no offset for {', '.join(missing)}",
                retriable=True,
            )
        )
    return found


#: Seconds a committed epoch's offsets must stay missing before the sink reports them lost.
LOSS_CONFIRM_S = 10.0
#: A topic setting of this value or more means "no limit".
_UNLIMITED = 2**62


@dataclass(frozen=True)
class TimestampWindow:
    """How far a record's timestamp may lie before and after the broker's clock
    (milliseconds; None: no limit): the topic's message.timestamp.before.max.ms and
    after.max.ms (and the older difference.max.ms, both ways)."""

    before_ms: int | None
    after_ms: int | None


@dataclass(frozen=True)
class TopicFacts:
    """What `open` learned of the sink's topic."""

    partitions: int
    #: The largest record the topic and the producer accept (bytes).
    record_limit: int
    #: The timestamps the topic takes from producers; None: any (LogAppendTime, no limits).
    timestamps: TimestampWindow | None = None


def timestamp_window(described: dict[str, Any]) -> TimestampWindow | None:
    """The timestamps a topic takes from producers, from its described configuration."""

    def setting(name: str) -> int | None:
        entry = described.get(name)
        if entry is None or entry.value is None:
            return None
        value = int(entry.value)
        return None if value >= _UNLIMITED else value

    kind = described.get("message.timestamp.type")
    if kind is not None and str(kind.value) == "LogAppendTime":
        return None  # the broker stamps every record itself
    both = setting("message.timestamp.difference.max.ms")
    limits = [
        [v for v in (setting("message.timestamp.before.max.ms"), both) if v is not None],
        [v for v in (setting("message.timestamp.after.max.ms"), both) if v is not None],
    ]
    before, after = (min(found) if found else None for found in limits)
    if before is None and after is None:
        return None
    return TimestampWindow(before, after)


class Cluster:
    """The sink's admin client and the checks it runs. `where(epoch)` gives the job, sink and
    epoch every error names."""

    def __init__(
        self,
        config: Kafka,
        settings: dict[str, Any],
        where: Where,
        log: JobLogger,
        refusals: Refusals | None = None,
    ) -> None:
        self.config = config
        self._settings = settings
        self._refusals = refusals
        try:
            self.admin = AdminClient(settings)
        except KafkaException as exc:
            raise ConfigError(
                f"the Kafka client settings are invalid: {kafka_error_of(exc) or exc}",
                **where(None),
                fix="check producer_config against librdkafka's CONFIGURATION.md",
            ) from None
        self.where = where
        self._log = log
        self._timeout = config.request_timeout_s
        #: How many brokers the cluster has (known once `check` ran).
        self._brokers = 1
        #: The broker's settings as `check` read them (name -> value); empty before, or when
        #: this principal may not read them (`broker_settings_unread` says why).
        self.broker_settings: dict[str, str] = {}
        self.broker_settings_unread: str | None = "not read yet"
        #: Whether `describe_broker` ran.
        self.broker_described = False
        #: The broker's transaction.max.timeout.ms in seconds, once read.
        self.transaction_max_s: float | None = None

    # -- at open -------------------------------------------------------------------------------
    def check(self) -> TopicFacts | None:
        """Check that a bootstrap host resolves, the broker's transaction limit, then the
        sink's topic (if it has one: without, rows name theirs) and its progress topic; create
        the missing ones only once every check passed and the broker agreed to create all of
        them (validate_only), so a refusal leaves no topic behind. ConfigError naming the fix;
        TransientError when the cluster cannot be reached."""
        self._resolve_bootstrap()
        brokers = self._check_broker()
        return self._ensure_topics(brokers)

    def _resolve_bootstrap(self) -> None:
        """Fail at once (not after request_timeout_s) when no bootstrap host resolves."""
        servers = self.config.bootstrap_servers
        protocol = str(self.config.producer_config.get("security.protocol", "plaintext"))
        failures: list[str] = []
        hosts = bootstrap_hosts(servers, protocol, f"kafka sink {self.config.name!r}")
        for host, port in hosts:
            try:
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except (socket.gaierror, UnicodeError) as exc:
                failures.append(f"{host!r} ({exc.args[-1] if exc.args else exc})")
        if len(failures) == len(hosts):
            raise UnreachableError(
                "no host of bootstrap_servers resolves: " + ", ".join(failures),
                **self.where(None),
                fix="check the host names in bootstrap_servers and this machine's DNS",
            )
        if failures:
            self._log.warning("bootstrap host(s) do not resolve: %s", ", ".join(failures))

    def _unreachable(self, exc: KafkaException) -> DurableSinkError:
        """A failed admin call at open: UnreachableError (ConfigError for refused
        credentials or ACLs)."""
        self.admin.poll(0)
        return client_failure(
            exc,
            f"cannot reach the Kafka cluster at {self.config.bootstrap_servers}",
            self.where(None),
            fix="check that the brokers run and bootstrap_servers and the security "
            "settings are right",
            unknown=UnreachableError,
        )

    def offsets(
        self,
        partitions: Sequence[TopicPartition],
        level: IsolationLevel,
        epoch: int | None = None,
        *,
        earliest: bool = False,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int]:
        """list_offsets, typed: TransientError (UnreachableError when the cluster cannot be
        reached) once `timeout` (request_timeout_s) has passed."""
        timeout = self._timeout if timeout is None else timeout
        try:
            return list_offsets(self.admin, partitions, level, timeout, earliest=earliest)
        except KafkaException as exc:
            names = ", ".join(sorted({p.topic for p in partitions}))
            what = f"cannot read the offsets of {names}"
            raise client_failure(exc, what, self.where(epoch)) from None

    def _check_broker(self) -> int:
        """A given transaction_timeout_s must not exceed the broker's
        transaction.max.timeout.ms, which is also the ceiling of the derived one. Returns how
        many brokers the cluster has."""
        brokers = self.describe_broker()
        limit_s, given = self.transaction_max_s, self.config.transaction_timeout_s
        if given is not None and limit_s is not None and given > limit_s:
            limit = round(limit_s * 1000)
            raise ConfigError(
                f"transaction_timeout_s {given:g} exceeds the broker's "
                f"transaction.max.timeout.ms ({limit} ms)",
                **self.where(None),
                fix=f"set transaction_timeout_s <= {limit_s:g}, leave it unset (the sink "
                "then derives it, at most the broker's limit), or raise "
                "transaction.max.timeout.ms in the brokers' server.properties",
            )
        return brokers

    def describe_broker(self) -> int:
        """Read a broker's settings (`broker_settings`, `transaction_max_s`; without
        DESCRIBE_CONFIGS on the cluster `broker_settings_unread` says so). Returns how many
        brokers the cluster has."""
        try:
            cluster = self._awaited(self.admin.describe_cluster(request_timeout=self._timeout))
        except KafkaException as exc:
            raise self._unreachable(exc) from None
        broker = ConfigResource(ConfigResource.Type.BROKER, str(cluster.nodes[0].id))
        self.broker_described = True
        try:
            configs = self.admin.describe_configs([broker], request_timeout=self._timeout)
            entries = self._awaited(configs[broker])
        except KafkaException as exc:
            error = kafka_error_of(exc)
            if error is None or error.code() != KafkaError.CLUSTER_AUTHORIZATION_FAILED:
                raise self._unreachable(exc) from None
            # Not allowed to read the broker's settings (DESCRIBE_CONFIGS on the cluster is
            # not among the least privileges): init_transactions refuses a time-out above
            # the broker's limit with its own clear error.
            self.broker_settings_unread = "no DESCRIBE_CONFIGS on the cluster"
            self._log.info(
                "cannot read the broker's transaction.max.timeout.ms (no DESCRIBE_CONFIGS on "
                "the cluster): init_transactions checks the transaction timeout instead, and "
                "a derived one is at most Kafka's default limit, %g s",
                KAFKA_MAX_S,
            )
            return len(cluster.nodes)
        self.broker_settings = {k: str(v.value) for k, v in entries.items() if v.value is not None}
        self.broker_settings_unread = None
        entry = entries.get("transaction.max.timeout.ms")
        self.transaction_max_s = (
            int(entry.value) / 1000 if entry is not None and entry.value else KAFKA_MAX_S
        )
        return len(cluster.nodes)

    def transaction_ceiling_s(self) -> float:
        """The longest transaction timeout the sink may derive: the broker's
        transaction.max.timeout.ms (Kafka's default when it cannot be read), or the lower
        max_transaction_timeout_s."""
        broker = self.transaction_max_s if self.transaction_max_s is not None else KAFKA_MAX_S
        cap = self.config.max_transaction_timeout_s
        return broker if cap is None else min(cap, broker)

    def _awaited(self, future: Future[Any]) -> Any:
        """The admin request's result; while it waits, a refused login or certificate that
        the client reported (refusals.py) ends the wait at once with a ConfigError instead
        of a time-out that reads like an outage."""
        deadline = time.monotonic() + self._timeout + 5
        while not future.done() and time.monotonic() < deadline:
            wait([future], timeout=0.1)
            self.admin.poll(0)
            refused = self._refusals.first() if self._refusals is not None else None
            if refused is not None:
                future.cancel()
                found = explain(refused, self._settings, self.config.bootstrap_servers)
                raise ConfigError(found.message, **self.where(None), fix=found.fix)
        return future.result(timeout=0)

    def _metadata(self) -> Any:
        """The cluster's topic metadata; UnreachableError when the cluster does not answer."""
        try:
            return self.admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise self._unreachable(exc) from None
        finally:
            self.admin.poll(0)

    def _ensure_topics(self, brokers: int) -> TopicFacts | None:
        topic, progress = self.config.topic, self.config.progress_topic_name
        self._brokers = brokers
        metadata = self._metadata()
        wanted: list[NewTopic] = []
        if topic is not None and topic not in metadata.topics:
            if not self.config.create_topic:
                raise ConfigError(
                    f"topic {topic!r} does not exist, or this principal may not see it",
                    **self.where(None),
                    fix="create it, or set create_topic=True (with topic_partitions=); on a "
                    "cluster with ACLs, grant this principal DESCRIBE on it (docs/security.md)",
                )
            wanted.append(
                NewTopic(topic, self.config.topic_partitions, self.config.replication_factor)
            )
        if progress in metadata.topics:
            self._check_progress_topic(progress, len(metadata.topics[progress].partitions))
        else:
            wanted.append(
                NewTopic(
                    progress,
                    1,
                    self.config.replication_factor,
                    config={"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"},
                )
            )
        if wanted:
            self._create(wanted, brokers)
            metadata = self._wait_for_topics([t.topic for t in wanted])
        allowed: dict[str, tuple[str, ...]] = {progress: ("READ", "WRITE")}
        if topic is not None:
            allowed[topic] = ("WRITE",)
        check_access(self.admin, allowed, topic or "", self._timeout, self.where(None))
        return None if topic is None else self._facts(topic, metadata)

    def _facts(self, topic: str, metadata: Any) -> TopicFacts:
        described = self._describe(topic)
        return TopicFacts(
            len(metadata.topics[topic].partitions),
            self._record_limit(described),
            timestamp_window(described),
        )

    def routed_topic(self, topic: str, epoch: int) -> TopicFacts | None:
        """What a topic a row names is like, checked as `check` checks the sink's topic
        (created first when missing and `create_topic`; the caller checked that rows may
        name it); None when it does not exist (or this principal may not see it) and is not
        to be created. ConfigError when this principal may not write it."""
        metadata = self._metadata()
        if topic not in metadata.topics:
            if not self.config.create_topic:
                return None
            new = NewTopic(topic, self.config.topic_partitions, self.config.replication_factor)
            self._create([new], self._brokers)
            metadata = self._wait_for_topics([topic])
            if topic not in metadata.topics:
                raise TransientError(
                    f"topic {topic!r} was created but the cluster does not show it yet",
                    **self.where(epoch),
                    fix="nothing to do: the job writes the epoch again",
                )
        check_access(self.admin, {topic: ("WRITE",)}, topic, self._timeout, self.where(epoch))
        return self._facts(topic, metadata)

    def _create(self, wanted: list[NewTopic], brokers: int) -> None:
        """Create `wanted` all or none: the broker first validates every one (validate_only
        creates nothing); should the real creation still fail for one, the others created
        by this call are deleted again."""
        for validate_only in (True, False):
            try:
                futures = self.admin.create_topics(
                    wanted, validate_only=validate_only, request_timeout=self._timeout
                )
            except KafkaException as exc:
                raise self._unreachable(exc) from None
            created: list[str] = []
            refusal: DurableSinkError | None = None
            for name, future in futures.items():
                try:
                    future.result()
                except KafkaException as exc:
                    error = kafka_error_of(exc)
                    if error is not None and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                        continue  # created meanwhile by someone else: checked like any other
                    refusal = refusal or self._refusal(name, exc, brokers)
                else:
                    created.append(name)
            if refusal is not None:
                if not validate_only:
                    self._delete_quietly(created)
                raise refusal
        for name in created:
            self._log.info("created topic %s", name)

    def _refusal(self, name: str, exc: KafkaException, brokers: int) -> DurableSinkError:
        """What the broker's refusal to create topic `name` means, and its fix."""
        error = kafka_error_of(exc)
        role = "progress topic" if name == self.config.progress_topic_name else "topic"
        message = f"the broker refuses to create {role} {name!r} (nothing was created): " + (
            error.str() if error is not None else str(exc)
        )
        code = error.code() if error is not None else -1
        fixes = {
            KafkaError.INVALID_REPLICATION_FACTOR: f"set replication_factor to at most "
            f"{brokers} (the brokers this cluster has), or -1 for the brokers' default",
            KafkaError.INVALID_PARTITIONS: "set topic_partitions to a count the brokers accept",
            KafkaError.TOPIC_EXCEPTION: "choose another topic name: Kafka counts '.' and '_' "
            "as the same character, so a name may collide with an existing topic"
            + ("" if role == "topic" else " (progress_topic=...)"),
            KafkaError.POLICY_VIOLATION: "the brokers' create.topic.policy refuses it: create "
            "the topic yourself with settings the policy allows",
            KafkaError.INVALID_CONFIG: "create the topic yourself",
        }
        if error is not None and (error.retriable() or code in _METADATA_LAG):
            return TransientError(message, **self.where(None), fix="retry when the cluster is up")
        return ConfigError(
            message,
            **self.where(None),
            fix=fixes.get(
                code,
                "create it yourself, or grant this principal CREATE on it; if it exists, "
                "grant this principal DESCRIBE on it (a topic it may not describe looks "
                "missing; docs/security.md lists every ACL)",
            ),
        )

    def _delete_quietly(self, names: list[str]) -> None:
        if not names:
            return
        try:
            futures = self.admin.delete_topics(names, request_timeout=self._timeout)
        except KafkaException as exc:
            self._log.warning("could not delete topics %s created before a refusal: %s", names, exc)
            return
        for name, future in futures.items():
            try:
                future.result()
            except KafkaException as exc:
                self._log.warning(
                    "could not delete topic %s created before a refusal: %s", name, exc
                )

    def _wait_for_topics(self, names: list[str]) -> Any:
        deadline = time.monotonic() + self._timeout
        while True:
            metadata = self._metadata()
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

    def _describe(self, topic: str) -> dict[str, Any]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        try:
            futures = self.admin.describe_configs([resource], request_timeout=self._timeout)
            entries: dict[str, Any] = futures[resource].result()
        except KafkaException as exc:
            raise self._unreachable(exc) from None
        return entries

    def _check_progress_topic(self, progress: str, partitions: int) -> None:
        """Refuse an existing progress topic that could lose the last committed epoch."""
        if partitions != 1:
            raise ConfigError(
                f"progress topic {progress!r} has {partitions} partitions; it needs 1",
                **self.where(None),
                fix="give the sink another progress_topic (it is created with 1 partition)",
            )
        entries = self._describe(progress)
        cleanup = entries["cleanup.policy"].value or ""
        retention = int(entries["retention.ms"].value or -1)
        size = int(entries["retention.bytes"].value or -1)
        policies = {p.strip() for p in cleanup.split(",") if p.strip()}
        # "delete" removes old segments by age or size, whatever else the policy says: a job
        # idle longer than retention.ms would lose its last progress, fence and generation.
        if "delete" in policies and (retention >= 0 or size >= 0):
            raise ConfigError(
                f"progress topic {progress!r} has cleanup.policy={cleanup} with retention.ms="
                f"{retention} and retention.bytes={size}: its records of the last committed "
                "epoch, the fence and the generation could be deleted",
                **self.where(None),
                fix="set cleanup.policy=compact on it (kafka-configs --alter --add-config "
                "cleanup.policy=compact), or leave progress_topic unset so that the sink "
                "creates a compacted one",
            )

    def _record_limit(self, described: dict[str, Any]) -> int:
        """The largest record the topic and the producer accept: the topic's
        max.message.bytes, the producer's message.max.bytes."""
        limits = [int(described["max.message.bytes"].value)]
        limits.append(int(self.config.producer_config.get("message.max.bytes", 1_000_000)))
        return min(limits)

    def health_check(self) -> None:
        try:
            self.admin.list_topics(self.config.progress_topic_name, timeout=self._timeout)
        except KafkaException as exc:
            raise client_failure(
                exc,
                "the Kafka cluster does not answer",
                self.where(None),
                fix="check that the brokers run",
                unknown=UnreachableError,
            ) from None
        finally:
            self.admin.poll(0)

    def lost_ranges(
        self, ranges: Mapping[str, Mapping[int, tuple[int, int]]], epoch: int
    ) -> list[str]:
        """What of an epoch's offset ranges the cluster no longer holds, each said: a topic
        or partition gone, or a partition whose high watermark is below the range's end (the
        topic deleted and made again, or an unclean leader election truncated it). Records
        deleted by retention leave the high watermark where it was: not a loss. A new leader
        may answer a high watermark that lags its log for a moment (it advances it as the
        followers fetch), so a shortfall is read again for LOSS_CONFIRM_S before it counts."""
        deadline = time.monotonic() + min(self._timeout, LOSS_CONFIRM_S)
        while True:
            lost = self._lost_ranges(ranges, epoch)
            if not lost or time.monotonic() >= deadline:
                return lost
            time.sleep(0.5)

    def _lost_ranges(
        self, ranges: Mapping[str, Mapping[int, tuple[int, int]]], epoch: int
    ) -> list[str]:
        wanted = {t: spans for t, spans in ranges.items() if any(e > s for s, e in spans.values())}
        if not wanted:
            return []
        metadata = self._metadata()
        lost: list[str] = []
        parts: list[TopicPartition] = []
        for topic, spans in sorted(wanted.items()):
            found = metadata.topics.get(topic)
            if found is None or found.error is not None:
                lost.append(f"topic {topic!r} does not exist")
                continue
            for partition, (start, end) in sorted(spans.items()):
                if end <= start:
                    continue
                if partition not in found.partitions:
                    lost.append(f"{topic}[{partition}] does not exist")
                else:
                    parts.append(TopicPartition(topic, partition))
        if parts:
            high = self.offsets(parts, IsolationLevel.READ_UNCOMMITTED, epoch)
            for part in parts:
                end = wanted[part.topic][part.partition][1]
                if high[part] < end:
                    lost.append(
                        f"{part.topic}[{part.partition}] ends at offset {high[part]}, below the "
                        f"epoch's range end {end}"
                    )
        return lost

    # -- per epoch -----------------------------------------------------------------------------
    def high_watermarks(
        self, topic: Sequence[TopicPartition], epoch: int | None = None
    ) -> dict[TopicPartition, int]:
        """High watermarks (read_uncommitted) of the partitions `topic`: after pre_commit's
        flush they are past the epoch's records. The progress record needs no wait: its
        readers (recovery) read up to the high watermark with read_committed, which waits
        for the commit markers by itself."""
        return self.offsets(topic, IsolationLevel.READ_UNCOMMITTED, epoch)

    def high_watermarks_soon(
        self, topic: Sequence[TopicPartition], epoch: int | None = None
    ) -> Callable[[], dict[TopicPartition, int]]:
        """`high_watermarks`, asked now and awaited when the returned function is first
        called: each offset is the high watermark at some moment before that call (a failed
        request is asked again then, with fresh metadata; the call waits request_timeout_s at
        most in all). An epoch's records produced after the call lie at or above them. The
        early request waits ATTEMPT_TIMEOUT_S at most, like every list_offsets attempt: sent
        to a partition leader that just died (killed between two epochs), it would otherwise
        hold the epoch's pre-commit for the whole request_timeout_s."""
        spec = _spec(False)
        attempt_s = min(self._timeout, ATTEMPT_TIMEOUT_S)
        try:
            futures: dict[TopicPartition, Future[Any]] | None = self.admin.list_offsets(
                {p: spec for p in topic},
                isolation_level=IsolationLevel.READ_UNCOMMITTED,
                request_timeout=attempt_s,
            )
        except KafkaException:
            futures = None
        answer: list[dict[TopicPartition, int]] = []

        def result() -> dict[TopicPartition, int]:
            if answer:
                return answer[0]
            deadline = time.monotonic() + self._timeout  # what this call may wait, in all
            found = None
            if futures is not None:
                try:
                    found = _require_offsets(
                        {p: f.result(attempt_s).offset for p, f in futures.items()}
                    )
                except Exception:  # noqa: BLE001 - asked again below, and typed there
                    found = None
            if found is None:
                _refresh_metadata(self.admin, topic, deadline)
                left = max(deadline - time.monotonic(), 0.1)
                found = self.offsets(topic, IsolationLevel.READ_UNCOMMITTED, epoch, timeout=left)
            answer.append(found)
            return found

        return result

    def await_visible(self, written: dict[TopicPartition, int], epoch: int) -> None:
        """Wait until read_committed readers can see the epoch (the commit markers landed on
        every partition): the last stable offsets reach the high watermarks taken before the
        commit. Bounded: another writer's open transaction can hold them back."""
        deadline = time.monotonic() + self.config.visibility_timeout_s
        pending = dict(written)
        delay = 0.001
        while pending:
            try:
                stable = list_offsets(
                    self.admin, list(pending), IsolationLevel.READ_COMMITTED, self._timeout
                )
            except KafkaException:
                stable = {}
            pending = {p: o for p, o in pending.items() if stable.get(p, -1) < o}
            if not pending:
                return
            if time.monotonic() > deadline:
                self._log.bind(epoch=epoch).warning(
                    "committed, but read_committed readers do not see it yet after %.1f s "
                    "(another transaction holds %s)",
                    self.config.visibility_timeout_s,
                    ", ".join(f"{p.topic}[{p.partition}]" for p in pending),
                )
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
