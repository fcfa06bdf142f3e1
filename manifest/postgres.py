"""Decision store in a Postgres table.

Tables (in `schema`, created if missing)::

    durable_sinks_generations (job_id PRIMARY KEY, generation)
    durable_sinks_decisions   (job_id, epoch, generation, record, finished, created_at,
                               PRIMARY KEY (job_id, epoch))

`open` increments the job's generation in one statement (compare-and-swap by the row lock).
`put` runs one transaction: it reads the generation row FOR SHARE (so a concurrent `open` waits
for it, and it waits for a concurrent `open`), refuses with FencedError if the generation moved
on, and inserts the record with ON CONFLICT DO NOTHING: create-only, first writer wins. Lookups
use the primary key: O(log n), a few pages whatever the history.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql

from durable_sinks.core.connecting import connect_timeout as timeout_for
from durable_sinks.core.connecting import connection_failure
from durable_sinks.core.errors import (
    ConfigError,
    FencedError,
    InDoubtError,
    ManifestError,
    TransientError,
)
from durable_sinks.core.redaction import redact

from ._record import DecisionRecord
from ._store import require_open, require_own


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class PostgresDecisionStore:
    """A durable DecisionStore in Postgres (one instance per job, from `open` on)."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        connect_timeout: int | None = None,
        where: str | None = None,
    ) -> None:
        self._dsn = dsn
        self.schema = schema
        #: Whose store this is, for messages: the user named it, or the job uses the default
        #: store in a sink's database ("the job's decision store, in the database of ...").
        self.where = where or "the job's decision store"
        #: The option, else the DSN's own connect_timeout, else 10 s.
        self.connect_timeout = timeout_for(dsn, connect_timeout)
        self._conn: psycopg.Connection[Any] | None = None
        self._job: str | None = None
        self._generation = -1
        self._generations = sql.Identifier(schema, "durable_sinks_generations")
        self._decisions = sql.Identifier(schema, "durable_sinks_decisions")

    @property
    def durable(self) -> bool:
        return True

    @property
    def generation(self) -> int:
        return self._generation

    def __repr__(self) -> str:
        return f"PostgresDecisionStore({redact(self._dsn)!r}, schema={self.schema!r})"

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(
                    self._dsn, autocommit=True, connect_timeout=self.connect_timeout
                )
            except psycopg.OperationalError as exc:
                raise connection_failure(
                    _first_line(exc), self._dsn, where=self.where, job=self._job
                ) from None
        return self._conn

    @contextlib.contextmanager
    def _errors(self, epoch: int | None = None) -> Iterator[None]:
        """psycopg's errors in a store call, translated: a lost session is TransientError
        (the call may be repeated), anything else the server refused ManifestError."""
        try:
            yield
        except psycopg.OperationalError as exc:
            raise TransientError(
                f"{self.where}: the connection failed: {_first_line(exc)}",
                job=self._job,
                epoch=epoch,
            ) from None
        except psycopg.Error as exc:
            raise ManifestError(
                f"{self.where} refused a statement: {_first_line(exc)}",
                job=self._job,
                epoch=epoch,
                fix=f"check the tables durable_sinks_generations and durable_sinks_decisions "
                f"in schema {self.schema!r} and the job's privileges on them",
            ) from None

    def _require_open(self) -> str:
        return require_open(self._job)

    def open(self, job_id: str) -> int:
        self._job = job_id
        conn = self._connection()
        with self._errors():
            self._create_tables(conn, job_id)
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {g} (job_id, generation) VALUES (%s, 1) ON CONFLICT (job_id) "
                    "DO UPDATE SET generation = {g}.generation + 1 RETURNING generation"
                ).format(g=self._generations),
                (job_id,),
            ).fetchone()
        assert row is not None
        self._generation = int(row[0])
        return self._generation

    def _create_tables(self, conn: psycopg.Connection[Any], job_id: str) -> None:
        try:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (job_id text PRIMARY KEY, "
                    "generation bigint NOT NULL)"
                ).format(self._generations)
            )
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (job_id text NOT NULL, epoch bigint NOT NULL, "
                    "generation bigint NOT NULL, record bytea NOT NULL, "
                    "finished boolean NOT NULL DEFAULT false, "
                    "created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job_id, epoch))"
                ).format(self._decisions)
            )
        except psycopg.errors.InvalidSchemaName:
            raise ConfigError(
                f"schema {self.schema!r} of {self.where} does not exist; nothing was created",
                job=job_id,
                fix=f"CREATE SCHEMA {self.schema}, or name an existing schema"
                + (" (the sink's table or meta_schema)" if "sink" in self.where else ""),
            ) from None
        except psycopg.errors.InsufficientPrivilege:
            raise ConfigError(
                f"cannot create the decision tables of {self.where} in schema {self.schema!r}",
                job=job_id,
                fix=f"GRANT CREATE ON SCHEMA {self.schema} to the job's user",
            ) from None

    def _run(
        self, query: sql.Composed, params: tuple[Any, ...], epoch: int | None = None
    ) -> psycopg.Cursor[Any]:
        """Run one statement on the store's session, errors translated."""
        conn = self._connection()
        with self._errors(epoch):
            return conn.execute(query, params)

    def peek_generation(self, job_id: str) -> int:
        conn = self._connection()
        with self._errors():
            try:
                row = conn.execute(
                    sql.SQL("SELECT generation FROM {} WHERE job_id = %s").format(
                        self._generations
                    ),
                    (job_id,),
                ).fetchone()
            except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
                return 0  # no job ever opened a store here
        return 0 if row is None else int(row[0])

    def put(self, record: DecisionRecord) -> DecisionRecord:
        job = self._require_open()
        require_own(record, job, self._generation)
        conn = self._connection()
        try:
            with conn.transaction():
                row = conn.execute(
                    sql.SQL("SELECT generation FROM {} WHERE job_id = %s FOR SHARE").format(
                        self._generations
                    ),
                    (job,),
                ).fetchone()
                if row is None or int(row[0]) != self._generation:
                    raise FencedError(
                        "a newer coordinator took over this job; this one's decision was not "
                        "recorded",
                        job=job,
                        epoch=record.epoch,
                        fix="stop this coordinator; the newer one recovers the epoch",
                    )
                inserted = conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (job_id, epoch, generation, record) VALUES "
                        "(%s, %s, %s, %s) ON CONFLICT (job_id, epoch) DO NOTHING RETURNING epoch"
                    ).format(self._decisions),
                    (job, record.epoch, record.generation, record.to_bytes()),
                ).fetchone()
        except psycopg.OperationalError as exc:
            raise InDoubtError(
                f"{self.where}: the connection failed while recording the decision: "
                f"{_first_line(exc)}",
                job=job,
                epoch=record.epoch,
            ) from None
        except psycopg.Error:
            with self._errors(record.epoch):
                raise
        if inserted is not None:
            return record
        existing = self.get(record.epoch)
        assert existing is not None
        return existing

    def get(self, epoch: int) -> DecisionRecord | None:
        job = self._require_open()
        row = self._run(
            sql.SQL("SELECT record FROM {} WHERE job_id = %s AND epoch = %s").format(
                self._decisions
            ),
            (job, epoch),
        ).fetchone()
        if row is None:
            return None
        return DecisionRecord.from_bytes(
            bytes(row[0]), source=f"{self.schema} job {job} epoch {epoch}"
        )

    def mark_finished(self, epoch: int) -> None:
        job = self._require_open()
        self._run(
            sql.SQL("UPDATE {} SET finished = true WHERE job_id = %s AND epoch = %s").format(
                self._decisions
            ),
            (job, epoch),
        )

    def is_finished(self, epoch: int) -> bool:
        job = self._require_open()
        row = self._run(
            sql.SQL("SELECT finished FROM {} WHERE job_id = %s AND epoch = %s").format(
                self._decisions
            ),
            (job, epoch),
        ).fetchone()
        return bool(row and row[0])

    def latest_epoch(self) -> int | None:
        job = self._require_open()
        row = self._run(
            sql.SQL("SELECT max(epoch) FROM {} WHERE job_id = %s").format(self._decisions),
            (job,),
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def expire(self, before_epoch: int) -> int:
        job = self._require_open()
        cursor = self._run(
            sql.SQL("DELETE FROM {} WHERE job_id = %s AND epoch < %s AND finished").format(
                self._decisions
            ),
            (job, before_epoch),
        )
        return cursor.rowcount

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None
