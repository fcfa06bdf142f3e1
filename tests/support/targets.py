"""Conformance-suite targets for the local sinks (files, and the journal last resource)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
from psycopg import sql

from sinks import FileSink, FileSinkConfig, SinkConnector
from sinks.files import STAGING
from sinks.naming import owner_prefix
from sinks.postgres import PostgresSink, PostgresSinkConfig
from sinks.testing import COLUMNS, Row
from tests.services import PostgresEndpoint

from .journal_sink import JournalSink


class FileTarget:
    """A FileSink's folder, read as its readers would: published Parquet files only."""

    def __init__(self, path: Path, name: str = "files", sink_class: type[FileSink] = FileSink):
        self.path = path
        self.name = name
        self.sink_class = sink_class
        self._cache: dict[tuple[str, int, int, int], list[Row]] = {}

    def connector(self) -> SinkConnector:
        return self.sink_class(FileSinkConfig(str(self.path), name=self.name))

    def committed_rows(self) -> list[Row]:
        rows: list[Row] = []
        for file in sorted(self.path.glob("epoch=*/part=*/*.parquet")):
            stat = file.stat()
            key = (str(file), stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if key not in self._cache:  # published files never change: read each once
                table = pq.read_table(file).select(list(COLUMNS))
                self._cache[key] = [tuple(r[c] for c in COLUMNS) for r in table.to_pylist()]
            rows.extend(self._cache[key])
        return rows

    def leftovers(self) -> list[str]:
        staging = self.path / STAGING
        return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


class JournalTarget:
    """A JournalSink's folder: committed segments only (its prepared state is in memory)."""

    def __init__(self, path: Path, name: str = "journal") -> None:
        self.path = path
        self.name = name

    def connector(self) -> SinkConnector:
        return JournalSink(self.path, name=self.name)

    def committed_rows(self) -> list[Row]:
        return JournalSink.read_rows(self.path)

    def leftovers(self) -> list[str]:
        return []  # nothing of a journal epoch exists outside memory before its commit


class PostgresTarget:
    """A fresh table (and job) in the test's schema; readers see committed rows only."""

    def __init__(
        self, endpoint: PostgresEndpoint, schema: str, job_id: str, name: str = "postgres"
    ) -> None:
        self.endpoint = endpoint
        self.schema = schema
        self.job_id = job_id
        self.name = name
        self.table = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(endpoint.conninfo(), autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (key text PRIMARY KEY, n bigint, text text, "
                    "x double precision, flag boolean)"
                ).format(self._ident())
            )
        self._conn = psycopg.connect(endpoint.conninfo(), autocommit=True)

    def _ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.table)

    def connector(self) -> SinkConnector:
        return PostgresSink(
            PostgresSinkConfig(
                self.endpoint.conninfo(), f"{self.schema}.{self.table}", name=self.name
            )
        )

    def committed_rows(self) -> list[Row]:
        query = sql.SQL("SELECT key, n, text, x, flag FROM {}").format(self._ident())
        return [tuple(r) for r in self._conn.execute(query).fetchall()]

    def leftovers(self) -> list[str]:
        return prepared_gids(self._conn, self.job_id, self.name)

    def cleanup(self) -> None:
        for gid in self.leftovers():
            self._conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        self._conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._ident()))
        self._conn.close()


def prepared_gids(conn: psycopg.Connection[Any], job_id: str, sink: str) -> list[str]:
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s) ORDER BY gid",
        (owner_prefix(job_id, sink),),
    ).fetchall()
    return [r[0] for r in rows]
