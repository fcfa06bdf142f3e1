"""Validation when the foreachBatch function is built: every error raises before the query
starts, names the problem and the fix, leaks no secret, and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.spark import durable_sink, sink
from sinks import FileSink, FileSinkConfig
from sinks.errors import CapabilityError, ConfigError, DurableSinkError
from tests.services import KafkaEndpoint, PostgresEndpoint


def test_kafka_in_executor_mode_is_refused_with_the_reason(
    kafka: KafkaEndpoint, kafka_topic: str, job_id: str, tmp_path: Path
) -> None:
    with pytest.raises(CapabilityError, match="distributed_prepare") as caught:
        durable_sink(
            "kafka",
            bootstrap_servers=kafka.bootstrap_servers,
            topic=kafka_topic,
            job_id=job_id,
            decision_store=str(tmp_path / "decisions"),
            mode="executor",
        )
    assert caught.value.sink == "kafka"
    assert caught.value.fix is not None
    assert "driver mode" in caught.value.fix


def test_a_job_whose_sinks_cannot_host_decisions_must_name_a_store(
    kafka: KafkaEndpoint, kafka_topic: str, job_id: str
) -> None:
    with pytest.raises(ConfigError, match="needs a decision store") as caught:
        durable_sink(
            "kafka", bootstrap_servers=kafka.bootstrap_servers, topic=kafka_topic, job_id=job_id
        )
    assert caught.value.fix is not None
    assert "decision_store=" in caught.value.fix


def test_two_sinks_that_cannot_resume_a_prepared_epoch_are_refused(
    kafka: KafkaEndpoint, kafka_topic: str, job_id: str, tmp_path: Path
) -> None:
    with pytest.raises(CapabilityError, match="at most one such sink"):
        durable_sink(
            [
                sink("kafka", bootstrap_servers=kafka.bootstrap_servers, topic=kafka_topic),
                sink(
                    "kafka",
                    name="kafka2",
                    bootstrap_servers=kafka.bootstrap_servers,
                    topic=kafka_topic,
                    progress_topic=f"{kafka_topic}-p2",
                ),
            ],
            job_id=job_id,
            decision_store=str(tmp_path / "decisions"),
        )


def test_a_wrong_password_is_named_without_showing_it(
    postgres: PostgresEndpoint, pg_schema: str, job_id: str
) -> None:
    wrong = "not-the-password-" + job_id[-6:]
    dsn = postgres.conninfo(password=wrong)
    with pytest.raises(DurableSinkError) as caught:
        durable_sink("postgres", dsn=dsn, table=f"{pg_schema}.events", job_id=job_id)
    text = str(caught.value)
    assert "password authentication failed" in text or "authentication" in text
    assert wrong not in text
    assert postgres.password not in text


def test_an_unreachable_server_is_a_clear_error_before_the_query_starts(
    job_id: str, tmp_path: Path
) -> None:
    with pytest.raises(DurableSinkError, match=r"127\.0\.0\.1") as caught:
        durable_sink(
            "postgres",
            dsn="host=127.0.0.1 port=1 dbname=x user=u password=secret-pw connect_timeout=2",
            table="events",
            job_id=job_id,
            decision_store=str(tmp_path / "decisions"),
        )
    assert "secret-pw" not in str(caught.value)
    assert caught.value.fix is not None


def test_executor_mode_needs_sinks_as_options_it_can_ship_to_executors(
    job_id: str, tmp_path: Path
) -> None:
    built = FileSink(FileSinkConfig(str(tmp_path / "out")))
    with pytest.raises(ConfigError, match="builds its sinks on the executors") as caught:
        durable_sink([built], job_id=job_id, mode="executor", decision_store=str(tmp_path / "d"))
    assert caught.value.fix is not None
    assert "sink(kind" in caught.value.fix
