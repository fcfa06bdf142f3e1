"""librdkafka's errors as the sink reads them: the KafkaError behind an exception, the classes
of codes that matter (a newer producer took over, the cluster cannot be reached, a setting or
permission is wrong) and `client_failure`, which turns any client failure outside the
producer's transactions (admin calls, progress-topic reads) into a typed error. What a transactional
call's failure becomes (FencedError, TransientError, InDoubtError) is decided by the producer
(writer.py), which knows the transaction's state. `refused_settings` names the user's own
producer setting librdkafka refuses. Refusals that only the client's error callback reports
(credentials, TLS) are watched by refusals.py; the ACL checks at open are access.py's.

Nothing the sink raises is a raw KafkaException, SystemError or BufferError: `translate`, the
sink's one translation (its `_translate`), applies `client_failure` to them, in doubt around a
commit point (core/sink_base.py's `guarded` is the last guard around every protocol method)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    InDoubtError,
    TransientError,
    UnreachableError,
)
from durable_sinks.core.naming import component
from durable_sinks.core.redaction import MASK, is_secret
from durable_sinks.core.sink_base import SinkBase, Step

from .config import PROGRESS_READER_GROUP, Kafka

#: What every error of the sink names: the job, the sink and (when known) the epoch, as the
#: keyword arguments of a DurableSinkError.
Where = Callable[[int | None], dict[str, Any]]

#: librdkafka codes that mean a producer with the same transactional.id and a newer epoch
#: exists, or that the broker bumped the epoch itself after timing the transaction out: both
#: reach the client as fatal `_FENCED` (the broker answers INVALID_PRODUCER_EPOCH either way;
#: measured with librdkafka 2.16 against Kafka 4). The producer tells the two apart.
FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
#: The cluster could not be reached (or answered nothing in time).
UNREACHABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError.NETWORK_EXCEPTION,
    }
)
#: A refused login: wrong or revoked credentials, a disabled mechanism.
AUTHENTICATION_CODES = frozenset(
    {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
)
#: A missing ACL on what the sink reads or writes (topics, the progress reader's group).
AUTHORIZATION_CODES = frozenset(
    {
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    }
)
#: The cluster refuses this client: wrong credentials or missing ACLs (not retriable).
AUTH_CODES = AUTHENTICATION_CODES | AUTHORIZATION_CODES
UNREACHABLE_FIX = (
    "check that the brokers run and that bootstrap_servers and the security settings are "
    "right; the job retries while the outage lasts"
)
_ACLS = "docs/security.md lists every ACL a job needs"


def auth_fix(error: KafkaError | None, where: dict[str, Any]) -> str:
    """The fix for a refused login or a missing ACL, naming the ACL the code stands for."""
    code = error.code() if error is not None else None
    prefix = f"ds:{component(str(where.get('job') or '<job>'))}:"
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return (
            "grant this principal WRITE, DESCRIBE and DESCRIBE_CONFIGS on the sink's topic, "
            "and READ, WRITE, DESCRIBE and DESCRIBE_CONFIGS on its progress topic (CREATE "
            f"too where the sink creates them); {_ACLS}"
        )
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return (
            "grant this principal WRITE and DESCRIBE on the transactional ids with the "
            f"prefix {prefix!r} (a PREFIXED ACL: kafka-acls.sh --resource-pattern-type "
            f"prefixed --transactional-id '{prefix}'); {_ACLS}"
        )
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return (
            "grant this principal DESCRIBE on the consumer group "
            f"{PROGRESS_READER_GROUP!r} (the progress reader never joins it, but its "
            f"client looks up the group's coordinator); {_ACLS}"
        )
    return (
        "check the SASL/SSL settings in producer_config and this principal's ACLs; "
        f"{_ACLS}; retrying cannot help"
    )


def kafka_error_of(exc: BaseException) -> KafkaError | None:
    """The KafkaError behind `exc`: confluent-kafka raises KafkaException(KafkaError), and a
    producer call that fails inside a callback raises SystemError whose cause or context is
    the KafkaException (or the KafkaError itself)."""
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


def describe(error: KafkaError | None, exc: BaseException) -> str:
    """`NAME: text` of a librdkafka error (or the exception's type and text)."""
    if error is None:
        return f"{type(exc).__name__}: {exc}"
    return f"{error.name()}: {error.str()}"


def translate(exc: Exception, step: Step, sink: SinkBase[Kafka]) -> DurableSinkError | None:
    """A raw librdkafka failure that no inner path translated (those that know the
    transaction's state do, in writer.py), raised during `step`: `client_failure`'s, an
    InDoubtError when the step's outcome is unknown (`step.in_doubt`); None for anything that
    is not the client's."""
    if not isinstance(exc, RAW):
        return None
    unknown = InDoubtError if step.in_doubt else TransientError
    where = sink.where(step.epoch)
    return client_failure(exc, f"{step.action} failed", where, fix=step.in_doubt, unknown=unknown)


def client_failure(
    exc: BaseException,
    what: str,
    where: dict[str, Any],
    *,
    fix: str | None = None,
    unknown: type[DurableSinkError] = TransientError,
) -> DurableSinkError:
    """A client failure outside a transaction, typed: credentials or ACLs refused:
    ConfigError; the cluster unreachable: UnreachableError; anything else `unknown`
    (TransientError unless the caller knows better). With `unknown` an InDoubtError (around
    a commit point) every failure is in doubt. `what` says what failed ("cannot read ...")."""
    if isinstance(exc, DurableSinkError):
        return exc
    error = kafka_error_of(exc)
    message = f"{what}: {describe(error, exc)}"
    if issubclass(unknown, InDoubtError):
        # Around a commit point, whatever failed may have happened after the commit.
        return unknown(message, **where, fix=fix)
    if error is not None and error.code() in AUTH_CODES:
        return ConfigError(message, **where, fix=auth_fix(error, where))
    if error is not None and error.code() in UNREACHABLE_CODES:
        return UnreachableError(
            message,
            **where,
            fix=fix or UNREACHABLE_FIX,
        )
    if isinstance(exc, BufferError):
        return TransientError(
            f"{what}: the producer's queue is full",
            **where,
            fix="raise queue.buffering.max.messages/kbytes in producer_config, or check the "
            "brokers",
        )
    return unknown(message, **where, fix=fix)


#: What a Kafka client raises: KafkaException, SystemError (a call that failed inside a
#: callback), BufferError (the producer's queue is full).
RAW = (KafkaException, SystemError, BufferError)


def refused_settings(
    exc: KafkaException,
    user: Mapping[str, Any],
    quiet: Mapping[str, Any],
    where: dict[str, Any],
) -> ConfigError:
    """The refused settings (`exc`, librdkafka's refusal) as a ConfigError: the user's own
    key of `user` (producer_config) when one alone is refused (librdkafka may name an alias:
    linger.ms is queue.buffering.max.ms); secret values never shown. `quiet` are the
    settings that route a probe client's logs (clientlog.py)."""
    error = kafka_error_of(exc)
    reason = error.str() if error is not None else str(exc)
    for secret in (str(v) for k, v in user.items() if is_secret(k) and str(v)):
        reason = reason.replace(secret, MASK)
    culprit = None
    for key, value in user.items():
        try:
            Producer({key: value, **quiet})
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
        **where,
        fix="correct or remove it (librdkafka's CONFIGURATION.md lists every producer "
        "setting, its type and range)",
    )
