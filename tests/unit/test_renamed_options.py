"""One name and one unit per idea: durations in seconds (`*_s`), sizes in bytes (`*_bytes`),
upsert spelt `upsert`. Each older spelling in core/settings.py's RENAMED still works, through
every way a sink is given (by kind, typed, a job file, the data source's string options),
converted to the current name and unit with a DeprecatedOptionWarning naming both; the old
and the current name together is a ConfigError. Nothing here connects."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from durable_sinks import S3, Delta, DeprecatedOptionWarning, Kafka, Postgres, durable_sink, sink
from durable_sinks.cli._jobfile import specs_of
from durable_sinks.coordinator import RetryPolicy
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.s3 import S3Connection
from durable_sinks.core.settings import RENAMED, RenamedOption
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks import create
from durable_sinks.spark._datasource import parse_options

DSN = "host=127.0.0.1 port=1 dbname=x user=u password=hunter2-secret"
MiB = 1024 * 1024
#: The options each kind needs besides the renamed one.
BASE: dict[str, dict[str, Any]] = {
    "postgres": {"dsn": DSN, "table": "events"},
    "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "events"},
    "s3": {"path": "s3://lake/events"},
    "delta": {"path": "/tmp/delta-events"},
}
#: Each renamed option: the kind, the old name and a value, the new name and its value.
RENAMES = [
    ("postgres", "connect_timeout", 5, "connect_timeout_s", 5),
    ("kafka", "transaction_timeout_ms", 90_000, "transaction_timeout_s", 90.0),
    ("kafka", "expected_epoch_ms", 20_000, "expected_epoch_s", 20.0),
    ("s3", "connect_timeout", 5, "connect_timeout_s", 5),
    ("s3", "read_timeout", 30, "read_timeout_s", 30),
    ("s3", "part_size", 16 * MiB, "part_size_bytes", 16 * MiB),
    ("s3", "max_object_bytes", 512 * MiB, "max_file_bytes", 512 * MiB),
    ("s3", "recovery_window_days", 3, "recovery_window_s", 3 * 86_400),
    ("delta", "connect_timeout", 5, "connect_timeout_s", 5),
    ("delta", "read_timeout", 30, "read_timeout_s", 30),
]
IDS = [f"{kind}.{old}" for kind, old, *_ in RENAMES]
CLASSES: dict[str, Any] = {"postgres": Postgres, "kafka": Kafka, "s3": S3, "delta": Delta}


def test_every_renamed_sink_option_is_tested_here() -> None:
    listed = {
        (kind, r.old)
        for kind, table in RENAMED.items()
        for r in table
        if isinstance(r, RenamedOption)
    }
    elsewhere = {
        ("job", "mode"),  # tests/unit/test_spark_options.py
        ("postgres_store", "connect_timeout"),
        ("s3_connection", "connect_timeout"),
        ("s3_connection", "read_timeout"),
        ("retry_policy", "max_seconds"),
        ("retry_policy", "first_wait"),
        ("retry_policy", "max_wait"),
    }
    assert listed - elsewhere == {(k, o) for k, o, *_ in RENAMES}


@pytest.mark.parametrize(("kind", "old", "value", "new", "converted"), RENAMES, ids=IDS)
def test_an_old_name_works_with_a_warning_naming_both(
    kind: str, old: str, value: Any, new: str, converted: Any
) -> None:
    with pytest.warns(
        DeprecatedOptionWarning, match=rf"option {old} is deprecated: write {new}"
    ) as caught:
        spec = sink(kind, **BASE[kind], **{old: value})
    assert caught[0].filename == __file__  # the caller's line, where the fix goes
    with pytest.warns(DeprecatedOptionWarning) as caught:
        create(kind, {**BASE[kind], old: value})
    assert caught[0].filename == __file__
    assert spec.config == {**BASE[kind], new: converted}
    assert spec == sink(kind, **BASE[kind], **{new: converted})
    with warnings.catch_warnings():  # the spec holds the current names: no second warning
        warnings.simplefilter("error")
        spec.build()


@pytest.mark.parametrize(("kind", "old", "value", "new", "converted"), RENAMES, ids=IDS)
def test_the_typed_configuration_takes_the_old_name_at_run_time(
    kind: str, old: str, value: Any, new: str, converted: Any
) -> None:
    """A type checker refuses the older name (the class declares only the current one); run
    as it is, the constructor rewrites it as the string form does."""
    cls = CLASSES[kind]
    with pytest.warns(
        DeprecatedOptionWarning, match=rf"option {old} is deprecated: write {new}"
    ) as caught:
        config = cls(**BASE[kind], **{old: value})
    assert caught[0].filename == __file__
    assert config == cls(**BASE[kind], **{new: converted})
    with pytest.raises(ConfigError, match=f"{old} and {new} are the same option"):
        cls(**BASE[kind], **{old: value, new: converted})


@pytest.mark.parametrize(("kind", "old", "value", "new", "converted"), RENAMES, ids=IDS)
def test_an_old_and_a_new_name_together_are_refused(
    kind: str, old: str, value: Any, new: str, converted: Any
) -> None:
    with pytest.raises(ConfigError, match=f"{old} and {new} are the same option") as raised:
        sink(kind, **BASE[kind], **{old: value, new: converted})
    assert f"give only {new}=" in (raised.value.fix or "")


def test_a_unit_conversion_is_named_in_the_warning() -> None:
    with pytest.warns(DeprecatedOptionWarning) as caught:
        sink("kafka", **BASE["kafka"], transaction_timeout_ms=90_000)
    assert "milliseconds -> seconds, divided by 1000" in str(caught[0].message)
    with pytest.warns(DeprecatedOptionWarning) as caught:
        sink("s3", **BASE["s3"], recovery_window_days=3)
    assert "days -> seconds, multiplied by 86400" in str(caught[0].message)


def test_delta_merge_is_upsert_typed_and_by_kind(tmp_path: Path) -> None:
    with pytest.warns(
        DeprecatedOptionWarning, match="mode='merge' is deprecated: write mode='upsert'"
    ):
        typed = Delta(path=str(tmp_path / "t"), mode="merge", key=("id",))  # type: ignore[arg-type]
    assert typed.mode == "upsert"
    with pytest.warns(DeprecatedOptionWarning, match="mode='upsert'"):
        spec = sink("delta", path=str(tmp_path / "t"), mode="merge", key="id")
    assert spec.config["mode"] == "upsert"
    # The one-sink form of durable_sink, built and started for real (a local table).
    with pytest.warns(DeprecatedOptionWarning, match="mode='upsert'"):
        writer = durable_sink(
            "delta",
            path=str(tmp_path / "w"),
            mode="merge",
            key="id",
            create_table=True,
            job_id="orders",
            decision_store=str(tmp_path / "decisions"),
        )
    try:
        assert writer.specs[0].name == "delta"
        assert writer.specs[0].config["mode"] == "upsert"  # type: ignore[union-attr]
    finally:
        writer.close()


def test_a_job_file_and_the_data_source_accept_old_names() -> None:
    with pytest.warns(DeprecatedOptionWarning, match="write max_file_bytes"):
        specs, _ = specs_of(
            {
                "job_id": "orders",
                "sinks": [{"kind": "s3", **BASE["s3"], "max_object_bytes": 512 * MiB}],
            }
        )
    assert specs[0].config["max_file_bytes"] == 512 * MiB
    with pytest.warns(DeprecatedOptionWarning, match="write transaction_timeout_s"):
        specs, _ = parse_options(
            {
                "kind": "kafka",
                "job_id": "orders",
                **BASE["kafka"],
                "transaction_timeout_ms": "90000",
            }
        )
    assert specs[0].config["transaction_timeout_s"] == 90.0


def test_the_postgres_decision_store_takes_its_old_name() -> None:
    with pytest.warns(DeprecatedOptionWarning, match="write connect_timeout_s"):
        store = PostgresDecisionStore(DSN, connect_timeout=4)  # type: ignore[call-arg]
    assert store.connect_timeout_s == 4
    with pytest.raises(ConfigError, match="same option"):
        PostgresDecisionStore(DSN, connect_timeout=4, connect_timeout_s=4)  # type: ignore[call-arg]


def test_the_s3_connection_takes_its_old_names() -> None:
    with pytest.warns(DeprecatedOptionWarning, match="S3Connection: option read_timeout"):
        connection = S3Connection(read_timeout=5)  # type: ignore[call-arg]
    assert connection == S3Connection(read_timeout_s=5)


def test_the_commit_retry_policy_takes_its_old_names() -> None:
    with pytest.warns(DeprecatedOptionWarning) as caught:
        policy = RetryPolicy(3, max_seconds=5, first_wait=0.01, max_wait=1)  # type: ignore[call-arg]
    assert sorted(str(w.message) for w in caught) == [
        f"RetryPolicy: option {old} is deprecated: write {new}"
        for old, new in (
            ("first_wait", "first_wait_s"),
            ("max_seconds", "tolerance_s"),
            ("max_wait", "max_wait_s"),
        )
    ]
    assert policy == RetryPolicy(3, tolerance_s=5, first_wait_s=0.01, max_wait_s=1)
    assert RetryPolicy() == RetryPolicy(8, 10.0, 0.05, 5.0)
    with pytest.raises(ConfigError, match="max_wait and max_wait_s are the same option"):
        RetryPolicy(max_wait=1, max_wait_s=2)  # type: ignore[call-arg]


def test_python_shows_the_warning_by_default(tmp_path: Path) -> None:
    """A FutureWarning: shown without any warning filter set, unlike a DeprecationWarning."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from durable_sinks import sink; sink('s3', path='s3://lake/events', part_size=2**24)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "DeprecatedOptionWarning: s3 sink 's3': option part_size is deprecated" in done.stderr
