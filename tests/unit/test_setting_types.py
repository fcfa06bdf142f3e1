"""Settings of the wrong type or with a misspelt name are refused when `durable_sink(...)` or
`sink(...)` is called, before anything connects: the message names the setting, the type
given and the type wanted, or the closest valid name. (Before, `table=123` raised an
AttributeError, `create_table="false"` was accepted as true, `connect_timeout_s="abc"` escaped
as psycopg's ProgrammingError, and `tabel=` gave a dataclass `__init__()` message.)

The DSN points at a closed port: had anything tried to connect, the error would differ."""

from __future__ import annotations

from typing import Any

import pytest

from durable_sinks import ConfigError, durable_sink, sink
from durable_sinks.core.settings import from_strings
from durable_sinks.sinks.kafka import Kafka
from durable_sinks.sinks.postgres import Postgres
from durable_sinks.spark import JobOptions

DSN = "host=127.0.0.1 port=1 dbname=x user=u password=sekrit-pw"


@pytest.mark.parametrize(
    ("options", "message", "fix"),
    [
        ({"table": 123}, "table must be a string, not int 123", "write table='...'"),
        (
            {"table": "t", "create_table": "false"},
            "create_table must be True or False, not str 'false'",
            "create_table=True (a Python bool, not a string)",
        ),
        (
            {"table": "t", "connect_timeout_s": "abc"},
            "connect_timeout_s must be a number or None, not str 'abc'",
            "connect_timeout_s=30.0",
        ),
        (
            {"table": "t", "participants_in_flight": True},
            "participants_in_flight must be an integer, not bool True",
            "participants_in_flight=10",
        ),
        (
            {"table": "t", "mode": "upsert", "key": ["id", 7]},
            "key must be a list or tuple of strings",
            "key=('a', 'b')",
        ),
        (
            {"table": "t", "tabel": "u"},
            "unknown option 'tabel'; did you mean 'table'?",
            "write table=...",
        ),
        (
            {"table": "t", "retain_epoch": 5},
            "unknown option 'retain_epoch'; did you mean 'retain_epochs'?",
            "write retain_epochs=...",
        ),
        ({"table": "t", "one_phase": "no"}, "one_phase must be True or False, not str 'no'", ""),
        (
            {"table": "t", "max_rows_in_memory": 1.5},
            "max_rows_in_memory must be an integer, not float 1.5",
            "",
        ),
    ],
)
def test_one_sink_options_of_the_wrong_type_or_name_are_named(
    options: dict[str, Any], message: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        durable_sink("postgres", dsn=DSN, job_id="orders", **options)
    assert message in caught.value.message
    assert fix in (caught.value.fix or "")
    assert "sekrit-pw" not in str(caught.value)


def test_a_misspelt_or_mistyped_job_id_is_named() -> None:
    with pytest.raises(ConfigError, match="needs job_id; it got 'jobid'") as caught:
        durable_sink("postgres", dsn=DSN, table="t", jobid="orders")
    assert caught.value.fix == "write job_id= instead of jobid="
    with pytest.raises(ConfigError, match="job_id must be a string, not int 123"):
        durable_sink("postgres", dsn=DSN, table="t", job_id=123)


def test_sink_options_in_a_list_are_checked_the_same_way() -> None:
    with pytest.raises(ConfigError, match="unknown option 'tabel'; did you mean 'table'"):
        sink("postgres", dsn=DSN, tabel="t")
    with pytest.raises(ConfigError, match="header_columns must be a list or tuple of strings"):
        sink("kafka", bootstrap_servers="127.0.0.1:1", topic="t", header_columns=[1])
    with pytest.raises(ConfigError, match="missing required option 'bootstrap_servers'"):
        sink("kafka", topic="t")
    with pytest.raises(ConfigError, match="fsync must be True or False, not str 'yes'"):
        sink("files", path="/tmp/x", fsync="yes")
    with pytest.raises(ConfigError, match="job_id is a job option, not a postgres sink's"):
        sink("postgres", dsn=DSN, table="t", job_id="orders")
    with pytest.raises(ConfigError, match="no sink kind 'postgress'") as caught:
        sink("postgress", dsn=DSN, table="t")
    assert caught.value.fix == "write 'postgres'"


def test_a_secret_of_the_wrong_type_is_not_shown() -> None:
    with pytest.raises(ConfigError) as caught:
        sink("postgres", dsn=b"password=sekrit-pw", table="t")
    assert "dsn must be a string, not bytes" in str(caught.value)
    assert "sekrit" not in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        sink(
            "kafka",
            bootstrap_servers="127.0.0.1:1",
            topic="t",
            producer_config={"sasl.password": b"sekrit-pw", "linger.ms": 5},
        )
    assert "producer_config['sasl.password'] must be" in str(caught.value)
    assert "sekrit" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"producer_config\['linger.ms'\] must be .*, not list"):
        sink("kafka", bootstrap_servers="127.0.0.1:1", topic="t", producer_config={"linger.ms": []})


def test_spark_string_options_are_read_as_the_declared_types() -> None:
    read = from_strings(
        Postgres,
        {"table": "123", "create_table": "true", "connect_timeout_s": "5", "key": "a,b"},
    )
    assert read == {
        "table": "123",
        "create_table": True,
        "connect_timeout_s": 5,
        "key": ("a", "b"),
    }
    read = from_strings(Kafka, {"request_timeout_s": "2.5", "value_column": "None"})
    assert read == {"request_timeout_s": 2.5, "value_column": "None"}
    read = from_strings(JobOptions, {"one_phase": "false", "retain_epochs": "7"})
    assert read == {"one_phase": False, "retain_epochs": 7}
    # What does not read as its type stays a string, and the check then names it.
    assert from_strings(Postgres, {"create_table": "maybe"}) == {"create_table": "maybe"}
