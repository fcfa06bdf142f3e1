"""The sink's transactional producer and what its errors mean.

One stable `transactional.id` per (job, sink). `start` makes a new librdkafka producer and
calls `init_transactions`, which completes or aborts whatever an older producer of the same id
left open and bumps the producer epoch: the older producer's next call fails fatally.

Errors, as the coordinator sees them (every librdkafka failure of every call is one of
these; nothing raw leaves):
- retriable (librdkafka says so): init, begin, commit and abort are called again in place
  (librdkafka resumes a timed-out init_transactions, commit_transaction or abort_transaction)
  until request_timeout_s has passed, then TransientError (UnreachableError when the brokers
  could not be reached); a commit still failing so is InDoubtError instead;
- the transaction needs an abort (`txn_requires_abort`: a record could not be delivered):
  aborted, TransientError; nothing of it is visible and the epoch is simply written again;
- fenced: a newer producer took over the id: FencedError, remembered, so every later call
  fails the same way;
- the broker timed the transaction out (open longer than transaction.timeout.ms): the broker
  aborts it and bumps the producer epoch, and librdkafka reports exactly what it reports for
  a fence (fatal `_FENCED`, the broker having answered INVALID_PRODUCER_EPOCH). It is told
  apart by time (a timeout needs the transaction's first record to be older than
  transaction.timeout.ms) and by the fence record (no newer generation holds it):
  TransientError saying so, and the producer is `broken`; with a derived timeout the next
  attempt's producer takes the ceiling (timeouts.py), and when the timeout already was the
  ceiling, ConfigError instead (no attempt can commit such a batch);
- another fatal error: TransientError (InDoubtError from commit), and the producer is
  `broken` until `start` replaces it (the sink does so at the next epoch);
- a commit whose outcome is unknown: InDoubtError (the progress topic tells, later);
- credentials or ACLs refused, a setting the broker refuses: ConfigError.

Records sent in bulk (bulk.py) are enqueued on the producer's sender thread while the caller
goes on (encoding the next record batch): librdkafka's batch call runs without the
interpreter lock. `send` returns once the records are handed over; every later call (the next
`send`, `flush`, `commit`, the progress records) first waits for them and raises what their
enqueueing raised; `abort` and `close` wait for them and drop that error. So a record batch's
failure is raised before the epoch's decision, by the next call on the producer.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    InDoubtError,
    SchemaMismatchError,
    TransientError,
    UnreachableError,
    UsageError,
)
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle
from durable_sinks.core.secrets import resolve_settings
from durable_sinks.core.sink_base import OpenParticipant

from .bulk import BulkProducer, bulk_capable
from .clientlog import ClientLog
from .config import CONNECTION_DEFAULTS, THROUGHPUT_DEFAULTS, Kafka
from .errors import (
    AUTH_CODES,
    FENCED_CODES,
    UNREACHABLE_CODES,
    Where,
    auth_fix,
    describe,
    kafka_error_of,
    refused_settings,
)
from .records import EPOCH_HEADER, Records
from .timeouts import FLOOR_S, TransactionTimeout

#: How long a full producer queue is served before the records are offered again.
QUEUE_FULL_WAIT_S = 0.05
#: Backoff between two tries of a retriable call: doubles from the first to the last.
RETRY_BACKOFF_S = (0.05, 1.0)
#: Retriable in librdkafka's eyes, but another API call is in progress: trying the same call
#: again cannot help.
_NOT_IN_PLACE = frozenset({KafkaError._CONFLICT})
#: Time-out fix: what to do when the broker times transactions out.
TIMEOUT_FIX = (
    "raise transaction_timeout_s above the longest time from an epoch's first record to its "
    "commit (up to the broker's transaction.max.timeout.ms), or leave it unset so that the "
    "sink derives it from the epochs' times, or make batches smaller (maxOffsetsPerTrigger, "
    "maxFilesPerTrigger); the job writes the epoch again"
)
#: The fix when even the longest transaction timeout was too short for a batch.
CEILING_FIX = (
    "make batches take less time from their first record to their commit "
    "(maxOffsetsPerTrigger, maxFilesPerTrigger, a shorter trigger interval), or raise "
    "transaction.max.timeout.ms in the brokers' server.properties (and "
    "max_transaction_timeout_s, if set)"
)
#: librdkafka's own socket.timeout.ms default (ms). With a transactional.id and no
#: socket.timeout.ms given, librdkafka raises it to the transaction timeout (less 100 ms), so
#: a request sent to a dead broker would wait up to the transaction timeout (15 minutes with
#: the broker's default limit): the sink gives it explicitly, at most the transaction timeout
#: (librdkafka refuses a socket.timeout.ms above transaction.timeout.ms + 100).
SOCKET_TIMEOUT_MS = 60_000

#: An epoch's EndTxn fenced: what settles it.
FENCED_AT_COMMIT_FIX = (
    "nothing to do: the job's next coordinator (a retry, a restart, or the newer driver) reads "
    "the outcome from the progress topic and finishes or rolls back the epoch everywhere"
)

Header = tuple[str, str | bytes | None]


class TransactionalProducer:
    """See the module docstring. Called from one thread at a time, like the sink; its own
    sender thread enqueues bulk sends."""

    def __init__(
        self,
        config: Kafka,
        transactional_id: str,
        where: Where,
        log: JobLogger,
        clientlog: ClientLog | None = None,
        newer_owner: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        self.transactional_id = transactional_id
        self.where = where
        self._log = log
        self._clientlog = clientlog or ClientLog(log.job, log.sink or "-")
        #: Whether a newer generation holds the sink's fence record (read when a fence must
        #: be told apart from a transaction time-out); None: never.
        self._newer_owner = newer_owner
        self._timeout = config.request_timeout_s
        #: The transaction timeout (seconds) the next `start` gives its producer: the given
        #: transaction_timeout_s, or what `timeouts` derives (the sink sets it before each
        #: start; Kafka's default until then).
        self.transaction_timeout_s = config.transaction_timeout_s or FLOOR_S
        #: The timeout the running producer started with.
        self.started_timeout_s = self.transaction_timeout_s
        #: What chooses the timeout (the sink's; None: the timeout never changes).
        self.timeouts: TransactionTimeout | None = None
        #: What `timeouts` chose after this producer's transaction timed out, once known.
        self._timed_out_to: tuple[float | None] | None = None
        self._producer: Producer | None = None
        self._bulk: BulkProducer | None = None
        #: The sender thread (made at the first bulk send) and the send it is running.
        self._sender: ThreadPoolExecutor | None = None
        self._sending: Future[None] | None = None
        #: When the open transaction's first record was produced (monotonic), if it has one:
        #: the broker's transaction timer cannot have started before.
        self._first_record: float | None = None
        #: The largest record batch the topic takes (its max.message.bytes, known once the
        #: sink checked the topic): `batch.size` is kept at or below it, else librdkafka packs
        #: small records into batches the broker refuses whole (MSG_SIZE_TOO_LARGE).
        self.batch_limit: int | None = None
        #: Set once a newer producer took over the id: every later call raises it.
        self.fenced: FencedError | None = None
        #: A fatal, non-fencing error happened: the next epoch starts a new producer.
        self.broken = False
        #: Transactions this object aborted (all its producers).
        self.aborts = 0
        self._delivery_errors: list[KafkaError] = []

    # -- life ----------------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """Every librdkafka setting of the producer (may hold secrets)."""
        timeout_ms = round(self.transaction_timeout_s * 1000)
        settings: dict[str, Any] = {
            "socket.timeout.ms": min(SOCKET_TIMEOUT_MS, timeout_ms),
            **THROUGHPUT_DEFAULTS,
            **CONNECTION_DEFAULTS,
            **resolve_settings(
                self.config.producer_config, f"kafka sink {self.config.name!r}: producer_config"
            ),
            "bootstrap.servers": self.config.bootstrap_servers,
            "transactional.id": self.transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": timeout_ms,
            # Only failures are reported: no Python call per delivered record.
            "delivery.report.only.error": True,
            "on_delivery": self._on_delivery_error,
            **self._clientlog.settings(),
        }
        if self.batch_limit is not None:
            settings["batch.size"] = min(int(settings["batch.size"]), self.batch_limit)
        return settings

    def check_settings(self) -> None:
        """ConfigError naming the producer_config entry librdkafka refuses, before anything
        is created. librdkafka checks every setting when a client is made; made without
        bootstrap.servers, the client contacts nobody."""
        offline = {k: v for k, v in self.settings().items() if k != "bootstrap.servers"}
        try:
            Producer(offline)
        except KafkaException as exc:
            raise self._invalid(exc) from None

    def _invalid(self, exc: KafkaException) -> ConfigError:
        return refused_settings(
            exc, self.config.producer_config, self._clientlog.settings(), self.where(None)
        )

    def start(self) -> None:
        """A new producer that owns the transactional.id (whatever the old one left open is
        aborted or completed by its init_transactions)."""
        self.close()
        try:
            producer = Producer(self.settings())
        except KafkaException as exc:
            raise self._invalid(exc) from None
        self._producer = producer
        self._bulk = BulkProducer.of(producer) if self.config.produce_in_bulk else None
        self.fenced, self.broken = None, False
        self._first_record = None
        self.started_timeout_s = self.transaction_timeout_s
        self._timed_out_to = None
        self.call("init_transactions", producer.init_transactions)

    def close(self) -> None:
        """Release the producer. An open transaction is left to the broker (it aborts it at
        transaction.timeout.ms, or the next producer's init aborts it at once)."""
        self._settle(quietly=True)
        producer, self._producer = self._producer, None
        self._bulk = None
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.shutdown()
        if producer is None:
            return
        with warnings.catch_warnings(record=True) as caught, contextlib.suppress(Exception):
            warnings.simplefilter("always")
            producer.close()  # aborts an open transaction; fails harmlessly when fenced
        for warning in caught:
            self._log.debug("closing the producer: %s", warning.message)
        self._clientlog.flush()

    def refuse(self, error: FencedError) -> NoReturn:
        """Remember that a newer generation owns the sink (found in the fence record) and
        raise it."""
        self.fenced = error
        raise error

    def require(self, epoch: int | None = None) -> Producer:
        """The producer, once the send in flight (if any) is enqueued; raises what that send
        raised, the fence once known, UsageError before `start`."""
        self._settle()
        if self.fenced is not None:
            raise self.fenced
        if self._producer is None:
            raise UsageError(
                f"the producer of {self.transactional_id!r} is not started (the sink is not open)",
                **self.where(epoch),
            )
        return self._producer

    def _on_delivery_error(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            self._delivery_errors.append(error)

    # -- errors --------------------------------------------------------------------------------
    def timed_out(self) -> bool:
        """Whether the broker may have timed the open transaction out: its first record is
        older than transaction.timeout.ms (the broker's timer starts later still)."""
        first = self._first_record
        return first is not None and time.monotonic() - first >= self.started_timeout_s

    def open_s(self) -> float:
        """Seconds since the open transaction's first record (0 without one)."""
        first = self._first_record
        return 0.0 if first is None else time.monotonic() - first

    def _fence_or_timeout(self, error: KafkaError, what: str, epoch: int | None) -> NoReturn:
        """A `_FENCED` error: the transaction timed out, or a newer producer took over."""
        if self.timed_out() and not self._newer_owner_now():
            self._aborted_by_broker(what, epoch, f"{error.name()}: {error.str()}")
        self._stop_fenced(
            f"{what}: a newer producer with transactional.id {self.transactional_id!r} "
            f"took over ({error.name()})",
            epoch,
        )

    def _aborted_by_broker(self, what: str, epoch: int | None, cause: str) -> NoReturn:
        """The broker timed the open transaction out (and bumped the producer epoch). With a
        derived timeout the next attempt's producer takes the ceiling; when the timeout
        already was the ceiling, no attempt can commit the batch: ConfigError."""
        self.broken = True
        age = self.open_s()
        timeout = self.started_timeout_s
        following = self._after_timeout(age)
        message = (
            f"{what}: the broker aborted the transaction because it was open longer than "
            f"transaction.timeout.ms ({timeout:g} s; its first record is {age:.1f} s old) "
            f"and bumped the producer epoch (librdkafka: {cause}); nothing of the epoch is "
            "visible"
        )
        if following is not None:
            raise TransientError(
                f"{message}; the next attempt uses a transaction timeout of {following:g} s, "
                "the longest the sink may choose",
                **self.where(epoch),
                fix="nothing to do: the job writes the epoch again",
            ) from None
        if self.timeouts is not None and self.timeouts.explicit_s is None:
            raise ConfigError(
                f"{message}; {timeout:g} s is already the longest transaction timeout the "
                f"sink may choose (the broker's transaction.max.timeout.ms, or "
                "max_transaction_timeout_s), so no attempt can commit a batch this long",
                **self.where(epoch),
                fix=CEILING_FIX,
            ) from None
        raise TransientError(message, **self.where(epoch), fix=TIMEOUT_FIX) from None

    def _after_timeout(self, age: float) -> float | None:
        """The next attempt's transaction timeout after the broker timed this producer's
        transaction out (asked of `timeouts` once per producer), or None."""
        if self._timed_out_to is None:
            chosen = self.timeouts.timed_out(age) if self.timeouts is not None else None
            self._timed_out_to = (chosen,)
        return self._timed_out_to[0]

    def _stop_fenced(self, what: str, epoch: int | None) -> NoReturn:
        """Remember and raise that a newer generation owns the sink (`what` says how)."""
        self.fenced = FencedError(
            f"{what}; this coordinator must stop",
            **self.where(epoch),
            fix="nothing to do here: the newer coordinator owns the job",
        )
        raise self.fenced from None

    def _fenced_at_commit(self, error: KafkaError, epoch: int) -> NoReturn:
        """A fence met by an epoch's EndTxn is no answer to that commit: an EndTxn that
        reached the transaction coordinator commits the transaction even when its answer
        is lost (librdkafka retries the request by itself), and a newer producer's
        init_transactions, or the broker's time-out of a later transaction state, then fences
        the retry. The transaction is committed or aborted, and only the progress topic tells
        which: InDoubtError, and this producer is done."""
        self.broken = True
        cause = (
            "the broker may have timed the transaction out (its first record is "
            f"{self.open_s():.1f} s old, transaction.timeout.ms {self.started_timeout_s:g} s)"
            if self.timed_out()
            else "a newer producer of the job took over"
        )
        if self.timed_out():
            self._after_timeout(self.open_s())  # if it was not committed, take longer
        raise InDoubtError(
            f"commit_transaction was fenced ({error.name()}): {cause}, after this commit "
            "request may have reached the transaction coordinator; the epoch may or may not "
            "be committed, and this coordinator touches nothing more of it",
            **self.where(epoch),
            fix=FENCED_AT_COMMIT_FIX + (f"; then {TIMEOUT_FIX}" if self.timed_out() else ""),
        ) from None

    def _newer_owner_now(self) -> bool:
        """Whether a newer generation holds the fence record; when it cannot be read, no
        (a time-out is retried, and a retry's `open` checks the fence record again)."""
        if self._newer_owner is None:
            return False
        try:
            return self._newer_owner()
        except DurableSinkError as exc:
            self._log.warning("cannot read the fence record (%s): taking a time-out", exc)
            return False

    def fail(self, exc: BaseException, what: str, epoch: int | None = None) -> NoReturn:
        """Raise `exc` translated (the module docstring says how)."""
        if isinstance(exc, DurableSinkError):
            raise exc
        error = kafka_error_of(exc)
        if error is None and isinstance(exc, SystemError):
            if self.fenced is not None:
                raise self.fenced from None
            # A call that failed inside a callback may leave no exception behind; the
            # delivery reports say why (a fenced producer's records fail with an old epoch).
            error = next((e for e in self._delivery_errors if e.code() in FENCED_CODES), None)
            if error is None and self._newer_owner_now():
                # No report either (a producer fenced while adding a partition to the
                # transaction): the fence record, read back, says a newer generation owns it.
                self._stop_fenced(
                    f"{what}: a newer generation of the job took over (its fence record)", epoch
                )
            if error is None and self.timed_out():
                # ... or, with no newer owner, the broker's time-out bumped the epoch.
                self._aborted_by_broker(what, epoch, f"{type(exc).__name__}: {exc}")
        if error is None:
            raise TransientError(
                f"{what} failed: {type(exc).__name__}: {exc}", **self.where(epoch)
            ) from exc
        code = error.code()
        if code in FENCED_CODES:
            self._fence_or_timeout(error, what, epoch)
        if code in AUTH_CODES:
            raise ConfigError(
                f"{what} failed: {describe(error, exc)}",
                **self.where(epoch),
                fix=auth_fix(error, self.where(epoch)),
            ) from None
        if code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            raise ConfigError(
                f"{what} failed: the broker refuses a transaction timeout of "
                f"{self.started_timeout_s:g} s ({error.str()})",
                **self.where(epoch),
                fix="set transaction_timeout_s (or max_transaction_timeout_s) <= the broker's "
                "transaction.max.timeout.ms; the sink reads that limit when this principal "
                "may describe the cluster's configuration (DESCRIBE_CONFIGS on the cluster)",
            ) from None
        if error.fatal():
            self.broken = True
            raise TransientError(
                f"{what}: the producer hit a fatal error ({error.name()}: {error.str()}); "
                "the next attempt starts a new producer",
                **self.where(epoch),
            ) from None
        if code in UNREACHABLE_CODES:
            raise UnreachableError(
                f"{what} failed: {error.name()}: {error.str()}",
                **self.where(epoch),
                fix="check that the brokers run and that bootstrap_servers is right; the job "
                "retries while the outage lasts",
            ) from None
        raise TransientError(
            f"{what} failed: {error.name()}: {error.str()}", **self.where(epoch)
        ) from None

    def _retriable(self, exc: BaseException) -> KafkaError | None:
        """The error behind `exc` when the same call may be made again in place."""
        error = kafka_error_of(exc)
        if error is None or error.fatal() or error.txn_requires_abort():
            return None
        if not error.retriable() or error.code() in _NOT_IN_PLACE:
            return None
        return error

    def call(self, what: str, call: Callable[[float], Any], epoch: int | None = None) -> Any:
        """Run a transactional call (given the seconds it may take), calling it again while
        librdkafka marks its failure retriable, until request_timeout_s has passed."""
        deadline = time.monotonic() + self._timeout
        delay = RETRY_BACKOFF_S[0]
        while True:
            try:
                return call(max(deadline - time.monotonic(), 0.1))
            except Exception as exc:  # noqa: BLE001 - translated, never swallowed
                error = self._retriable(exc)
                if error is None or time.monotonic() + delay >= deadline:
                    self.fail(exc, what, epoch)
                self._log.bind(epoch=epoch).info("%s: retriable %s, retrying", what, error.name())
            time.sleep(delay)
            delay = min(delay * 2, RETRY_BACKOFF_S[1])

    # -- transactions --------------------------------------------------------------------------
    def begin(self, epoch: int | None = None) -> None:
        producer = self.require(epoch)
        self._delivery_errors.clear()
        self._first_record = None
        self.call("begin_transaction", lambda _: producer.begin_transaction(), epoch)

    def send_one(
        self, what: str, topic: str, value: bytes, key: bytes, epoch: int | None = None
    ) -> None:
        """Produce one record to partition 0 of `topic` in the open transaction."""
        producer = self.require(epoch)
        self._started()
        try:
            producer.produce(topic, value, key, partition=0)
        except Exception as exc:  # noqa: BLE001 - translated
            self.fail(exc, what, epoch)

    def send(self, records: Records, epoch: int, topic: str) -> None:
        """Produce every record of a batch into `topic` in the open transaction, each with the epoch
        header unless the configuration turns it off (and its own headers, timestamp and
        partition when the batch has them; its own headers come first in the Spark record
        shape). A record without headers costs librdkafka half the time of one with. Records
        that can go in bulk are handed to the sender thread (module docstring)."""
        producer = self.require(epoch)
        epoch_header = (EPOCH_HEADER, str(epoch).encode()) if self.config.epoch_header else None
        self._started()
        bulk = self._bulk
        if (
            bulk is not None
            and epoch_header is None
            and records.headers is None
            and records.timestamps is None
            and records.partition_array is None
            and bulk_capable(records.value_array)
            and (records.key_array is None or bulk_capable(records.key_array))
        ):
            if self._sender is None:
                self._sender = ThreadPoolExecutor(1, thread_name_prefix="ds-kafka-send")
            self._sending = self._sender.submit(
                self._send_bulk, bulk, producer, records, epoch, topic
            )
            return
        produce, poll = producer.produce, producer.poll
        plain = (
            records.headers is None and records.timestamps is None and records.partitions is None
        )
        try:
            keys = records.keys if records.keys is not None else [None] * len(records)
            if plain and epoch_header is not None:
                headers: list[Header] = [epoch_header]
                for value, key in zip(records.values, keys, strict=True):
                    try:
                        produce(topic, value, key, headers=headers)
                    except BufferError:
                        poll(QUEUE_FULL_WAIT_S)
                        produce(topic, value, key, headers=headers)
            elif plain and records.keys is None:  # no key argument: ~0.1 us less per record
                for value in records.values:
                    try:
                        produce(topic, value)
                    except BufferError:
                        poll(QUEUE_FULL_WAIT_S)
                        produce(topic, value)
            elif plain:  # its own loop: even `headers=None` costs ~0.27 us per record
                for value, key in zip(records.values, keys, strict=True):
                    try:
                        produce(topic, value, key)
                    except BufferError:
                        poll(QUEUE_FULL_WAIT_S)
                        produce(topic, value, key)
            else:
                epoch_only: list[Header] = [epoch_header] if epoch_header is not None else []
                own_first = records.own_headers_first
                for value, key, extra, ts, part in records.produce_args():
                    row_headers: list[Header] | None = epoch_only or None
                    if extra:
                        row_headers = [*extra, *epoch_only] if own_first else [*epoch_only, *extra]
                    try:
                        produce(topic, value, key, part, timestamp=ts, headers=row_headers)
                    except BufferError:
                        poll(QUEUE_FULL_WAIT_S)
                        produce(topic, value, key, part, timestamp=ts, headers=row_headers)
            poll(0)
        except BufferError:
            self._queue_full(epoch)
        except Exception as exc:  # noqa: BLE001 - translated
            self.fail(exc, "producing records", epoch)
        self.check_delivery(epoch)

    def _send_bulk(
        self, bulk: BulkProducer, producer: Producer, records: Records, epoch: int, topic: str
    ) -> None:
        """On the sender thread: enqueue the records in bulk, errors translated."""
        try:
            bulk.send(
                topic,
                records.value_array,
                records.key_array,
                wait_s=QUEUE_FULL_WAIT_S,
                on_full=lambda: self._queue_full(epoch),
            )
            producer.poll(0)
        except Exception as exc:  # noqa: BLE001 - translated
            self.fail(exc, "producing records", epoch)

    def _settle(self, *, quietly: bool = False) -> None:
        """Wait for the send in flight; raise what it raised unless `quietly`."""
        sending, self._sending = self._sending, None
        if sending is None:
            return
        if quietly:
            with contextlib.suppress(Exception):
                sending.result()
            return
        sending.result()

    def _queue_full(self, epoch: int) -> NoReturn:
        raise TransientError(
            "the producer's queue stayed full (the brokers do not keep up)",
            **self.where(epoch),
            fix="raise queue.buffering.max.messages/kbytes in producer_config, or check the "
            "brokers",
        ) from None

    def _started(self) -> None:
        if self._first_record is None:
            self._first_record = time.monotonic()

    def check_delivery(self, epoch: int) -> None:
        """Raise what a failed delivery report says (a record too large: SchemaMismatchError)."""
        if self._delivery_errors:
            error = self._delivery_errors[0]
            if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise SchemaMismatchError(
                    f"the broker refused a record as too large ({error.str()})",
                    **self.where(epoch),
                    fix="raise max.message.bytes on the topic, or make rows smaller",
                )
            if error.code() == KafkaError.INVALID_TIMESTAMP:
                raise SchemaMismatchError(
                    f"the broker refused a record's timestamp ({error.str()}): "
                    f"timestamp_column {self.config.timestamp_column!r} holds a time outside "
                    "what the topic accepts (message.timestamp.before.max.ms / "
                    "after.max.ms; Kafka 4 refuses more than an hour ahead by default)",
                    **self.where(epoch),
                    fix="check the column: integers are milliseconds since the Unix epoch (not "
                    "microseconds or nanoseconds); or widen the topic's limits",
                )
            self.fail(KafkaException(error), "delivering records", epoch)

    def flush(self, epoch: int) -> None:
        """Wait until every record of the open transaction is acknowledged (acks=all)."""
        producer = self.require(epoch)
        try:
            remaining = producer.flush(self._timeout)
        except Exception as exc:  # noqa: BLE001 - translated
            self.fail(exc, "flushing records", epoch)
        self.check_delivery(epoch)
        if remaining:
            raise TransientError(
                f"{remaining} records were not acknowledged within {self._timeout:g} s",
                **self.where(epoch),
            )

    def write_alone(self, what: str, topic: str, value: bytes, key: bytes) -> None:
        """One record in a transaction of its own, committed (the fence record)."""
        self.write_together(what, topic, [(key, value)])

    def write_together(self, what: str, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Records (key, value) in a transaction of their own, committed atomically."""
        self.begin()
        for key, value in records:
            self.send_one(what, topic, value, key)
        try:
            self.commit()
        except InDoubtError as exc:
            raise TransientError(exc.message, **self.where(None)) from None
        except TransientError:
            self.abort_quietly(None)
            raise

    def commit(self, epoch: int | None = None) -> None:
        """Commit the open transaction (librdkafka flushes its records first).
        TransientError: it must be aborted (the caller does; a broken producer's is aborted
        by the next producer's init), nothing is visible; InDoubtError: the outcome is unknown
        (still failing with a retriable error after request_timeout_s, a fatal error, or an
        epoch's EndTxn fenced: see `_fenced_at_commit`). The sink's own records (`epoch`
        None) are never in doubt: a fence there is FencedError, nothing visible."""
        producer = self.require(epoch)
        deadline = time.monotonic() + self._timeout
        delay = RETRY_BACKOFF_S[0]
        while True:
            try:
                producer.commit_transaction(max(deadline - time.monotonic(), 0.1))
            except Exception as exc:  # noqa: BLE001 - every failure is typed below
                self._commit_failed(exc, epoch, retry=time.monotonic() + delay < deadline)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_BACKOFF_S[1])
            else:
                self._first_record = None
                return

    def _commit_failed(self, exc: Exception, epoch: int | None, *, retry: bool) -> None:
        """Return if commit_transaction may be called again; raise what the failure means."""
        error = kafka_error_of(exc)
        if error is None and isinstance(exc, SystemError):
            if self.fenced is not None:
                raise self.fenced from None
            # A fenced (or timed-out) producer's records fail with an old epoch.
            error = next((e for e in self._delivery_errors if e.code() in FENCED_CODES), None)
        if error is not None and error.txn_requires_abort():
            refused = error.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_TIMESTAMP)
            if refused:
                # Records produced in bulk have no delivery report of their own: produce the
                # next attempt's record by record, whose report names the refused record.
                self._bulk = None
            raise TransientError(
                f"the transaction had to be aborted ({error.name()}: {error.str()}); "
                "nothing of the epoch is visible",
                **self.where(epoch),
                fix="the broker refused a record: the next attempt reports which"
                if refused
                else None,
            ) from None
        if error is not None and error.code() in FENCED_CODES:
            if epoch is None:  # the sink's own records (the fence record): never in doubt
                self._fence_or_timeout(error, "commit_transaction", epoch)
            self._fenced_at_commit(error, epoch)
        if error is not None and self._retriable(exc) is not None:
            if retry:
                self._log.bind(epoch=epoch).info(
                    "commit_transaction: retriable %s, retrying", error.name()
                )
                return
        elif error is not None and error.fatal():
            self.broken = True
        raise InDoubtError(
            f"commit_transaction failed ({describe(error, exc)}); the epoch may or may not "
            "be committed",
            **self.where(epoch),
            fix="nothing to do if the job retries or restarts: recovery reads the outcome from "
            "the progress topic",
        ) from None

    def abort(self, epoch: int | None = None) -> bool:
        """Abort the open transaction; False when there is nothing this producer can abort
        (a fenced or broken producer's transaction is aborted by the next init)."""
        self._settle(quietly=True)
        producer = self._producer
        if producer is None or self.fenced is not None or self.broken:
            return False
        self.call("abort_transaction", producer.abort_transaction, epoch)
        self._first_record = None
        self.aborts += 1
        return True

    def abort_quietly(self, epoch: int | None) -> None:
        """Abort after a failure that is being raised anyway."""
        with contextlib.suppress(DurableSinkError):
            self.abort(epoch)


class KafkaParticipant(OpenParticipant):
    """One attempt at an epoch: what its open transaction holds so far."""

    def __init__(self, epoch: int, name: ParticipantName) -> None:
        super().__init__(epoch, name)
        self.rows = 0
        self.bytes = 0
        self.checksum = 0
        self.prepared: CommitHandle | None = None
        #: High watermarks asked at begin_epoch, of the topics the epoch likely writes
        #: (awaited before its first record is produced): where its offset ranges start.
        self.pending: Callable[[], dict[TopicPartition, int]] | None = None
        #: The ranges' starts known so far.
        self.starts: dict[TopicPartition, int] = {}
        #: Topic -> partitions of every topic the epoch writes (the sink's topic from the
        #: start; a topic rows name from its first record).
        self.topics: dict[str, int] = {}
        #: Topics rows named this epoch that do not exist (looked up once per epoch).
        self.missing: set[str] = set()
        #: The number of the (shared) transaction the participant's records are in.
        self.number = 0
        #: A riding participant's high watermarks after its pre_commit (what its commit
        #: waits to see).
        self.written: dict[TopicPartition, int] = {}
