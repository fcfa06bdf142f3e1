"""What librdkafka refuses among the producer settings, as a ConfigError naming the user's
own entry (checked at open, before any client connects)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.redaction import MASK, is_secret

from .errors import kafka_error_of


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
