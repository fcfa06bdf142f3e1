"""The progress topic's keys of a job with no decision store: a generation claim shares the
sink's transactional.id and is read back as the newest of the fence and generation records."""

from __future__ import annotations

import pytest

from durable_sinks.core import DecisionHost, DecisionHostingSink
from durable_sinks.core.errors import ManifestCorruptError
from durable_sinks.sinks.kafka import Kafka, KafkaDecisionHost, KafkaSink
from durable_sinks.sinks.kafka.progress import (
    encode_fence,
    fence_holder,
    fence_key,
    generation_key,
    progress_key,
    transactional_id,
)


def test_keys_of_one_job_and_sink_differ_and_share_their_owner() -> None:
    keys = {progress_key("orders", "kafka"), fence_key("orders", "kafka")}
    keys.add(generation_key("orders", "kafka"))
    assert len(keys) == 3
    assert generation_key("orders", "kafka") != generation_key("orders", "kafka2")
    assert generation_key("orders", "kafka") != generation_key("orders2", "kafka")
    assert transactional_id("orders", "kafka") == "ds:orders:kafka"


def test_the_fence_holder_is_the_newest_generation_found() -> None:
    found = {
        fence_key("j", "s"): (7, encode_fence(5)),
        generation_key("j", "s"): (3, encode_fence(6)),
    }
    assert fence_holder("progress", found) == 6
    assert fence_holder("progress", {}) is None
    with pytest.raises(ManifestCorruptError, match="progress@9"):
        fence_holder("progress", {fence_key("j", "s"): (9, b"not json")})


def test_a_kafka_sink_offers_a_host_of_its_own_built_from_its_configuration() -> None:
    config = Kafka("127.0.0.1:1", "orders", name="out")
    sink = KafkaSink(config)  # connects to nothing until used
    assert isinstance(sink, DecisionHostingSink)
    host = sink.decision_host()
    assert isinstance(host, KafkaDecisionHost)
    assert isinstance(host, DecisionHost)
    assert host.sink == "out"
    assert host.config is config
    host.close()  # nothing was opened: nothing to release
