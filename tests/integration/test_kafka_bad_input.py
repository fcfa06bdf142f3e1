"""The Kafka sink given wrong input, as a new user would give it, against the test
bed's real Kafka. Every case is refused with a typed error naming the problem and the fix, as
early as the input is known (configuration, `open`, or the batch), and nothing becomes
visible: `open` creates no topic unless every check passed, and a refused batch leaves no
record a read_committed consumer can read."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks import sink
from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    SchemaMismatchError,
    TransientError,
)
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint
from tests.support.coordinators import started
from tests.support.kafka_reads import assert_nothing_visible, read_committed
from tests.support.targets import create_topic

SECRET = f"sasl-secret-{uuid.uuid4().hex}"


@pytest.fixture
def ours(admin: AdminClient, unique: UniqueNames) -> Iterator[Callable[[], set[str]]]:
    """The topics on the broker whose names hold this test's token; all deleted afterwards."""

    def topics() -> set[str]:
        return {t for t in admin.list_topics(timeout=20).topics if unique.token in t}

    yield topics
    left = sorted(topics())
    if left:
        for future in admin.delete_topics(left, request_timeout=30).values():
            future.result(timeout=30)


def start(
    kafka: KafkaEndpoint, unique: UniqueNames, tmp_path: Any, topic: str, **options: Any
) -> Coordinator:
    """A job writing to `topic`, started (so its sink is opened) as `durable_sink` does."""
    settings = {"bootstrap_servers": kafka.bootstrap_servers, "topic": topic, **options}
    settings.setdefault("request_timeout_s", 20)
    return started(
        Coordinator(unique.job_id, [create("kafka", settings)], LocalDirectoryStore(tmp_path))
    )


def assert_named(error: DurableSinkError, job_id: str, fix: str) -> None:
    assert (error.job, error.sink) == (job_id, "kafka"), str(error)
    assert fix in (error.fix or ""), f"fix {error.fix!r} lacks {fix!r}"
    assert SECRET not in str(error) + repr(error)


# -- refused at configuration, before any client exists -------------------------------------------
def test_a_topic_too_long_for_its_progress_topic_is_refused_by_sink(
    kafka: KafkaEndpoint, unique: UniqueNames, ours: Callable[[], set[str]]
) -> None:
    """A 249-character topic passed, then the broker refused `<topic>-ds-progress` after
    the data topic had been created (left behind)."""
    topic = (unique.token + "t" * 249)[:249]
    with pytest.raises(ConfigError, match=re.escape(f"{topic + '-ds-progress'!r}")) as raised:
        sink("kafka", bootstrap_servers=kafka.bootstrap_servers, topic=topic, create_topic=True)
    assert "progress_topic=" in (raised.value.fix or "")
    assert ours() == set()


def test_a_249_character_topic_works_with_an_explicit_progress_topic(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    unique: UniqueNames,
    tmp_path: Any,
    ours: Callable[[], set[str]],
) -> None:
    topic = (unique.token + "t" * 249)[:249]
    progress = f"progress_{unique.token}"
    coordinator = start(kafka, unique, tmp_path, topic, progress_topic=progress, create_topic=True)
    try:
        batch = pa.record_batch({"n": pa.array([1], pa.int64())})
        assert coordinator.run_epoch(0, [batch]).outcome is EpochOutcome.COMMITTED
        assert len(read_committed(kafka, admin, topic)) == 1
        assert ours() == {topic, progress}
    finally:
        coordinator.close()


# -- refused at open, before any topic is created -------------------------------------------------
@dataclass
class OpenCase:
    """Options (with `{t}` standing for the test's token) and the topics that exist before."""

    options: dict[str, Any]
    error: type[DurableSinkError]
    message: str
    fix: str
    topic: str = "topic_{t}"
    existing: dict[str, dict[str, Any]] = field(default_factory=dict)


OPEN_CASES = {
    "unknown producer setting": OpenCase(
        {"create_topic": True, "producer_config": {"lingerms": 5, "sasl.password": SECRET}},
        ConfigError,
        "producer_config['lingerms'] = 5 is refused by librdkafka: No such configuration "
        'property: "lingerms"',
        "CONFIGURATION.md",
    ),
    "producer setting of a wrong type (librdkafka names its alias)": OpenCase(
        {"create_topic": True, "producer_config": {"linger.ms": "soon"}},
        ConfigError,
        "producer_config['linger.ms'] = 'soon' is refused by librdkafka: Invalid value for "
        'configuration property "queue.buffering.max.ms"',
        "CONFIGURATION.md",
    ),
    "producer setting out of its choices": OpenCase(
        {"create_topic": True, "producer_config": {"compression.type": "rar"}},
        ConfigError,
        "producer_config['compression.type'] = 'rar' is refused",
        "CONFIGURATION.md",
    ),
    "unknown security protocol (was a raw KafkaException)": OpenCase(
        {"create_topic": True, "producer_config": {"security.protocol": "tls"}},
        ConfigError,
        "producer_config['security.protocol'] = 'tls' is refused",
        "CONFIGURATION.md",
    ),
    "settings refused only together": OpenCase(
        {"create_topic": True, "producer_config": {"max.in.flight": 10}},
        ConfigError,
        "the producer settings are refused by librdkafka: Failed to create producer: "
        "`max.in.flight` must be set <= 5",
        "CONFIGURATION.md",
    ),
    "replication factor above the broker count": OpenCase(
        {"create_topic": True, "replication_factor": 3},
        ConfigError,
        "the broker refuses to create topic 'topic_{t}' (nothing was created)",
        "set replication_factor to at most 1",
    ),
    "replication factor above the broker count, data topic exists": OpenCase(
        {"replication_factor": 3},
        ConfigError,
        "the broker refuses to create progress topic 'topic_{t}-ds-progress'",
        "set replication_factor to at most 1",
        existing={"topic_{t}": {}},
    ),
    "topic to create collides with an existing one ('.' and '_')": OpenCase(
        {"create_topic": True},
        ConfigError,
        "collides with existing topic: c_{t}_x",
        "'.' and '_' as the same character",
        topic="c.{t}.x",
        existing={"c_{t}_x": {}},
    ),
    "progress topic to create collides with an existing one": OpenCase(
        {"create_topic": True, "progress_topic": "p.{t}"},
        ConfigError,
        "the broker refuses to create progress topic 'p.{t}'",
        "progress_topic=",
        existing={"p_{t}": {}},
    ),
    "existing progress topic that deletes records": OpenCase(
        {"create_topic": True},
        ConfigError,
        "progress topic 'topic_{t}-ds-progress' has cleanup.policy=delete",
        "cleanup.policy=compact",
        existing={"topic_{t}-ds-progress": {"cleanup.policy": "delete"}},
    ),
    "existing progress topic compacted and deleted by age": OpenCase(
        {"create_topic": True},
        ConfigError,
        "progress topic 'topic_{t}-ds-progress' has cleanup.policy=compact,delete",
        "cleanup.policy=compact",
        existing={"topic_{t}-ds-progress": {"cleanup.policy": "compact,delete"}},
    ),
    "existing progress topic deleted by age after a month": OpenCase(
        {"create_topic": True},
        ConfigError,
        "retention.ms=2592000000",
        "cleanup.policy=compact",
        existing={
            "topic_{t}-ds-progress": {"cleanup.policy": "delete", "retention.ms": "2592000000"}
        },
    ),
    "an existing non-compacted topic given as progress_topic": OpenCase(
        {"create_topic": True, "progress_topic": "events_{t}"},
        ConfigError,
        "progress topic 'events_{t}' has cleanup.policy=delete",
        "leave progress_topic unset",
        existing={"events_{t}": {}},
    ),
    "existing progress topic with two partitions": OpenCase(
        {"create_topic": True},
        ConfigError,
        "progress topic 'topic_{t}-ds-progress' has 2 partitions; it needs 1",
        "another progress_topic",
        existing={"topic_{t}-ds-progress": {"partitions": 2, "cleanup.policy": "compact"}},
    ),
    "missing topic without create_topic": OpenCase(
        {}, ConfigError, "topic 'topic_{t}' does not exist", "create_topic=True"
    ),
}


@pytest.mark.parametrize("case", sorted(OPEN_CASES))
def test_bad_input_is_refused_at_open_before_any_topic_is_created(
    case: str,
    kafka: KafkaEndpoint,
    admin: AdminClient,
    unique: UniqueNames,
    job_id: str,
    tmp_path: Any,
    ours: Callable[[], set[str]],
) -> None:
    spec = OPEN_CASES[case]
    token = unique.token

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{t}", token)
        if isinstance(value, dict):
            return {fill(k): fill(v) for k, v in value.items()}
        return value

    for name, settings in fill(spec.existing).items():
        settings = dict(settings)
        create_topic(admin, name, settings.pop("partitions", 1), **settings)
    before = ours()
    with pytest.raises(spec.error, match=re.escape(fill(spec.message))) as raised:
        start(kafka, unique, tmp_path, fill(spec.topic), **fill(spec.options))
    assert_named(raised.value, job_id, spec.fix)
    assert ours() == before, "a refused open left a topic behind"


def test_an_unresolvable_bootstrap_host_is_refused_at_once(
    unique: UniqueNames, job_id: str, tmp_path: Any
) -> None:
    """It waited the whole request time-out (30 s) before "Failed while waiting for
    controller"; now the host is named after the DNS lookup fails (milliseconds)."""
    store = LocalDirectoryStore(tmp_path)
    config = {"bootstrap_servers": "nosuchhost.invalid:9092", "topic": "events"}
    coordinator = Coordinator(job_id, [create("kafka", config)], store)
    started = time.monotonic()
    with pytest.raises(
        TransientError, match=re.escape("no host of bootstrap_servers resolves: 'nosuchhost")
    ) as raised:
        coordinator.start()
    assert time.monotonic() - started < 15  # the request time-out is 30 s
    assert_named(raised.value, job_id, "host names in bootstrap_servers")
    coordinator.close()


# -- refused with the batch, before anything of it is visible -------------------------------------
BAD_BATCHES: dict[str, tuple[dict[str, Any], pa.RecordBatch, str, str]] = {
    "header column missing": (
        {"header_columns": ["h"]},
        pa.record_batch({"n": pa.array([1], pa.int64())}),
        "header_columns 'h' is not a column (columns: ['n'])",
        "change the sink's column roles",
    ),
    "value column of integers": (
        {"value_column": "n"},
        pa.record_batch({"n": pa.array([1], pa.int64())}),
        "value_column 'n' is int64; it must be string or binary",
        "change the sink's column roles",
    ),
    "key column of structs": (
        {"key_column": "s"},
        pa.record_batch({"s": pa.array([{"a": 1}]), "n": pa.array([1], pa.int64())}),
        "key_column 's' is struct<a: int64>; it must be string or binary",
        "change the sink's column roles",
    ),
    "partition the topic does not have": (
        {"partition_column": "p"},
        pa.record_batch({"p": pa.array([0, 5], pa.int32()), "n": pa.array([1, 2], pa.int64())}),
        "invalid_value (column 'p'): 1 row (first: row 1: partition 5, but topic",
        "modulo the topic's partition count",
    ),
    "negative partition": (
        {"partition_column": "p"},
        pa.record_batch({"p": pa.array([-5], pa.int32()), "n": pa.array([1], pa.int64())}),
        "first: row 0: partition -5, but topic",
        "modulo the topic's partition count",
    ),
    "timestamp far in the future": (
        {"timestamp_column": "ts"},
        pa.record_batch(
            {"ts": pa.array([0, 2**62], pa.int64()), "n": pa.array([1, 2], pa.int64())}
        ),
        "timestamp_out_of_range (column 'ts'): 1 row (first: row 1: timestamp",
        "milliseconds since the Unix epoch",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_a_bad_batch_is_refused_and_nothing_is_readable(
    case: str,
    kafka: KafkaEndpoint,
    admin: AdminClient,
    unique: UniqueNames,
    job_id: str,
    tmp_path: Any,
    ours: Callable[[], set[str]],
) -> None:
    options, batch, message, fix = BAD_BATCHES[case]
    topic = unique.name("topic")
    coordinator = start(kafka, unique, tmp_path, topic, create_topic=True, **options)
    try:
        with pytest.raises(SchemaMismatchError, match=re.escape(message)) as raised:
            coordinator.run_epoch(0, [batch])
        assert_named(raised.value, job_id, fix)
        assert raised.value.epoch == 0
        assert_nothing_visible(kafka, admin, topic, coordinator)
    finally:
        coordinator.close()
