"""Every refusal of a bad setting names the problem and carries a fix, before anything is
contacted: the sinks' configurations and the job's options, built from plain values."""

from __future__ import annotations

from typing import Any

import pytest

from durable_sinks.core.errors import ConfigError
from durable_sinks.sinks.files import FileSinkConfig
from durable_sinks.sinks.kafka import KafkaSinkConfig
from durable_sinks.sinks.postgres import PostgresSinkConfig
from durable_sinks.spark import JobOptions

POSTGRES = {"dsn": "host=127.0.0.1 port=1", "table": "t"}
KAFKA = {"bootstrap_servers": "127.0.0.1:1", "topic": "events"}


@pytest.mark.parametrize(
    ("build", "options", "message"),
    [
        (PostgresSinkConfig, {"dsn": ""}, "`dsn` is empty"),
        (PostgresSinkConfig, {"table": "a.b.c"}, "is not `table` or `schema.table`"),
        (PostgresSinkConfig, {"mode": "merge"}, "is not 'append' or 'upsert'"),
        (PostgresSinkConfig, {"mode": "upsert"}, "upsert mode needs `key`"),
        (PostgresSinkConfig, {"key": ("id",)}, "only used in upsert mode"),
        (PostgresSinkConfig, {"mode": "upsert", "key": ("a b",)}, "not a plain identifier"),
        (PostgresSinkConfig, {"meta_schema": "x;y"}, "is not an identifier"),
        (PostgresSinkConfig, {"participants_in_flight": 0}, "participants_in_flight"),
        (KafkaSinkConfig, {"topic": "bad topic"}, "not a valid topic name"),
        (KafkaSinkConfig, {"progress_topic": "events"}, "progress_topic must differ"),
        (KafkaSinkConfig, {"key_column": "id", "value_column": "id"}, "more than one role"),
        (KafkaSinkConfig, {"expected_epoch_ms": 0}, "must be > 0"),
        (
            KafkaSinkConfig,
            {"transaction_timeout_ms": 10_000, "expected_epoch_ms": 20_000},
            "must exceed",
        ),
        (KafkaSinkConfig, {"producer_config": {"acks": 1}}, "which the sink owns"),
        (KafkaSinkConfig, {"topic_partitions": 0}, "topic_partitions"),
        (KafkaSinkConfig, {"request_timeout_s": 0}, "time-outs must be > 0"),
        (FileSinkConfig, {"path": " "}, "`path` is empty"),
        (FileSinkConfig, {"path": "/tmp/x", "compression": "lzma"}, "compression"),
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
    defaults = {PostgresSinkConfig: POSTGRES, KafkaSinkConfig: KAFKA}.get(build, {})
    with pytest.raises(ConfigError, match=message) as raised:
        build(**{**defaults, **options})
    assert raised.value.fix, f"{raised.value} has no fix"
