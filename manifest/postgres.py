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

Faults: no psycopg error leaves a call. A session lost to a restart of the server,
`pg_terminate_backend` or the network is a TransientError naming the server (`host:port/db`)
and the call (UnreachableError when no new session can be opened), except in `put`, whose
outcome it leaves unknown: InDoubtError (the contract of DecisionStore.put). Both are
retriable: the next call opens a new session. Anything else the server refuses is a
ManifestError (a missing table or privilege: ConfigError at `open`). `close` never raises.

Sessions: the store's session carries the application_name `ds:<job>:store` (cut to 63
bytes), unless the DSN (or PGAPPNAME) sets one, so operators find a job's sessions with
`application_name LIKE 'ds:<job>:%'`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql

from durable_sinks.clients.postgres import (
    bounded_connect,
    check_layout,
    connection_failure,
    connection_lost,
    mark_layout,
    server_of,
    session_name,
)
from durable_sinks.clients.postgres import connect_timeout as timeout_for
from durable_sinks.core.errors import (
    ConfigError,
    FencedError,
    InDoubtError,
    ManifestError,
    TransientError,
)
from durable_sinks.core.formats import stored_format
from durable_sinks.core.operations import Bookkeeping
from durable_sinks.core.redaction import redact
from durable_sinks.core.secrets import check, resolve

from ._record import DecisionRecord
from ._store import logs_expire, logs_open, logs_put, require_open, require_own

GENERATIONS_TABLE = stored_format(
    "Postgres decision store generations table",
    current=1,
    oldest=1,
    where="`<schema>.durable_sinks_generations`: the table's comment (none: version 1)",
)
DECISIONS_TABLE = stored_format(
    "Postgres decision store decisions table",
    current=1,
    oldest=1,
    where="`<schema>.durable_sinks_decisions`: the table's comment (none: version 1); its "
    "`record` column holds decision records",
)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


#: The store's sessions' statement_timeout: its statements are single-row reads and writes, so
#: a minute is far beyond any of them; it also bounds each wait for the server (this + 10 s,
#: clients/postgres.py `bounded_connect`). Locks are left to the server's lock_timeout.
STATEMENT_TIMEOUT_S = 60.0


class PostgresDecisionStore:
    """A durable DecisionStore in Postgres (one instance per job, from `open` on)."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        connect_timeout_s: float | None = None,
        where: str | None = None,
    ) -> None:
        """`connect_timeout_s`: seconds a connection attempt may take (rounded up; default:
        the DSN's, else 10)."""
        self._dsn = dsn
        self.schema = schema
        check(dsn, where or "the job's decision store")
        #: Whose store this is, for messages: the user named it, or the job uses the default
        #: store in a sink's database ("the job's decision store, in the database of ...").
        self.where = where or "the job's decision store"
        #: Whole seconds a connection attempt may take: the option rounded up, else the
        #: DSN's own connect_timeout, else 10 s.
        self.connect_timeout_s = timeout_for(
            dsn, None if connect_timeout_s is None else math.ceil(connect_timeout_s)
        )
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

    def _connection(self, job: str | None = None) -> psycopg.Connection[Any]:
        """The store's session, (re)opened when there is none or it was lost."""
        if self._conn is None or self._conn.closed:
            job = job or self._job
            try:
                self._conn = bounded_connect(
                    resolve(self._dsn, self.where),
                    statement_timeout_s=STATEMENT_TIMEOUT_S,
                    lock_timeout_s=None,
                    autocommit=True,
                    connect_timeout=self.connect_timeout_s,
                    # libpq's fallback: the DSN's (or PGAPPNAME's) application_name wins.
                    fallback_application_name=session_name(f"ds:{job}:store" if job else "ds"),
                )
            except psycopg.OperationalError as exc:
                raise connection_failure(
                    _first_line(exc), self._dsn, where=self.where, job=job
                ) from None
        return self._conn

    def _lost(self, exc: psycopg.Error, call: str, epoch: int | None) -> TransientError:
        return TransientError(
            f"{self.where}: lost the session with Postgres at {server_of(self._dsn)} during "
            f"{call}: {_first_line(exc)}",
            job=self._job,
            epoch=epoch,
            fix="retrying opens a new session once the server answers (a new coordinator, "
            "or the query's restart); if this repeats, look for restarts or "
            "pg_terminate_backend in the server's log, or a network problem",
        )

    @contextlib.contextmanager
    def _errors(self, call: str, epoch: int | None = None) -> Iterator[None]:
        """psycopg's errors in the store's `call`, translated: a lost session (or a lock or
        statement time-out, a deadlock) is TransientError (the call may be repeated),
        anything else the server refused ManifestError."""
        try:
            yield
        except psycopg.Error as exc:
            if connection_lost(exc):
                raise self._lost(exc, call, epoch) from None
            if isinstance(exc, psycopg.OperationalError):
                raise TransientError(
                    f"{self.where} at {server_of(self._dsn)} could not complete {call} now: "
                    f"{_first_line(exc)} (SQLSTATE {exc.sqlstate})",
                    job=self._job,
                    epoch=epoch,
                    fix="retrying may succeed (a lock or statement time-out, a deadlock, or "
                    "the server short of resources)",
                ) from None
            raise ManifestError(
                f"{self.where} refused a statement: {_first_line(exc)}",
                job=self._job,
                epoch=epoch,
                fix=f"check the tables durable_sinks_generations and durable_sinks_decisions "
                f"in schema {self.schema!r} and the job's privileges on them",
            ) from None

    def _require_open(self) -> str:
        return require_open(self._job)

    @logs_open
    def open(self, job_id: str) -> int:
        self._job = job_id
        conn = self._connection()
        with self._errors("open (tables, the generation)"):
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
        statements = [
            (
                self._generations,
                GENERATIONS_TABLE,
                "CREATE TABLE IF NOT EXISTS {} (job_id text PRIMARY KEY, "
                "generation bigint NOT NULL)",
            ),
            (
                self._decisions,
                DECISIONS_TABLE,
                "CREATE TABLE IF NOT EXISTS {} (job_id text NOT NULL, epoch bigint NOT NULL, "
                "generation bigint NOT NULL, record bytea NOT NULL, "
                "finished boolean NOT NULL DEFAULT false, "
                "created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job_id, epoch))",
            ),
        ]
        try:
            for table, layout, statement in statements:
                exists = conn.execute("SELECT to_regclass(%s)", (table.as_string(conn),))
                if (exists.fetchone() or (None,))[0] is not None:
                    check_layout(conn, table, layout, job=job_id)
                    continue
                conn.execute(sql.SQL(statement).format(table))
                mark_layout(conn, table, layout)
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
        self, call: str, query: sql.Composed, params: tuple[Any, ...], epoch: int | None = None
    ) -> psycopg.Cursor[Any]:
        """Run one statement of `call` on the store's session, errors translated."""
        conn = self._connection()
        with self._errors(call, epoch):
            return conn.execute(query, params)

    def peek_generation(self, job_id: str) -> int:
        conn = self._connection(job_id)
        with self._errors("peek_generation"):
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

    @logs_put
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
        except psycopg.Error as exc:
            if not connection_lost(exc):
                with self._errors("put (the decision)", record.epoch):
                    raise
            # Lost before or during the COMMIT: the decision may be durable (the contract
            # of put: any error but FencedError leaves the outcome unknown).
            raise InDoubtError(
                f"{self.where}: lost the session with Postgres at {server_of(self._dsn)} while "
                f"recording the decision, so whether it is recorded is unknown: "
                f"{_first_line(exc)}",
                job=job,
                epoch=record.epoch,
                fix="nothing may be rolled back: replaying the epoch or restarting the job "
                "(a new coordinator) reads the decision once the server answers and finishes "
                "the epoch, or writes it again if none was recorded",
            ) from None
        if inserted is not None:
            return record
        existing = self.get(record.epoch)
        assert existing is not None
        return existing

    def get(self, epoch: int) -> DecisionRecord | None:
        job = self._require_open()
        row = self._run(
            "get (the decision)",
            sql.SQL("SELECT record FROM {} WHERE job_id = %s AND epoch = %s").format(
                self._decisions
            ),
            (job, epoch),
            epoch,
        ).fetchone()
        if row is None:
            return None
        return DecisionRecord.from_bytes(
            bytes(row[0]), source=f"{self.schema} job {job} epoch {epoch}"
        )

    def peek(self, job_id: str, epoch: int) -> DecisionRecord | None:
        conn = self._connection(job_id)
        with self._errors("peek (the decision)", epoch):
            try:
                row = conn.execute(
                    sql.SQL("SELECT record FROM {} WHERE job_id = %s AND epoch = %s").format(
                        self._decisions
                    ),
                    (job_id, epoch),
                ).fetchone()
            except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
                return None  # no job ever opened a store here
        if row is None:
            return None
        return DecisionRecord.from_bytes(
            bytes(row[0]), source=f"{self.schema} job {job_id} epoch {epoch}"
        )

    def peek_latest(self, job_id: str) -> int | None:
        conn = self._connection(job_id)
        with self._errors("peek_latest"):
            try:
                row = conn.execute(
                    sql.SQL("SELECT max(epoch) FROM {} WHERE job_id = %s").format(self._decisions),
                    (job_id,),
                ).fetchone()
            except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
                return None
        return None if row is None or row[0] is None else int(row[0])

    def mark_finished(self, epoch: int) -> None:
        job = self._require_open()
        self._run(
            "mark_finished",
            sql.SQL("UPDATE {} SET finished = true WHERE job_id = %s AND epoch = %s").format(
                self._decisions
            ),
            (job, epoch),
            epoch,
        )

    def is_finished(self, epoch: int) -> bool:
        job = self._require_open()
        row = self._run(
            "is_finished",
            sql.SQL("SELECT finished FROM {} WHERE job_id = %s AND epoch = %s").format(
                self._decisions
            ),
            (job, epoch),
            epoch,
        ).fetchone()
        return bool(row and row[0])

    def latest_epoch(self) -> int | None:
        job = self._require_open()
        row = self._run(
            "latest_epoch",
            sql.SQL("SELECT max(epoch) FROM {} WHERE job_id = %s").format(self._decisions),
            (job,),
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    @logs_expire
    def expire(self, before_epoch: int) -> int:
        job = self._require_open()
        cursor = self._run(
            "expire (old decisions)",
            sql.SQL("DELETE FROM {} WHERE job_id = %s AND epoch < %s AND finished").format(
                self._decisions
            ),
            (job, before_epoch),
        )
        return cursor.rowcount

    def drop_job(self, job_id: str, *, apply: bool) -> list[Bookkeeping]:
        """The job's rows of `durable_sinks_decisions` and `durable_sinks_generations` (the
        tables are shared by every job and stay): counted, and with `apply` deleted in one
        transaction."""
        conn = self._connection(job_id)
        found = []
        with self._errors("drop_job"), conn.transaction():
            for table, what in (
                (self._decisions, "decision records"),
                (self._generations, "generation row"),
            ):
                try:
                    with conn.transaction():  # a savepoint: a missing table spoils nothing
                        verb = "DELETE" if apply else "SELECT count(*)"
                        query = sql.SQL(verb + " FROM {} WHERE job_id = %s").format(table)
                        cursor = conn.execute(query, (job_id,))
                        row = None if apply else cursor.fetchone()
                        count = cursor.rowcount if apply else int(row[0]) if row else 0
                except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
                    continue  # no job ever opened a store here
                if count:
                    found.append(Bookkeeping(what, table.as_string(conn), count))
        return found

    def close(self) -> None:
        """Close the session; never raises, even when the server or the network is gone."""
        if self._conn is not None and not self._conn.closed:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None
