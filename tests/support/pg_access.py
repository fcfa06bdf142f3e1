"""Postgres login roles with exactly the privileges docs/security.md lists, for tests that
connect as the job's least-privileged user (over TLS: `Role.dsn()` is `sslmode=verify-full`)."""

from __future__ import annotations

import secrets
from typing import Any

import psycopg
from psycopg import sql

from tests.services import PostgresEndpoint


class Role:
    """A login role with a random password and exactly the GRANTs docs/security.md lists for
    a sink (and the decision store) in `schema`; dropped with everything it owns."""

    def __init__(
        self, postgres: PostgresEndpoint, schema: str, name: str, *, create: bool = True
    ) -> None:
        self.postgres, self.schema, self.name = postgres, schema, name
        self.password = secrets.token_urlsafe(18)
        with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(self.password)
                )
            )
            grants = "USAGE, CREATE" if create else "USAGE"
            conn.execute(
                sql.SQL(f"GRANT {grants} ON SCHEMA {{}} TO {{}}").format(
                    sql.Identifier(schema), sql.Identifier(name)
                )
            )

    def grant_table(self, table: str, privileges: str = "SELECT, INSERT") -> None:
        with psycopg.connect(self.postgres.conninfo(), autocommit=True) as conn:
            conn.execute(
                sql.SQL(f"GRANT {privileges} ON {{}} TO {{}}").format(
                    sql.Identifier(self.schema, table), sql.Identifier(self.name)
                )
            )

    def expire(self) -> None:
        with psycopg.connect(self.postgres.conninfo(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER ROLE {} VALID UNTIL '2001-01-01'").format(sql.Identifier(self.name))
            )

    def dsn(self, **extra: str) -> str:
        endpoint = PostgresEndpoint(
            self.postgres.host, self.postgres.port, self.name, self.password, tls=self.postgres.tls
        )
        return endpoint.tls_conninfo(**extra)

    def drop(self) -> None:
        with psycopg.connect(self.postgres.conninfo(), autocommit=True) as conn:
            for gid in prepared_of(conn, self.name):
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(self.name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(self.name)))


def prepared_of(conn: psycopg.Connection[Any], role: str) -> list[str]:
    found = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE owner::text = %s", (role,))
    return [row[0] for row in found.fetchall()]
