"""The sink's two bookkeeping tables, in the meta schema, and the fencing built on them.

    durable_sinks_epochs (job_id, sink, epoch, part, participant, rows, checksum,
                          committed_at, decision)      one marker row per committed part
    durable_sinks_fences (job_id, sink, generation)    the generation that owns the sink

A marker row is inserted in the epoch's own transaction, right before PREPARE (or COMMIT in
one-phase mode), so it becomes visible exactly when the epoch's rows do:
`last_committed_epoch` and the "already committed" answers read the markers.

Fencing: `open` raises the fence row to its generation (it only ever grows) after ending the
sessions of older generations of the same job and sink (found by application_name, see
`application_name`), which aborts their open transactions. Every epoch transaction reads the
fence row before it writes, and inserts its marker only if the fence still holds its
generation (`INSERT ... SELECT ... WHERE generation = mine`); otherwise FencedError. The check
is a plain read, not an `UPDATE ... WHERE fence = mine`: a prepared transaction keeps its row
locks, so an updating check would make the next `open` wait on exactly the prepared leftovers
only it can resolve.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import psycopg
from psycopg import sql

from durable_sinks.clients.postgres import (
    check_layout,
    dsn_application_name,
    mark_layout,
    session_name,
)
from durable_sinks.core.errors import FencedError, TransientError
from durable_sinks.core.formats import stored_format
from durable_sinks.core.protocol import JSON, OpenContext

from .config import Postgres
from .errors import config_error

MARKERS = "durable_sinks_epochs"
FENCES = "durable_sinks_fences"
MARKER_TABLE = stored_format(
    "Postgres marker table",
    current=1,
    oldest=1,
    where=f"`<meta_schema>.{MARKERS}`: the table's comment (none: version 1); its `decision` "
    "column holds decision records",
)
FENCE_TABLE = stored_format(
    "Postgres fence table",
    current=1,
    oldest=1,
    where=f"`<meta_schema>.{FENCES}`: the table's comment (none: version 1)",
)
#: Times `open` ends older sessions and retries the fence bump when its row stays locked.
FENCE_ATTEMPTS = 3


#: The generation at the end of a sink session's application_name.
GENERATION_IN_NAME = re.compile(r":g([0-9]+)$")


def owner_token(context: OpenContext) -> str:
    """12 hex digits of a hash of (job, sink): what identifies the sink's sessions whatever
    the cut of the readable part of their application_name."""
    return hashlib.sha256(f"{context.job_id}\0{context.sink}".encode()).hexdigest()[:12]


def application_name(context: OpenContext, generation: int, dsn: str | None = None) -> str:
    """The application_name of every session of (job, sink) at `generation`:
    `ds:<job>:<sink>:<owner>:g<generation>`, at most 63 bytes (Postgres cuts longer names):
    the readable `ds:<job>:<sink>` is cut (and characters other than printable ASCII become
    '?'), never the `:<owner>:g<generation>` a newer generation finds the sessions it must
    end by. When the DSN sets an application_name, it replaces `ds:<job>:<sink>`. Operators
    find a job's sessions with `application_name LIKE 'ds:<job>:%'` (job ids of up to about
    30 characters are kept whole; application_name is visible to every user of the server,
    so a job id must not hold a secret)."""
    head = (dsn and dsn_application_name(dsn)) or f"ds:{context.job_id}:{context.sink}"
    # An operator's tool (`durable-sinks`) names its sessions `...:cli`: never taken for a
    # coordinator's by `live_generations`, and never ended by a newer generation's open.
    tail = "cli" if context.inspect else f"g{generation}"
    return session_name(head, f":{owner_token(context)}:{tail}")


def _legacy_prefix(context: OpenContext) -> str:
    """The application_name prefix of sessions opened by versions before 2026-11
    (`ds:<16 hex digits>:g<generation>`), still ended by a newer generation's open."""
    owner = hashlib.sha256(f"{context.job_id}\0{context.sink}".encode()).hexdigest()[:16]
    return f"ds:{owner}:g"


class MetaTables:
    """The marker and fence tables of one sink, seen by one generation (`context`)."""

    def __init__(self, config: Postgres, context: OpenContext) -> None:
        self.context = context
        self.schema = config.meta_schema_name
        self.markers = sql.Identifier(self.schema, MARKERS)
        self.fences = sql.Identifier(self.schema, FENCES)

    def _owner(self) -> tuple[str, str]:
        return self.context.job_id, self.context.sink

    # -- open ----------------------------------------------------------------------------------
    def create(self, conn: psycopg.Connection[Any]) -> None:
        """Create both tables if missing (and add the decision column that marker tables made
        by older versions lack). Needs CREATE on the meta schema only when one is missing."""
        statements = [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (job_id text NOT NULL, sink text NOT NULL, "
                "epoch bigint NOT NULL, part text NOT NULL, participant text NOT NULL, "
                "rows bigint NOT NULL, checksum text NOT NULL, "
                "committed_at timestamptz NOT NULL DEFAULT now(), decision text, "
                "PRIMARY KEY (job_id, sink, epoch, part))"
            ).format(self.markers),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (job_id text NOT NULL, sink text NOT NULL, "
                "generation bigint NOT NULL, PRIMARY KEY (job_id, sink))"
            ).format(self.fences),
        ]
        layouts = (MARKER_TABLE, FENCE_TABLE)
        tables = (self.markers, self.fences)
        for table, statement, layout in zip(tables, statements, layouts, strict=True):
            exists = conn.execute("SELECT to_regclass(%s)", (table.as_string(conn),)).fetchone()
            if exists and exists[0] is not None:
                check_layout(conn, table, layout, job=self.context.job_id, sink=self.context.sink)
                if table is self.markers:
                    self._add_decision_column(conn)
                continue  # CREATE ... IF NOT EXISTS would still demand CREATE on the schema
            for attempt in range(3):  # concurrent CREATE ... IF NOT EXISTS can still collide
                try:
                    conn.execute(statement)
                    mark_layout(conn, table, layout)
                    break
                except psycopg.errors.UniqueViolation:
                    if attempt == 2:
                        raise
                except psycopg.errors.InvalidSchemaName:
                    raise config_error(
                        self.context,
                        f"schema {self.schema!r} does not exist",
                        fix=f"CREATE SCHEMA {self.schema}, or fix `table`/`meta_schema`",
                    ) from None
                except psycopg.errors.InsufficientPrivilege:
                    raise config_error(
                        self.context,
                        f"cannot create the marker/fence tables in schema {self.schema!r}",
                        fix=f"GRANT CREATE ON SCHEMA {self.schema} to the job's user, or "
                        "create them once as an owner (see docs/postgres.md)",
                    ) from None

    def _add_decision_column(self, conn: psycopg.Connection[Any]) -> None:
        """Marker tables made before one-phase commit existed lack the decision column."""
        found = conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'decision' "
            "AND NOT attisdropped",
            (self.markers.as_string(conn),),
        ).fetchone()
        if found is not None:
            return
        try:
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS decision text").format(
                    self.markers
                )
            )
        except psycopg.errors.InsufficientPrivilege:
            raise config_error(
                self.context,
                f"the marker table {self.markers.as_string(conn)} lacks the `decision` column "
                "and the job's user may not add it",
                fix=f"as its owner: ALTER TABLE <meta_schema>.{MARKERS} ADD COLUMN decision text",
            ) from None

    def take_over(self, conn: psycopg.Connection[Any]) -> None:
        """Raise the fence row to this generation, or raise FencedError if a newer one holds
        it. Older generations' sessions are ended first: a one-phase epoch transaction
        share-locks the fence row until its COMMIT, so the bump waits for (and then sees) a
        commit already under way, and never for a session that would never finish."""
        job, sink = self._owner()
        generation = self.context.generation
        for attempt in range(FENCE_ATTEMPTS):
            self._end_older_sessions(conn)
            try:
                with conn.transaction():
                    conn.execute("SET LOCAL lock_timeout = '5s'")
                    raised = conn.execute(
                        sql.SQL(
                            "INSERT INTO {f} (job_id, sink, generation) VALUES (%s, %s, %s) "
                            "ON CONFLICT (job_id, sink) DO UPDATE SET generation = "
                            "EXCLUDED.generation WHERE {f}.generation < EXCLUDED.generation "
                            "RETURNING generation"
                        ).format(f=self.fences),
                        (job, sink, generation),
                    ).fetchone()
            except psycopg.errors.LockNotAvailable:
                if attempt == FENCE_ATTEMPTS - 1:
                    raise TransientError(
                        "an older generation's session keeps the fence row locked",
                        job=job,
                        sink=sink,
                        fix="end the old driver's sessions (pg_stat_activity, application_name "
                        f"ending in ':{owner_token(self.context)}:g<generation>') and restart",
                    ) from None
                continue
            if raised is None:
                raise FencedError(
                    f"generation {generation} is older than the one that last opened this sink",
                    job=job,
                    sink=sink,
                    fix="stop this coordinator; a newer one owns the job",
                )
            return

    def _end_older_sessions(self, conn: psycopg.Connection[Any]) -> None:
        """Terminate the sessions of older generations of this job and sink (this version's
        names and the ones older versions gave)."""
        rows = conn.execute(
            "SELECT pid, application_name, usename::text FROM pg_stat_activity "
            "WHERE (application_name ~ %s OR starts_with(application_name, %s)) "
            "AND pid <> pg_backend_pid()",
            (f":{owner_token(self.context)}:g[0-9]+$", _legacy_prefix(self.context)),
        ).fetchall()
        for pid, application, role in rows:
            found = GENERATION_IN_NAME.search(application)
            if found and int(found.group(1)) < self.context.generation:
                try:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                except psycopg.errors.InsufficientPrivilege:
                    raise config_error(
                        self.context,
                        f"a session of an older generation of this job (pid {pid}, role "
                        f"{role}) is still connected, and the job's user may not end it",
                        fix=f"run the job as {role} (a job keeps one role), grant the job's "
                        f"user pg_signal_backend, or end it: SELECT pg_terminate_backend({pid})",
                    ) from None

    # -- fence checks --------------------------------------------------------------------------
    def fence_generation(self, conn: psycopg.Connection[Any]) -> int | None:
        """The generation in the fence row (None without a row)."""
        row = conn.execute(
            sql.SQL("SELECT generation FROM {} WHERE job_id = %s AND sink = %s").format(
                self.fences
            ),
            self._owner(),
        ).fetchone()
        return None if row is None else int(row[0])

    def check_fence(self, conn: psycopg.Connection[Any], epoch: int) -> None:
        """Raise FencedError unless the fence row holds this generation (ConfigError when no
        coordinator ever opened the sink: a worker started by hand)."""
        try:
            found = self.fence_generation(conn)
        except psycopg.errors.UndefinedTable:
            raise config_error(
                self.context,
                f"no coordinator has opened this sink yet (no {self.fences.as_string(conn)})",
                epoch=epoch,
                fix="workers prepare only for a started coordinator: start the job through "
                "durable_sink or the durable data source",
            ) from None
        if found != self.context.generation:
            raise self.fenced(found, epoch)

    def fenced(self, found: int | None, epoch: int) -> FencedError:
        job, sink = self._owner()
        return FencedError(
            f"the sink's fence is at generation {found}, not {self.context.generation}: a "
            "newer coordinator owns it",
            job=job,
            sink=sink,
            epoch=epoch,
            fix="stop this coordinator; the newer one replays the epoch",
        )

    # -- markers -------------------------------------------------------------------------------
    def write_marker(
        self,
        conn: psycopg.Connection[Any],
        epoch: int,
        part: str,
        participant: str,
        rows: int,
        checksum: str,
        decision: str | None,
    ) -> None:
        """Insert the epoch's marker row in the open transaction, only while the fence still
        holds this generation (check and marker in one statement, one round trip). In
        one-phase mode the fence row is also share-locked until COMMIT: a newer generation's
        open waits for this commit, so it sees it."""
        job, sink = self._owner()
        lock = sql.SQL(" FOR SHARE") if self.context.commit_point else sql.SQL("")
        marked = conn.execute(
            sql.SQL(
                "INSERT INTO {m} (job_id, sink, epoch, part, participant, rows, checksum, "
                "decision) SELECT job_id, sink, %s, %s, %s, %s, %s, %s FROM {f} "
                "WHERE job_id = %s AND sink = %s AND generation = %s{lock}"
            ).format(m=self.markers, f=self.fences, lock=lock),
            (
                epoch,
                part,
                participant,
                rows,
                checksum,
                decision,
                job,
                sink,
                self.context.generation,
            ),
        )
        if marked.rowcount != 1:
            self.check_fence(conn, epoch)  # names the newer generation
            raise self.fenced(None, epoch)

    def marker_participant(
        self, conn: psycopg.Connection[Any], epoch: int, part: str
    ) -> str | None:
        """The participant whose marker row for (epoch, part) is committed, if any."""
        row = conn.execute(
            sql.SQL(
                "SELECT participant FROM {} WHERE job_id = %s AND sink = %s AND epoch = %s "
                "AND part = %s"
            ).format(self.markers),
            (*self._owner(), epoch, part),
        ).fetchone()
        return None if row is None else str(row[0])

    def decision(self, conn: psycopg.Connection[Any], epoch: int) -> dict[str, JSON] | None:
        """The decision a one-phase commit of `epoch` carried in its marker row, or None."""
        row = conn.execute(
            sql.SQL(
                "SELECT decision FROM {} WHERE job_id = %s AND sink = %s AND epoch = %s "
                "AND decision IS NOT NULL LIMIT 1"
            ).format(self.markers),
            (*self._owner(), epoch),
        ).fetchone()
        if row is None:
            return None
        loaded: dict[str, JSON] = json.loads(row[0])
        return loaded

    def last_committed(self, conn: psycopg.Connection[Any]) -> int | None:
        """The highest epoch with a committed marker row."""
        row = conn.execute(
            sql.SQL("SELECT max(epoch) FROM {} WHERE job_id = %s AND sink = %s").format(
                self.markers
            ),
            self._owner(),
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])
