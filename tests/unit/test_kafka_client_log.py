"""librdkafka's logs and error callbacks are rate-limited: the first occurrence of each kind
logged at WARNING, repeats counted and summarised once per window."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from durable_sinks.sinks.kafka.clientlog import ClientLog, LogLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limiter(clock: Clock) -> LogLimiter:
    return LogLimiter(logging.LoggerAdapter(logging.getLogger("test.limiter")), 10.0, clock)


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "test.limiter"]


def test_the_first_occurrence_is_logged_and_repeats_summarised_once_per_window(
    limiter: LogLimiter, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for i in range(51):  # 10 per second, as librdkafka reports a refused connection
        clock.now = 100 + i / 10
        limiter.emit("log:FAIL", logging.WARNING, f"connect failed #{i}")
    assert lines(caplog) == [(logging.WARNING, "connect failed #0")]
    for i in range(51, 200):  # the window ends at #100 (10 s), the next one at #200
        clock.now = 100 + i / 10
        limiter.emit("log:FAIL", logging.WARNING, f"connect failed #{i}")
    assert lines(caplog) == [
        (logging.WARNING, "connect failed #0"),
        (logging.WARNING, "connect failed #99 (repeated 99 times within 10 s)"),
    ]
    limiter.flush()  # at close: what the last window counted
    assert lines(caplog)[-1] == (
        logging.WARNING,
        "connect failed #199 (repeated 100 times within 10 s)",
    )
    assert len(lines(caplog)) == 3


def test_kinds_are_limited_apart_and_a_quiet_kind_is_logged_afresh(
    limiter: LogLimiter, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    limiter.emit("error:_TRANSPORT", logging.WARNING, "transport")
    limiter.emit("error:_ALL_BROKERS_DOWN", logging.WARNING, "all down")
    limiter.emit("error:_TRANSPORT", logging.WARNING, "transport again")
    clock.now += 30  # quiet for longer than a window
    limiter.emit("error:_ALL_BROKERS_DOWN", logging.WARNING, "all down again")
    assert lines(caplog) == [
        (logging.WARNING, "transport"),
        (logging.WARNING, "all down"),
        (logging.WARNING, "all down again"),
    ]
    limiter.flush()
    assert lines(caplog)[-1] == (logging.WARNING, "transport again (repeated 1 times within 10 s)")


def test_nothing_to_summarise_logs_nothing_at_flush(
    limiter: LogLimiter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    limiter.emit("log:FAIL", logging.WARNING, "once")
    limiter.flush()
    assert lines(caplog) == [(logging.WARNING, "once")]


def test_client_log_carries_the_job_and_sink_and_maps_levels(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="durable_sinks.sinks.kafka.client")
    client = ClientLog("orders", "kafka")
    # What librdkafka calls: logger.log(level, "%s [%s] %s", facility, client name, text).
    for _ in range(20):
        client.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "Connect failed")
    client.log(logging.INFO, "%s [%s] %s", "CONFWARN", "rdkafka#producer-1", "notice")
    for _ in range(20):
        client.error(KafkaError(KafkaError._TRANSPORT, "Connect failed"))
    client.error(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    records = [r for r in caplog.records if r.name == "durable_sinks.sinks.kafka.client"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (
            logging.WARNING,
            "job=orders sink=kafka epoch=-: librdkafka: FAIL [rdkafka#producer-1] Connect failed",
        ),
        (
            logging.DEBUG,
            "job=orders sink=kafka epoch=-: librdkafka: CONFWARN [rdkafka#producer-1] notice",
        ),
        (
            logging.WARNING,
            "job=orders sink=kafka epoch=-: librdkafka error _TRANSPORT: Connect failed",
        ),
        (logging.WARNING, "job=orders sink=kafka epoch=-: librdkafka fatal error _FENCED: fenced"),
    ]
    assert all(r.ds_job == "orders" and r.ds_sink == "kafka" for r in records)  # type: ignore[attr-defined]
    client.flush()
    assert len([r for r in caplog.records if "repeated 19 times" in r.getMessage()]) == 2
