"""The settings every Postgres session of a sink or store gets (clients/postgres.py)."""

from __future__ import annotations

from typing import Any

import pytest

from durable_sinks.clients.postgres import TCP_DEFAULTS, tcp_settings
from durable_sinks.core.errors import ConfigError
from durable_sinks.sinks.postgres import Postgres


def test_tcp_defaults_leave_what_the_dsn_or_the_environment_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGKEEPALIVESIDLE", raising=False)
    monkeypatch.delenv("PGTCPUSERTIMEOUT", raising=False)
    assert tcp_settings("host=db dbname=x") == dict(TCP_DEFAULTS)
    given = tcp_settings("postgresql://u@db/x?keepalives_idle=60&tcp_user_timeout=0")
    assert "keepalives_idle" not in given
    assert "tcp_user_timeout" not in given
    assert given["keepalives_count"] == TCP_DEFAULTS["keepalives_count"]
    monkeypatch.setenv("PGKEEPALIVESIDLE", "120")
    assert "keepalives_idle" not in tcp_settings("host=db")


@pytest.mark.parametrize("option", ["statement_timeout_s", "lock_timeout_s"])
@pytest.mark.parametrize("seconds", [0, -1, float("inf")])
def test_a_timeout_must_be_positive_or_none(option: str, seconds: float) -> None:
    options: dict[str, Any] = {option: seconds}
    with pytest.raises(ConfigError, match=f"{option} must be > 0 seconds or None"):
        Postgres("host=db", "events", **options)
    unset: dict[str, Any] = {option: None}
    Postgres("host=db", "events", **unset)
