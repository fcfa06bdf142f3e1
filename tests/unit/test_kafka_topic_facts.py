"""The timestamps a topic takes, read from its described configuration (no broker)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from durable_sinks.sinks.kafka.admin import TimestampWindow, timestamp_window

UNLIMITED = str(2**63 - 1)


def described(**settings: str) -> dict[str, Any]:
    return {name.replace("_", "."): SimpleNamespace(value=v) for name, v in settings.items()}


def test_kafka_4_defaults_limit_only_the_future() -> None:
    found = timestamp_window(
        described(
            message_timestamp_type="CreateTime",
            message_timestamp_before_max_ms=UNLIMITED,
            message_timestamp_after_max_ms="3600000",
        )
    )
    assert found == TimestampWindow(None, 3_600_000)


def test_the_older_difference_setting_limits_both_ways() -> None:
    found = timestamp_window(
        described(
            message_timestamp_difference_max_ms="600000",
            message_timestamp_after_max_ms="3600000",
        )
    )
    assert found == TimestampWindow(600_000, 600_000)


def test_log_append_time_and_no_limits_take_any_timestamp() -> None:
    assert timestamp_window(described(message_timestamp_type="LogAppendTime")) is None
    assert timestamp_window(described(message_timestamp_after_max_ms=UNLIMITED)) is None
