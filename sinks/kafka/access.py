"""ACLs the sink checks at open, before anything is written: a topic this principal may see
but not write (or a progress topic it may not read or write), and the progress reader's
group. Without these checks the first would fail the first epoch with a retriable error, the
second only after the fence record was written (the reader's own group lookup just times
out). Only an authorization failure is an answer here: any other error (a coordinator still
loading, a broker restarting) is left to the calls that follow, which have their own error
handling."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from durable_sinks.core.errors import ConfigError

from .config import PROGRESS_READER_GROUP
from .errors import AUTHORIZATION_CODES, auth_fix, describe, kafka_error_of


def check_access(
    admin: AdminClient,
    wanted: Mapping[str, tuple[str, ...]],
    topic: str,
    timeout: float,
    where: dict[str, Any],
) -> None:
    """ConfigError naming the ACL when the broker says this principal lacks one of the
    operations `wanted` on a topic (`topic` is the sink's, the others its progress topic), or
    DESCRIBE on the progress reader's group. Clusters that do not say (no authorizer) pass."""
    futures = admin.describe_topics(
        TopicCollection(list(wanted)), include_authorized_operations=True, request_timeout=timeout
    )
    for name, future in futures.items():
        allowed = _answer(future, timeout, where)
        if allowed is None or not allowed.authorized_operations:
            continue
        names = {operation.name for operation in allowed.authorized_operations}
        missing = [op for op in wanted[name] if op not in names and "ALL" not in names]
        if missing:
            role = "topic" if name == topic else "progress topic"
            raise ConfigError(
                f"this principal may not {' or '.join(missing)} {role} {name!r} "
                f"(its ACLs allow {', '.join(sorted(names))})",
                **where,
                fix=f"grant this principal {' and '.join(missing)} on {role} {name!r} "
                "(docs/security.md lists every ACL a job needs); nothing was written",
            )
    group = admin.describe_consumer_groups([PROGRESS_READER_GROUP], request_timeout=timeout)
    _answer(group[PROGRESS_READER_GROUP], timeout, where)


def _answer(future: Any, timeout: float, where: dict[str, Any]) -> Any:
    """The request's result; None for any failure but an authorization failure, which is
    raised as a ConfigError with the ACL to grant."""
    try:
        return future.result(timeout=timeout + 5)
    except KafkaException as exc:
        error = kafka_error_of(exc)
        if error is not None and error.code() in AUTHORIZATION_CODES:
            raise ConfigError(
                f"the broker refuses this principal: {describe(error, exc)}",
                **where,
                fix=auth_fix(error, where),
            ) from None
        return None
    except TimeoutError:
        return None
