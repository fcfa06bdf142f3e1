"""What `decision_store=` accepts. A typo'd URI scheme, a relative path or an unreadable
connection string is a ConfigError naming the mistake and the fix (a folder under the current
directory would leave a driver restarted from another directory without its decisions), and
nothing is created on disk (every test runs in an empty current directory and checks it stays
empty)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_sinks.clients.s3 import S3Connection, S3Location
from durable_sinks.core.errors import ConfigError
from durable_sinks.manifest import LocalDirectoryStore, default_store_for, store_from
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.manifest.s3 import S3DecisionStore
from durable_sinks.spark import durable_sink


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory of the test's own."""
    home = tmp_path / "cwd"
    home.mkdir()
    monkeypatch.chdir(home)
    return home


def refused(target: object, cwd: Path) -> ConfigError:
    with pytest.raises(ConfigError) as raised:
        store_from(target)  # type: ignore[arg-type]
    assert list(cwd.iterdir()) == [], "a refused decision_store created something"
    assert raised.value.fix, f"{raised.value} has no fix"
    return raised.value


@pytest.mark.parametrize(
    ("target", "message", "fix"),
    [
        (
            "postgresq://host/db",
            "has the URI scheme 'postgresq://', which no decision store uses (did you mean "
            "postgresql://?)",
            "decision_store='postgresql://host/db'",
        ),
        (
            "postgre://u@host:5432/db",
            "did you mean postgres://?",
            "decision_store='postgres://u@host:5432/db'",
        ),
        ("fil:///data/decisions", "did you mean file://?", "'file:///data/decisions'"),
        (
            "gs://bucket/decisions",
            "the schemes a decision store accepts are postgresql://, postgres://, s3://, "
            "s3a://, file://",
            "decision_store='/durable/volume/my-job'",
        ),
    ],
)
def test_an_unknown_uri_scheme_is_refused_with_the_closest_valid_one(
    target: str, message: str, fix: str, cwd: Path
) -> None:
    error = refused(target, cwd)
    assert message in error.message
    assert fix in (error.fix or "")


def test_a_password_in_a_mistyped_uri_is_not_shown(cwd: Path) -> None:
    error = refused("postgresq://orders:hunter2-secret@db.example.com/orders", cwd)
    assert "hunter2" not in str(error) + repr(error)
    assert "postgresql://orders:***@db.example.com/orders" in (error.fix or "")


@pytest.mark.parametrize(
    "target", ["decisions", "./state/decisions", "../decisions", Path("decisions")]
)
def test_a_relative_path_is_refused_with_the_absolute_path_it_meant(
    target: str | Path, cwd: Path
) -> None:
    error = refused(target, cwd)
    assert "is a relative path: it depends on the current directory" in error.message
    assert "a driver restarted from another directory would find none" in error.message
    assert f"decision_store={os.path.abspath(target)!r}" in (error.fix or "")


def test_a_home_relative_path_is_refused_with_its_expansion(cwd: Path) -> None:
    error = refused("~/decisions", cwd)
    assert "starts with '~', which is not expanded" in error.message
    assert os.path.expanduser("~/decisions") in (error.fix or "")


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("hots=db.example.com dbname=orders", 'invalid connection option "hots"'),
        ("hots=db.example.com", 'invalid connection option "hots"'),
        ("host=db dbname=orders sslmode", 'missing "=" after "sslmode"'),
    ],
)
def test_an_unreadable_connection_string_is_refused_with_libpqs_reason(
    target: str, message: str, cwd: Path
) -> None:
    """It became a folder named like the DSN (or, with a known keyword beside the typo, a
    raw psycopg.ProgrammingError at the first connection)."""
    error = refused(target, cwd)
    assert "looks like a Postgres connection string, but libpq cannot read it" in error.message
    assert message in error.message


@pytest.mark.parametrize(
    "target",
    [
        "host=p.example,s.example port=5432,5433 dbname=orders password=s3cret",
        "postgresql://u:s3cret@p.example:5432,s.example:5433/orders?target_session_attrs=any",
    ],
)
def test_several_servers_without_asking_for_the_writable_one_are_refused(
    target: str, cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq would take the first server that answers: perhaps a read-only standby."""
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    error = refused(target, cwd)
    assert "names several Postgres servers (p.example:5432,s.example:5433/orders)" in str(error)
    assert "target_session_attrs=read-write" in (error.fix or "")
    assert "s3cret" not in str(error)


def test_several_servers_asking_for_the_writable_one_are_a_postgres_store(cwd: Path) -> None:
    for attrs in ("read-write", "primary"):
        store = store_from(f"host=p,s port=5432,5433 dbname=d target_session_attrs={attrs}")
        assert isinstance(store, PostgresDecisionStore)


def test_a_file_uri_naming_a_host_is_refused(cwd: Path) -> None:
    error = refused("file://data/decisions", cwd)
    assert "names 'data'" in error.message
    assert "'file:///data/decisions'" in (error.fix or "")


@pytest.mark.parametrize("target", ["", "   ", 42, b"/data/decisions"])
def test_no_target_or_a_wrong_type_is_refused(target: object, cwd: Path) -> None:
    refused(target, cwd)


def test_valid_targets_are_accepted_and_nothing_is_created(tmp_path: Path, cwd: Path) -> None:
    for dsn in (
        "postgresql://u@h/db",
        "postgres://u:p@h:5432/db?sslmode=require",
        "host=h port=5432 dbname=d",
        "dbname=d",
    ):
        assert isinstance(store_from(dsn), PostgresDecisionStore)
    absolute = tmp_path / "decisions"
    for target in (str(absolute), absolute, f"file://{absolute}", f"file://localhost{absolute}"):
        store = store_from(target)
        assert isinstance(store, LocalDirectoryStore)
        assert store.path == absolute
    assert list(cwd.iterdir()) == []
    assert not absolute.exists()  # created by open, not by choosing the store


def test_durable_sink_refuses_a_relative_decision_store_before_anything_runs(
    tmp_path: Path, cwd: Path
) -> None:
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="is a relative path") as raised:
        durable_sink("files", path=str(out), job_id="orders", decision_store="decisions")
    assert os.path.abspath("decisions") in (raised.value.fix or "")
    assert list(cwd.iterdir()) == []
    assert not out.exists()


# -- S3 (parsing only: nothing here reaches a server) --------------------------------------------


@pytest.mark.parametrize(
    ("target", "bucket", "prefix"),
    [
        ("s3://my-bucket/jobs/decisions", "my-bucket", "jobs/decisions"),
        ("s3a://my-bucket/jobs/decisions/", "my-bucket", "jobs/decisions"),
        ("  s3://my-bucket  ", "my-bucket", ""),
        ("S3://my.bucket-1/d", "my.bucket-1", "d"),
    ],
)
def test_an_s3_location_becomes_an_s3_store(
    target: str, bucket: str, prefix: str, cwd: Path
) -> None:
    store = store_from(target)
    assert isinstance(store, S3DecisionStore)
    assert store.location == S3Location(bucket, prefix)
    assert store.connection == S3Connection()  # boto3's default chain, read when it connects
    assert store.durable
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("s3://", "is not a valid bucket name"),
        ("s3://My_Bucket/decisions", "'My_Bucket' is not a valid bucket name"),
        ("s3://bucket/a//b", "the prefix has an empty, '.' or '..' segment"),
        ("s3a://bucket/../decisions", "the prefix has an empty, '.' or '..' segment"),
    ],
)
def test_a_malformed_s3_location_is_refused(target: str, message: str, cwd: Path) -> None:
    error = refused(target, cwd)
    assert message in error.message
    assert error.message.startswith("decision_store")


def test_a_mistyped_s3_scheme_is_not_taken_for_a_folder(cwd: Path) -> None:
    error = refused("s3n://bucket/decisions", cwd)
    assert "which no decision store uses" in error.message


def test_an_s3_sinks_default_store_lives_under_its_prefix_with_its_settings(cwd: Path) -> None:
    config = {
        "path": "s3://lake/events",
        "name": "lake",
        "endpoint_url": "https://s3.example.com",
        "region": "eu-west-1",
        "access_key_id": "AKIAEXAMPLE",
        "secret_access_key": "secret-value-123",
        "addressing_style": "path",
        "connect_timeout_s": "5",
        "request_attempts": "2",
        "part_size_bytes": 8 * 1024 * 1024,  # a sink setting the store ignores
    }
    store = default_store_for("s3", config)
    assert isinstance(store, S3DecisionStore)
    assert store.location == S3Location("lake", "events/_decisions")
    assert store.connection == S3Connection(
        endpoint_url="https://s3.example.com",
        region="eu-west-1",
        access_key_id="AKIAEXAMPLE",
        secret_access_key="secret-value-123",
        addressing_style="path",
        connect_timeout_s=5.0,
        request_attempts=2,
    )
    shown = repr(store) + repr(store.connection) + store.where
    assert "secret-value-123" not in shown
    assert "s3 sink 'lake'" in store.where
    assert default_store_for("s3", {"name": "no-path"}) is None
    with pytest.raises(ConfigError, match="connect_timeout_s 'soon' is not a number"):
        default_store_for("s3", {"path": "s3://lake/events", "connect_timeout_s": "soon"})
    with pytest.raises(ConfigError, match="request_attempts 'many' is not a whole number"):
        default_store_for("s3", {"path": "s3://lake/events", "request_attempts": "many"})


@pytest.mark.parametrize("attempts", [0, 21, 2.5, True])
def test_request_attempts_outside_one_to_twenty_are_refused(attempts: object) -> None:
    with pytest.raises(ConfigError, match="request_attempts must be a whole number from 1"):
        S3Connection(request_attempts=attempts)  # type: ignore[arg-type]


def test_a_silent_s3_request_is_bounded_by_its_attempts() -> None:
    connection = S3Connection(request_timeout_s=1, connect_timeout_s=1, request_attempts=2)
    assert connection.wait_bound_s == 2 * (1 + 1) + 1  # one back-off of at most 1 s
    config = connection.client().meta.config
    names = ("retries", "tcp_keepalive", "read_timeout", "connect_timeout")
    assert {name: getattr(config, name) for name in names} == {
        "retries": {"total_max_attempts": 2, "mode": "standard"},
        "tcp_keepalive": True,
        "read_timeout": 1,
        "connect_timeout": 1,
    }
