"""The cluster is a real Postgres with two-phase commit: a prepared transaction is invisible,
survives a crash of the server, and COMMIT PREPARED applies it afterwards."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint, Testbed


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
    testbed: Testbed, postgres: PostgresEndpoint, pg_schema: str, unique: UniqueNames
) -> None:
    table = f'"{pg_schema}".events'
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

    testbed.postgres.crash()  # SIGKILL postmaster and backends: no shutdown checkpoint
    testbed.postgres.up()

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
