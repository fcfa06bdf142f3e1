"""A test bed endpoint naming several Postgres servers: libpq's multi-host form, asking for the
one that accepts writes, and JDBC's; one server keeps the form it had."""

from __future__ import annotations

import psycopg.conninfo

from tests.services import PostgresEndpoint


def test_several_servers_make_one_connection_string_that_asks_for_the_writable_one() -> None:
    pair = PostgresEndpoint("127.0.0.1", 15452, "postgres", "s3cret", more_hosts=(("h2", 15453),))
    params = psycopg.conninfo.conninfo_to_dict(pair.conninfo())
    assert params["host"] == "127.0.0.1,h2"
    assert params["port"] == "15452,15453"
    assert params["target_session_attrs"] == "read-write"
    assert "s3cret" not in repr(pair)
    assert pair.jdbc_url() == (
        "jdbc:postgresql://127.0.0.1:15452,h2:15453/postgres?sslmode=disable"
        "&targetServerType=primary"
    )


def test_one_server_keeps_its_connection_string() -> None:
    one = PostgresEndpoint("127.0.0.1", 15432, "postgres", "pw")
    params = psycopg.conninfo.conninfo_to_dict(one.conninfo())
    assert (params["host"], params["port"]) == ("127.0.0.1", "15432")
    assert "target_session_attrs" not in params
    assert one.jdbc_url() == "jdbc:postgresql://127.0.0.1:15432/postgres?sslmode=disable"
