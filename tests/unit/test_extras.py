"""A sink or decision store whose client library is not installed: a ConfigError naming the
extra to install, raised when it is asked for, before anything is written; other import
errors pass through; DSNs are never shown without psycopg.

A client is made missing here by a `None` entry in `sys.modules` (how Python marks a module
that must not be imported); tests/unit/test_without_a_client.py runs the same in a
virtualenv that really lacks confluent-kafka.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from durable_sinks import durable_sink, sink, sinks
from durable_sinks.cli import main
from durable_sinks.clients.postgres import connection_failure, connection_lost, server_of
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.extras import (
    EXTRAS,
    install_command,
    missing_client,
    needs_extra,
    require_extra,
)
from durable_sinks.core.redaction import UNREAD_DSN, redact
from durable_sinks.manifest import LocalDirectoryStore, default_store_for, store_from

PASSWORD = "hunter2-secret"
DSN = f"postgresql://writer:{PASSWORD}@db.example:5433/orders"
KAFKA = {"bootstrap_servers": "localhost:9092", "topic": "events"}


def _without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make `modules` unimportable for the test, as if they were not installed."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def _missing(name: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(f"No module named {name!r}", name=name)


# -- the helper --------------------------------------------------------------------------------


def test_the_client_or_one_of_its_submodules_is_recognised() -> None:
    assert missing_client(_missing("confluent_kafka"), "kafka") == "confluent_kafka"
    assert missing_client(_missing("confluent_kafka.admin"), "kafka") == "confluent_kafka"
    assert missing_client(_missing("orjson"), "kafka") == "orjson"
    assert missing_client(_missing("botocore.exceptions"), "s3") == "botocore"
    # Another extra's client, a name that only starts alike, or no name at all: not ours.
    assert missing_client(_missing("psycopg"), "kafka") is None
    assert missing_client(_missing("psycopg_pool"), "postgres") is None
    assert missing_client(_missing("confluent_kafka_extra"), "kafka") is None
    assert missing_client(ModuleNotFoundError("no name"), "kafka") is None


def test_a_missing_client_becomes_a_config_error_naming_the_extra() -> None:
    cause = _missing("confluent_kafka.admin")
    with pytest.raises(ConfigError) as caught, needs_extra("kafka", "the kafka sink", job="j"):
        raise cause
    error = caught.value
    assert "the kafka sink needs the confluent_kafka module (confluent-kafka)" in error.message
    assert error.fix is not None
    assert error.fix.startswith("pip install 'durable-sinks[kafka]'")
    assert error.job == "j"
    assert error.__cause__ is cause


@pytest.mark.parametrize(
    "error",
    [
        _missing("psycopg"),  # the kafka sink does not install it: a bug, not a missing extra
        _missing("numpy"),
        ModuleNotFoundError("No module named 'x'"),  # no name
        ImportError("cannot import name 'Producer' from 'confluent_kafka'", name="confluent_kafka"),
        ValueError("not an import error"),
    ],
    ids=["other-extra", "base-dependency", "unnamed", "import-error", "value-error"],
)
def test_other_errors_pass_through_unchanged(error: Exception) -> None:
    with pytest.raises(type(error)) as caught, needs_extra("kafka", "the kafka sink"):
        raise error
    assert caught.value is error


def test_require_extra_imports_every_module_of_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for extra in EXTRAS:
        require_extra(extra, f"the {extra} sink")  # the dev install has every extra
    _without(monkeypatch, "orjson")
    with pytest.raises(ConfigError, match=r"needs the orjson module \(orjson\)") as caught:
        require_extra("kafka", "the kafka sink")
    assert install_command("kafka") in str(caught.value)


def test_an_unknown_extra_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="no extra named 'kafak'"), needs_extra("kafak", "x"):
        pass


# -- every way of asking for a sink ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "config", "client"),
    [
        ("kafka", KAFKA, "confluent_kafka"),
        ("postgres", {"dsn": DSN, "table": "events"}, "psycopg"),
        ("postgres", {"dsn": DSN, "table": "events"}, "pgpq"),
        ("s3", {"path": "s3://bucket/prefix"}, "boto3"),
        ("delta", {"path": "/tmp/delta-table"}, "deltalake"),
        ("iceberg", {"table": "t", "namespace": "n", "catalog": {"type": "sql"}}, "pyiceberg"),
    ],
)
def test_a_sink_without_its_client_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, kind: str, config: dict[str, str], client: str
) -> None:
    _without(monkeypatch, client)
    fix = f"pip install 'durable-sinks[{kind}]'"
    for ask in (
        lambda: sinks.create(kind, config),
        lambda: sinks.config_class_of(kind),
        lambda: sink(kind, **config),
        lambda: durable_sink(kind, job_id="orders", decision_store="/tmp/decisions", **config),
    ):
        with pytest.raises(ConfigError) as caught:
            ask()
        assert client in caught.value.message
        assert fix in str(caught.value)
        assert PASSWORD not in str(caught.value)


def test_the_files_sink_needs_no_client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _without(monkeypatch, *(m for modules in EXTRAS.values() for m in modules))
    assert sinks.create("files", {"path": str(tmp_path)}).name == "files"
    assert sink("files", path=str(tmp_path), name="out").name == "out"
    assert isinstance(store_from(str(tmp_path / "decisions")), LocalDirectoryStore)


# -- decision stores ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "client", "extra"),
    [
        (DSN, "psycopg", "postgres"),
        (f"host=db.example user=writer password={PASSWORD}", "psycopg", "postgres"),
        ("s3://bucket/decisions", "boto3", "s3"),
        ("s3a://bucket/decisions", "botocore", "s3"),
    ],
    ids=["postgres-uri", "postgres-keywords", "s3-boto3", "s3-botocore"],
)
def test_a_decision_store_without_its_client_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, target: str, client: str, extra: str
) -> None:
    _without(monkeypatch, client)
    with pytest.raises(ConfigError) as caught:
        store_from(target, job="orders")
    store = "a Postgres decision store" if extra == "postgres" else "an S3 decision store"
    assert caught.value.message.startswith(f"{store} needs the {client} module")
    assert f"pip install 'durable-sinks[{extra}]'" in str(caught.value)
    assert caught.value.job == "orders"
    assert PASSWORD not in str(caught.value)


def test_a_default_store_without_its_client_names_its_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without(monkeypatch, "psycopg", "botocore")
    with pytest.raises(ConfigError, match=r"durable-sinks\[postgres\]"):
        default_store_for("postgres", {"dsn": DSN, "table": "events"})
    with pytest.raises(ConfigError, match=r"durable-sinks\[s3\]"):
        default_store_for("s3", {"path": "s3://bucket/prefix"})
    assert default_store_for("files", {"path": "/tmp/x"}) is None


# -- the command line --------------------------------------------------------------------------


def test_the_command_line_reports_the_missing_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _without(monkeypatch, "confluent_kafka")
    options = ["-o", "bootstrap_servers=localhost:9092", "-o", "topic=events"]
    store = ["--store", str(tmp_path / "decisions")]
    for command in ("status", "doctor"):
        result = CliRunner().invoke(main, [command, "orders", "--kind", "kafka", *options, *store])
        assert result.exit_code in (1, 2), result.output
        assert "pip install 'durable-sinks[kafka]'" in result.output, result.output
        assert "confluent_kafka" in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_the_command_line_reports_a_store_without_its_client(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _without(monkeypatch, "psycopg")
    result = CliRunner().invoke(
        main, ["status", "orders", "--kind", "files", "-o", f"path={tmp_path}", "--store", DSN]
    )
    assert result.exit_code == 2, result.output
    assert "pip install 'durable-sinks[postgres]'" in result.output
    assert PASSWORD not in result.output


# -- DSNs without psycopg ----------------------------------------------------------------------


def test_without_psycopg_no_part_of_a_dsn_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "psycopg", "psycopg.conninfo")
    for dsn in (DSN, f"host=db user=writer password={PASSWORD}", "not a dsn at all"):
        assert redact(dsn) == UNREAD_DSN
        assert PASSWORD not in server_of(dsn)
        assert PASSWORD not in str(connection_failure("timeout expired", dsn))
    assert redact({"sasl.password": PASSWORD, "acks": "all"}) == {
        "sasl.password": "***",
        "acks": "all",
    }
    assert connection_lost(OSError("connection reset")) is False


def test_with_psycopg_a_dsn_is_shown_without_its_password() -> None:
    shown = redact(DSN)
    assert PASSWORD not in shown
    assert "db.example" in shown
    assert server_of(DSN) == "db.example:5433/orders"


@pytest.mark.parametrize(
    "dsn",
    [
        f"host=p.example,s.example port=5432,5433 user=w password={PASSWORD} "
        "target_session_attrs=read-write",
        f"postgresql://writer:{PASSWORD}@p.example:5432,s.example:5433/orders"
        "?target_session_attrs=read-write",
    ],
)
def test_a_dsn_naming_a_primary_and_its_standby_is_shown_without_its_password(dsn: str) -> None:
    shown = redact(dsn)
    assert PASSWORD not in shown
    assert "p.example,s.example" in shown
    assert "target_session_attrs=read-write" in shown
    assert PASSWORD not in str(connection_failure("connection refused", dsn))
    assert server_of(dsn).startswith("p.example:5432,s.example:5433/")
