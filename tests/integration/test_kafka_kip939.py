"""The KIP-939 probe against the test bed's broker (Kafka 4.3.1): what it reports is what the
broker is, read independently (librdkafka's own ApiVersions log, the admin client's describe
of the broker's settings), at the sink's start (one INFO line) and in `durable-sinks doctor`
(an informational line that never fails it)."""

from __future__ import annotations

import json
import logging
import re
from importlib.metadata import version as distribution_version
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import libversion
from confluent_kafka.admin import AdminClient, ConfigResource

from durable_sinks.cli import main
from durable_sinks.core.protocol import OpenContext
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.kafka.kip939 import (
    INIT_PRODUCER_ID_KEY,
    KIP939_INIT_PRODUCER_ID_VERSION,
    TWO_PHASE_SETTING,
    broker_api_versions,
)
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint


def librdkafkas_init_producer_id_range(kafka: KafkaEndpoint) -> tuple[int, int]:
    """InitProducerId's versions as librdkafka itself logs the broker's ApiVersions answer
    (`debug=feature`): read without the probe's code."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    log = logging.getLogger("kip939-independent")
    log.addHandler(Collect())
    log.setLevel(logging.DEBUG)
    settings: dict[str, Any] = {**kafka.config(), "debug": "feature", "logger": log}
    admin = AdminClient(settings)
    admin.list_topics(timeout=10)
    admin.poll(0.2)
    pattern = re.compile(r"ApiKey InitProducerId \(22\) Versions (\d+)\.\.(\d+)")
    found = [m for m in map(pattern.search, lines) if m is not None]
    assert found, f"librdkafka logged no InitProducerId versions: {lines[:20]}"
    return int(found[0].group(1)), int(found[0].group(2))


def brokers_two_phase_setting(admin: AdminClient) -> str | None:
    node = admin.describe_cluster(request_timeout=10).result().nodes[0]
    resource = ConfigResource(ConfigResource.Type.BROKER, str(node.id))
    entry = admin.describe_configs([resource])[resource].result(timeout=10).get(TWO_PHASE_SETTING)
    return None if entry is None else str(entry.value)


def test_the_probe_reports_what_the_broker_is(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    unique: UniqueNames,
    topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    low, high = librdkafkas_init_producer_id_range(kafka)
    setting = brokers_two_phase_setting(admin)
    host, port = kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
    _, versions = broker_api_versions([(host, int(port))], "plaintext", 5.0)
    assert versions[INIT_PRODUCER_ID_KEY] == (low, high)

    sink = KafkaSink(Kafka(kafka.bootstrap_servers, topic))
    try:
        with caplog.at_level(logging.INFO, logger="durable_sinks.sinks.kafka"):
            sink.open(OpenContext(unique.job_id, "kafka", 1))
        lines = [r for r in caplog.records if "KIP-939" in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in lines]
        assert lines[0].levelno == logging.INFO
        line = lines[0].getMessage()
        # what the broker is, as read independently above
        versions_yes = high >= KIP939_INIT_PRODUCER_ID_VERSION
        setting_yes = setting is not None and setting.lower() == "true"
        expected = "yes" if versions_yes and setting_yes else "no"
        assert f"cluster {expected} (" in line
        assert f"advertises InitProducerId up to v{high}, KIP-939 needs v6" in line
        assert (f"{TWO_PHASE_SETTING}={setting}" if setting is not None else "no setting") in line
        assert (
            f"client no (confluent-kafka {distribution_version('confluent-kafka')} (librdkafka"
            in line
        )
        assert f"librdkafka {libversion()[0]}" in line
        assert "the sink does not build on them" in line
    finally:
        sink.close()


def test_doctor_shows_the_probe_as_information(
    kafka: KafkaEndpoint, topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    """An informational line: doctor passes whatever the probe finds."""
    ran = KafkaSink(Kafka(kafka.bootstrap_servers, topic))  # the job ran once: its topics exist
    ran.open(OpenContext(unique.job_id, "kafka", 1))
    ran.close()
    job_file = tmp_path / "job.json"
    sinks = [{"kind": "kafka", "bootstrap_servers": kafka.bootstrap_servers, "topic": topic}]
    job_file.write_text(json.dumps({"job_id": unique.job_id, "sinks": sinks}))
    result = CliRunner().invoke(main, ["doctor", unique.job_id, "-f", str(job_file), "--read-only"])
    assert result.exit_code == 0, result.output
    info = [line for line in result.output.splitlines() if line.startswith("info    ")]
    assert len(info) == 1, result.output
    assert "info    kafka sink 'kafka': KIP-939 two-phase Kafka transactions: cluster" in info[0]
    assert "doctor: every check passed" in result.output
