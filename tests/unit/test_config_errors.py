"""Every refusal of a bad setting names the problem and carries a fix, before anything is
contacted: the sinks' configurations and the job's options, built from plain values."""

from __future__ import annotations

import re
from typing import Any

import pytest

from durable_sinks.core.errors import ConfigError
from durable_sinks.sinks.folder import Files
from durable_sinks.sinks.kafka import Kafka
from durable_sinks.sinks.kafka.config import bootstrap_hosts
from durable_sinks.sinks.postgres import Postgres
from durable_sinks.spark import JobOptions

POSTGRES = {"dsn": "host=127.0.0.1 port=1", "table": "t"}
KAFKA = {"bootstrap_servers": "127.0.0.1:1", "topic": "events"}


@pytest.mark.parametrize(
    ("build", "options", "message"),
    [
        (Postgres, {"dsn": ""}, "`dsn` is empty"),
        (Postgres, {"table": "a.b.c"}, "is not `table` or `schema.table`"),
        (Postgres, {"mode": "merge"}, "is not 'append' or 'upsert'"),
        (Postgres, {"mode": "upsert"}, "upsert mode needs `key`"),
        (Postgres, {"key": ("id",)}, "only used in upsert mode"),
        (Postgres, {"mode": "upsert", "key": ("a b",)}, "not a plain identifier"),
        (Postgres, {"meta_schema": "x;y"}, "is not an identifier"),
        (Postgres, {"participants_in_flight": 0}, "participants_in_flight"),
        (Kafka, {"topic": "bad topic"}, "not a valid topic name"),
        (Kafka, {"progress_topic": "events"}, "progress_topic must differ"),
        (Kafka, {"key_column": "id", "value_column": "id"}, "more than one role"),
        (Kafka, {"transaction_timeout_s": 0}, "must be from 1 to"),
        (
            Kafka,
            {"transaction_timeout_s": 90, "max_transaction_timeout_s": 300},
            "are both set",
        ),
        (Kafka, {"producer_config": {"acks": 1}}, "which the sink owns"),
        (Kafka, {"topic_partitions": 0}, "topic_partitions"),
        (Kafka, {"request_timeout_s": 0}, "time-outs must be > 0"),
        (Files, {"path": " "}, "`path` is empty"),
        (Files, {"path": "/tmp/x", "compression": "lzma"}, "compression"),
        (JobOptions, {"job_id": ""}, "job_id"),
        (JobOptions, {"job_id": "j", "guarantee": "exactly-twice"}, "guarantee"),
        (JobOptions, {"job_id": "j", "execution": "cluster"}, "execution"),
        (JobOptions, {"job_id": "j", "driver_read": "collect"}, "driver_read"),
        (JobOptions, {"job_id": "j", "max_rows_in_memory": 0}, "max_rows_in_memory"),
        (JobOptions, {"job_id": "j", "retain_epochs": 0}, "retain_epochs"),
    ],
)
def test_a_bad_setting_is_named_with_its_fix(
    build: Any, options: dict[str, Any], message: str
) -> None:
    defaults = {Postgres: POSTGRES, Kafka: KAFKA}.get(build, {})
    with pytest.raises(ConfigError, match=message) as raised:
        build(**{**defaults, **options})
    assert raised.value.fix, f"{raised.value} has no fix"


# -- Kafka: bootstrap_servers, topic names, producer_config -------------------------------------
BOOTSTRAP_FIX = "host:port[,host:port...]"


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ("localhost:abc", "the port 'abc' is not a number"),
        ("localhost:9092;x", "the port '9092;x' is not a number"),
        ("http://localhost:9092", "http:// is not a Kafka protocol"),
        ("host:99999", "the port '99999' is not a number from 1 to 65535"),
        ("host:0", "the port '0'"),
        ("host:", "the port ''"),
        (":9092", "'' is not a host name"),
        ("h1:9092 h2:9092", "it holds a space (separate entries with commas)"),
        ("SSL://h:9092", "does not match security.protocol=plaintext"),
        ("::1", "an IPv6 address must be in brackets"),
        ("[nope]:9092", "is not an [IPv6 address]"),
        ("broker_1!:9092", "'broker_1!' is not a host name"),
    ],
)
def test_a_malformed_bootstrap_string_is_refused_when_configured(
    servers: str, message: str
) -> None:
    """Each of these made librdkafka drop or misread the entry and wait the whole request
    time-out (30 s by default) before a TransientError; now refused at once."""
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        Kafka(servers, "events")
    assert f"bootstrap_servers entry {servers.strip()!r} is malformed" in raised.value.message
    assert BOOTSTRAP_FIX in (raised.value.fix or "")


@pytest.mark.parametrize("servers", [" ", ",", " , "])
def test_a_bootstrap_string_naming_no_broker_is_refused(servers: str) -> None:
    with pytest.raises(ConfigError, match=r"`?bootstrap_servers`? (is empty|names no broker)") as e:
        Kafka(servers, "events")
    assert BOOTSTRAP_FIX in (e.value.fix or "")


@pytest.mark.parametrize(
    ("servers", "hosts"),
    [
        ("localhost", [("localhost", 9092)]),  # librdkafka's default port
        ("PLAINTEXT://127.0.0.1:19092", [("127.0.0.1", 19092)]),
        ("a:1, b-2.example.com:2,", [("a", 1), ("b-2.example.com", 2)]),
        ("[::1]:9093,[fe80::1]", [("::1", 9093), ("fe80::1", 9092)]),
        ("h:9092/", [("h", 9092)]),
    ],
)
def test_what_librdkafka_accepts_is_accepted(servers: str, hosts: list[tuple[str, int]]) -> None:
    Kafka(servers, "events")
    assert bootstrap_hosts(servers, "plaintext", "w") == hosts


def test_a_bootstrap_prefix_matching_security_protocol_is_accepted() -> None:
    config = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    Kafka("sasl_ssl://h:9093", "events", producer_config=config)


def test_a_topic_too_long_for_its_progress_topic_is_refused_when_configured() -> None:
    """A 249-character topic passed, then the broker refused `<topic>-ds-progress` after the
    data topic had been created. Names both, and both ways out."""
    topic = "t" * 249
    with pytest.raises(ConfigError) as raised:
        Kafka("h:9092", topic, create_topic=True)
    message, fix = raised.value.message, raised.value.fix or ""
    assert f"topic {topic!r} has 249 characters" in message
    assert f"its progress topic {topic + '-ds-progress'!r} would have 261" in message
    assert "at most 237 characters" in fix
    assert "progress_topic=" in fix
    Kafka("h:9092", topic, progress_topic="events-progress")  # the way out
    Kafka("h:9092", "t" * 237)  # the longest with a derived progress topic
    with pytest.raises(ConfigError, match="would have 250"):
        Kafka("h:9092", "t" * 238)


@pytest.mark.parametrize(
    ("topic", "progress"), [("orders.v1", "orders_v1"), ("a_b", "a.b"), ("a.b", "a.b")]
)
def test_a_progress_topic_colliding_with_the_topic_is_refused(topic: str, progress: str) -> None:
    """Kafka counts '.' and '_' as one character; both were created in one request and
    the broker let them collide."""
    with pytest.raises(ConfigError, match=r"differ only by|must differ") as raised:
        Kafka("h:9092", topic, progress_topic=progress)
    assert "progress_topic" in (raised.value.fix or "")


@pytest.mark.parametrize(
    ("producer_config", "message", "fix"),
    [
        ([("linger.ms", 5)], "producer_config must be a mapping", "producer_config={"),
        ({1: 5}, "producer_config has the key 1 (int)", "as strings"),
        ({"linger.ms": [5]}, "producer_config['linger.ms'] is [5] (list)", "str, int, float"),
        ({"linger.ms": None}, "producer_config['linger.ms'] is None", "str, int, float"),
    ],
)
def test_producer_config_of_a_wrong_shape_is_refused_when_configured(
    producer_config: Any, message: str, fix: str
) -> None:
    """These escaped as AttributeError at open (`'list' object has no attribute 'items'`)."""
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        Kafka("h:9092", "events", producer_config=producer_config)
    assert fix in (raised.value.fix or "")


def test_a_secret_of_a_wrong_type_is_not_shown() -> None:
    secret = "hunter2-secret-value"
    with pytest.raises(
        ConfigError, match=re.escape("producer_config['sasl.password'] is ***")
    ) as e:
        Kafka("h:9092", "events", producer_config={"sasl.password": [secret]})  # type: ignore[dict-item]
    assert secret not in str(e.value) + repr(e.value)
