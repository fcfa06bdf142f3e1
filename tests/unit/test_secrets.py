"""`${env:NAME}` / `${file:/path}` references (core/secrets.py): resolved where a client is
made, checked when the settings are built, never shown."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from durable_sinks.clients.s3 import S3Connection
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.secrets import resolve, resolve_settings
from durable_sinks.sinks.kafka import Kafka
from durable_sinks.sinks.postgres import Postgres

SECRET = "pa$$-w0rd}{with:odd"


def test_env_and_file_references_resolve(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DS_TEST_SECRET", SECRET)
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    assert resolve("${env:DS_TEST_SECRET}", "x") == SECRET
    assert resolve(f"${{file:{secret_file}}}", "x") == SECRET  # the trailing newline dropped
    assert resolve(f"user=a password=${{file:{secret_file}}} host=h", "x") == (
        f"user=a password={SECRET} host=h"
    )
    assert resolve_settings({"sasl.password": "${env:DS_TEST_SECRET}", "n": 3}, "x") == {
        "sasl.password": SECRET,
        "n": 3,
    }
    assert resolve("no reference here", "x") == "no reference here"


def test_an_unset_variable_or_unreadable_file_names_the_reference(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DS_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError, match=r"DS_TEST_UNSET .*is not set") as unset:
        resolve("${env:DS_TEST_UNSET}", "kafka sink 'k': producer_config['sasl.password']")
    assert "producer_config['sasl.password']" in str(unset.value)
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="cannot read the secret file") as unreadable:
        resolve(f"${{file:{missing}}}", "S3: secret_access_key")
    assert str(missing) in str(unreadable.value)


def test_settings_keep_the_reference_and_are_refused_when_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The settings objects hold the reference (so reprs and pickles hold no secret); a
    reference that cannot be resolved on the driver is refused when they are built."""
    monkeypatch.setenv("DS_TEST_SECRET", SECRET)
    kafka = Kafka(
        "broker:9092", "events", producer_config={"sasl.password": "${env:DS_TEST_SECRET}"}
    )
    assert kafka.connection_settings().get("sasl.password") == SECRET
    assert SECRET.encode() not in pickle.dumps(kafka)
    assert SECRET not in repr(kafka)
    pg = Postgres("host=db user=u password=${env:DS_TEST_SECRET}", "public.events")
    assert SECRET.encode() not in pickle.dumps(pg)
    s3 = S3Connection(access_key_id="${env:DS_TEST_SECRET}", secret_access_key="k")
    assert SECRET not in repr(s3)
    monkeypatch.delenv("DS_TEST_SECRET")
    with pytest.raises(ConfigError, match="DS_TEST_SECRET"):
        Kafka("broker:9092", "events", producer_config={"sasl.password": "${env:DS_TEST_SECRET}"})
    with pytest.raises(ConfigError, match="DS_TEST_SECRET"):
        Postgres("host=db user=u password=${env:DS_TEST_SECRET}", "public.events")
    with pytest.raises(ConfigError, match="DS_TEST_SECRET"):
        S3Connection(access_key_id="a", secret_access_key="${env:DS_TEST_SECRET}")


def test_the_arrow_s3_settings_resolve_secret_references(monkeypatch: pytest.MonkeyPatch) -> None:
    """`committed_dataset` and the Delta sink hand pyarrow the resolved keys, not the `${env:}`
    text (the reader did)."""
    from durable_sinks.clients.s3 import S3Connection

    monkeypatch.setenv("DS_TEST_KEY_ID", "key-id")
    monkeypatch.setenv("DS_TEST_SECRET", "the-secret")
    connection = S3Connection(
        access_key_id="${env:DS_TEST_KEY_ID}", secret_access_key="${env:DS_TEST_SECRET}"
    )
    settings = connection.arrow_settings()
    assert (settings["access_key"], settings["secret_key"]) == ("key-id", "the-secret")
    assert "session_token" not in settings
