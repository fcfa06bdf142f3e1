"""The Iceberg sink's configuration: checked when built, its secrets never shown."""

from __future__ import annotations

import pickle

import pytest

from durable_sinks.core.errors import ConfigError
from durable_sinks.sinks import create
from durable_sinks.sinks.iceberg import Iceberg
from durable_sinks.sinks.iceberg.config import redacted

CATALOG = {
    "type": "sql",
    "uri": "postgresql+psycopg://writer:s3cr3t-pw@db.example:5432/lake",
    "warehouse": "s3://lake/warehouse",
    "s3.secret-access-key": "AKIA-SECRET",
    "credential": "client:client-secret",
    "token": "bearer-token-value",
}


def test_secrets_are_hidden_in_the_repr_and_the_catalog_is_kept_whole() -> None:
    config = Iceberg(table="events", namespace="analytics", catalog=CATALOG)
    shown = repr(config)
    for secret in ("s3cr3t-pw", "AKIA-SECRET", "client-secret", "bearer-token-value"):
        assert secret not in shown
    assert "db.example" in shown
    assert config.catalog_properties()["uri"] == CATALOG["uri"]
    assert pickle.loads(pickle.dumps(config)) == config  # noqa: S301 - our own bytes
    assert config.identifier == ("analytics", "events")
    assert redacted({"uri": "http://a:b@h/x"}) == {"uri": "http://a:***@h/x"}


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"catalog": {}}, "catalog is empty"),
        ({"catalog": {"type": 1}}, "must be a string"),
        ({"table": "a.b"}, "table 'a.b' must be a plain name"),
        ({"namespace": "a..b"}, "namespace"),
        ({"commit_retries": -1}, "commit_retries"),
        ({"keep_snapshots": 0}, "keep_snapshots must be a number of snapshots"),
        ({"keep_snapshots": True}, "keep_snapshots must be an integer or None"),
        ({"partition_by": "day(a, b)"}, "partition_by entry 'day\\(a, b\\)' is not a column"),
        ({"partition_by": "bucket(id)"}, "bucket and truncate take a positive number"),
        ({"partition_by": "bucket(0, id)"}, "bucket and truncate take a positive number"),
        ({"partition_by": "week(ts)"}, "is not a column, year"),
        ({"partition_by": ["day(ts)", "days(ts)"]}, "names a field twice"),
        ({"partition_by": [3]}, "partition_by must be a list or tuple of strings"),
    ],
)
def test_bad_settings_are_refused_when_built(options: dict[str, object], complaint: str) -> None:
    settings: dict[str, object] = {"table": "events", "namespace": "ds", "catalog": CATALOG}
    with pytest.raises(ConfigError, match=complaint) as refused:
        create("iceberg", {**settings, **options})
    assert "s3cr3t-pw" not in str(refused.value)


def test_partition_fields_read_as_in_spark_sql() -> None:
    given = ["country", "day(ts)", "hours(ts)", "bucket(16, id)", " truncate( 4 ,name ) "]
    config = Iceberg(table="events", namespace="ds", catalog=CATALOG, partition_by=tuple(given))
    assert [(f.column, f.transform) for f in config.partition_fields] == [
        ("country", "identity"),
        ("ts", "day"),
        ("ts", "hour"),
        ("id", "bucket[16]"),
        ("name", "truncate[4]"),
    ]
    assert [str(f) for f in config.partition_fields] == [
        "country",
        "day(ts)",
        "hour(ts)",
        "bucket(16, id)",
        "truncate(4, name)",
    ]
