"""The cluster is a real Postgres with two-phase commit: a prepared transaction is invisible,
survives a crash of the server, and COMMIT PREPARED applies it afterwards."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint, Testbed
from tests.services._layout import PostgresPorts
from tests.services._process import port_is_free
from tests.services.postgres import Postgres


@pytest.fixture
def crashable_postgres(testbed: Testbed, tmp_path: Path) -> Iterator[Postgres]:
    """A cluster of this test's own, made like the test bed's: crashing the shared one would
    break every test that runs beside this one (pytest-xdist) with "the database system is not
    yet accepting connections" while it recovers."""
    base = testbed.layout.postgres.port + 10
    port = next((p for p in range(base, base + 100) if port_is_free(p)), None)
    assert port is not None, f"no free port in {base}..{base + 99} for a private Postgres"
    layout = dataclasses.replace(testbed.layout, root=tmp_path, postgres=PostgresPorts(port))
    server = Postgres(layout)
    try:
        server.up()
        yield server
    finally:
        server.reset()


def test_settings_for_two_phase_commit(postgres: PostgresEndpoint) -> None:
    with psycopg.connect(postgres.conninfo()) as conn:
        settings: dict[str, str] = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('max_prepared_transactions', 'fsync', 'listen_addresses')"
            ).fetchall()
        )
    assert int(settings["max_prepared_transactions"]) >= 64
    assert settings["fsync"] == "on"
    assert settings["listen_addresses"] == "127.0.0.1"


def test_password_is_required(postgres: PostgresEndpoint) -> None:
    wrong = PostgresEndpoint(postgres.host, postgres.port, postgres.user, "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong.conninfo())


def test_prepared_transaction_is_invisible_and_survives_a_crash(
    crashable_postgres: Postgres, unique: UniqueNames
) -> None:
    postgres = crashable_postgres.endpoint()
    table = "public.events"
    gid = unique.name("ds-testbed")
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, body text NOT NULL)")

    writer = psycopg.connect(postgres.conninfo())
    writer.execute(f"INSERT INTO {table} SELECT g, 'row ' || g FROM generate_series(1, 100) g")
    writer.execute(
        sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid))
    )  # ends the transaction on this session
    with psycopg.connect(postgres.conninfo(), autocommit=True) as reader:
        assert reader.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    writer.close()

    crashable_postgres.crash()  # SIGKILL postmaster and backends: no shutdown checkpoint
    crashable_postgres.up()

    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        prepared = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid = %s", (gid,)
        ).fetchall()
        assert prepared == [(gid,)]
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
        assert conn.execute(f"SELECT count(*), sum(id) FROM {table}").fetchone() == (100, 5050)
        assert conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,)
        ).fetchone() == (0,)
