"""The sink's transactional producer and what its errors mean.

One stable `transactional.id` per (job, sink). `start` makes a new librdkafka producer and
calls `init_transactions`, which completes or aborts whatever an older producer of the same id
left open and bumps the producer epoch: the older producer's next call fails fatally.

Errors, as the coordinator sees them:
- fenced (a newer producer took over the id): FencedError, remembered, so every later call
  fails the same way;
- another fatal error: TransientError, and the producer is `broken` until `start` replaces it
  (the sink does so at the next epoch);
- retriable (librdkafka says so): init, begin, commit and abort are retried a few times with
  backoff, then TransientError;
- a commit whose outcome is unknown: InDoubtError (the progress topic tells, later).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Producer

from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    InDoubtError,
    SchemaMismatchError,
    TransientError,
    UsageError,
)
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.redaction import MASK, is_secret

from .config import THROUGHPUT_DEFAULTS, KafkaSinkConfig
from .errors import FENCED_CODES, Where, kafka_error_of
from .records import Records

#: librdkafka's own log lines go here (never with secrets: it redacts sensitive settings).
client_log = logging.getLogger("durable_sinks.sinks.kafka.client")
#: Tries of a retriable transactional call (init, begin, commit, abort) before giving up.
CALL_ATTEMPTS = 5

Header = tuple[str, str | bytes | None]


class TransactionalProducer:
    """See the module docstring. Used from one thread at a time, like the sink."""

    def __init__(
        self, config: KafkaSinkConfig, transactional_id: str, where: Where, log: JobLogger
    ) -> None:
        self.config = config
        self.transactional_id = transactional_id
        self._where = where
        self._log = log
        self._timeout = config.request_timeout_s
        self._producer: Producer | None = None
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
        return {
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
        """The refused settings as a ConfigError: the user's own key when one alone is
        refused (librdkafka may name an alias: linger.ms is queue.buffering.max.ms); secret
        values never shown."""
        error = kafka_error_of(exc)
        reason = error.str() if error is not None else str(exc)
        user = self.config.producer_config
        for secret in (str(v) for k, v in user.items() if is_secret(k) and str(v)):
            reason = reason.replace(secret, MASK)
        culprit = None
        for key, value in user.items():
            try:
                Producer({key: value})
            except KafkaException as single:
                # A setting refused alone (unknown, wrong type or range), not one that
                # only fails beside others ("Failed to create producer: ...").
                if "Failed to create" not in str(single):
                    culprit = key
                    break
        if culprit is None:
            what = "the producer settings are refused by librdkafka"
        else:
            shown = MASK if is_secret(culprit) else repr(user[culprit])
            what = f"producer_config[{culprit!r}] = {shown} is refused by librdkafka"
        return ConfigError(
            f"{what}: {reason}",
            **self._where(None),
            fix="correct or remove it (librdkafka's CONFIGURATION.md lists every producer "
            "setting, its type and range)",
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
        self.fenced, self.broken = None, False
        self.call("init_transactions", lambda: producer.init_transactions(self._timeout))

    def close(self) -> None:
        """Release the producer. An open transaction is left to the broker (it aborts it at
        transaction.timeout.ms, or the next producer's init aborts it at once)."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        with warnings.catch_warnings(record=True) as caught, contextlib.suppress(Exception):
            warnings.simplefilter("always")
            producer.close()  # aborts an open transaction; fails harmlessly when fenced
        for warning in caught:
            self._log.debug("closing the producer: %s", warning.message)

    def refuse(self, error: FencedError) -> NoReturn:
        """Remember that a newer generation owns the sink (found in the fence record) and
        raise it."""
        self.fenced = error
        raise error

    def require(self, epoch: int | None = None) -> Producer:
        if self.fenced is not None:
            raise self.fenced
        if self._producer is None:
            raise UsageError(
                f"the producer of {self.transactional_id!r} is not started (the sink is not open)",
                **self._where(epoch),
            )
        return self._producer

    def _on_delivery_error(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            self._delivery_errors.append(error)

    # -- errors --------------------------------------------------------------------------------
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
        if error is None:
            raise TransientError(
                f"{what} failed: {type(exc).__name__}: {exc}", **self._where(epoch)
            ) from exc
        if error.code() in FENCED_CODES:
            self.fenced = FencedError(
                f"{what}: a newer producer with transactional.id {self.transactional_id!r} "
                f"took over ({error.name()}); this coordinator must stop",
                **self._where(epoch),
                fix="nothing to do here: the newer coordinator owns the job",
            )
            raise self.fenced from None
        if error.fatal():
            self.broken = True
            raise TransientError(
                f"{what}: the producer hit a fatal error ({error.name()}: {error.str()}); "
                "the next attempt starts a new producer",
                **self._where(epoch),
            ) from None
        raise TransientError(
            f"{what} failed: {error.name()}: {error.str()}", **self._where(epoch)
        ) from None

    def call(self, what: str, call: Callable[[], Any], epoch: int | None = None) -> Any:
        """Run a transactional call, retrying what librdkafka marks retriable."""
        for attempt in range(CALL_ATTEMPTS):
            try:
                return call()
            except KafkaException as exc:
                error = kafka_error_of(exc)
                if error is not None and error.retriable() and attempt + 1 < CALL_ATTEMPTS:
                    self._log.bind(epoch=epoch).info(
                        "%s: retriable %s, retrying", what, error.name()
                    )
                    time.sleep(0.1 * 2**attempt)
                    continue
                self.fail(exc, what, epoch)
            except Exception as exc:  # noqa: BLE001 - translated, never swallowed
                self.fail(exc, what, epoch)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- transactions --------------------------------------------------------------------------
    def begin(self, epoch: int | None = None) -> None:
        producer = self.require(epoch)
        self._delivery_errors.clear()
        self.call("begin_transaction", producer.begin_transaction, epoch)

    def send_one(
        self, what: str, topic: str, value: bytes, key: bytes, epoch: int | None = None
    ) -> None:
        """Produce one record to partition 0 of `topic` in the open transaction."""
        try:
            self.require(epoch).produce(topic, value, key, partition=0)
        except Exception as exc:  # noqa: BLE001 - translated
            self.fail(exc, what, epoch)

    def send(self, records: Records, epoch_header: Header, epoch: int) -> None:
        """Produce every record of a batch into the open transaction, each with the epoch
        header (and its own headers, timestamp and partition when the layout has them)."""
        producer = self.require(epoch)
        topic = self.config.topic
        produce, poll = producer.produce, producer.poll
        plain = (
            records.headers is None and records.timestamps is None and records.partitions is None
        )
        try:
            if plain:
                headers: list[Header] = [epoch_header]
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
            raise TransientError(
                "the producer's queue stayed full (the brokers do not keep up)",
                **self._where(epoch),
                fix="raise queue.buffering.max.messages/kbytes in producer_config, or check the "
                "brokers",
            ) from None
        except Exception as exc:  # noqa: BLE001 - translated
            self.fail(exc, "producing records", epoch)
        self.check_delivery(epoch)

    def check_delivery(self, epoch: int) -> None:
        """Raise what a failed delivery report says (a record too large: SchemaMismatchError)."""
        if self._delivery_errors:
            error = self._delivery_errors[0]
            if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise SchemaMismatchError(
                    f"the broker refused a record as too large ({error.str()})",
                    **self._where(epoch),
                    fix="raise max.message.bytes on the topic, or make rows smaller",
                )
            if error.code() == KafkaError.INVALID_TIMESTAMP:
                raise SchemaMismatchError(
                    f"the broker refused a record's timestamp ({error.str()}): "
                    f"timestamp_column {self.config.timestamp_column!r} holds a time outside "
                    "what the topic accepts (message.timestamp.before.max.ms / "
                    "after.max.ms; Kafka 4 refuses more than an hour ahead by default)",
                    **self._where(epoch),
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
                **self._where(epoch),
            )

    def write_alone(self, what: str, topic: str, value: bytes, key: bytes) -> None:
        """One record in a transaction of its own, committed (the fence record)."""
        self.begin()
        self.send_one(what, topic, value, key)
        producer = self.require()
        self.call("commit_transaction", lambda: producer.commit_transaction(self._timeout))

    def commit(self, epoch: int | None = None) -> None:
        """Commit the open transaction. TransientError: it must be aborted (the caller does),
        nothing is visible; FencedError: a newer producer took over, nothing is visible;
        InDoubtError: the outcome is unknown."""
        producer = self.require(epoch)
        for attempt in range(CALL_ATTEMPTS):
            try:
                producer.commit_transaction(self._timeout)
            except KafkaException as exc:
                error = kafka_error_of(exc)
                if error is not None and error.txn_requires_abort():
                    raise TransientError(
                        f"the transaction had to be aborted ({error.name()}: {error.str()}); "
                        "nothing of the epoch is visible",
                        **self._where(epoch),
                    ) from None
                if error is not None and error.retriable() and attempt + 1 < CALL_ATTEMPTS:
                    time.sleep(0.1 * 2**attempt)
                    continue
                if error is not None and error.code() in FENCED_CODES:
                    self.fail(exc, "commit_transaction", epoch)
                raise InDoubtError(
                    f"commit_transaction failed ({error or exc}); the epoch may or may not be "
                    "committed",
                    **self._where(epoch),
                    fix="restart the job: recovery reads the outcome from the progress topic",
                ) from None
            except Exception as exc:  # a fenced producer raises SystemError
                if self.fenced is not None or isinstance(exc, SystemError):
                    self.fail(exc, "commit_transaction", epoch)
                raise InDoubtError(
                    f"commit_transaction failed ({type(exc).__name__}: {exc})",
                    **self._where(epoch),
                ) from exc
            else:
                return

    def abort(self, epoch: int | None = None) -> bool:
        """Abort the open transaction; False when there is nothing this producer can abort
        (a fenced or broken producer's transaction is aborted by the next init)."""
        producer = self._producer
        if producer is None or self.fenced is not None or self.broken:
            return False
        self.call("abort_transaction", lambda: producer.abort_transaction(self._timeout), epoch)
        self.aborts += 1
        return True

    def abort_quietly(self, epoch: int | None) -> None:
        """Abort after a failure that is being raised anyway."""
        with contextlib.suppress(DurableSinkError):
            self.abort(epoch)
