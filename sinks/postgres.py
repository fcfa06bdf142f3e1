"""Postgres: two-phase commit with PREPARE TRANSACTION, binary COPY from Arrow, epoch markers,
fencing, append and upsert.

What is durable when:
- `pre_commit`: the epoch's rows and its marker row (job, sink, epoch, part, participant,
  rows, checksum) are in a prepared transaction named by the participant (the gid): durable,
  surviving crashes and restarts of Postgres, invisible to readers;
- `commit_epoch`: `COMMIT PREPARED` makes rows and marker visible at once. A gid that no longer
  exists whose marker row names it was committed before: ALREADY_COMMITTED.

Fencing: `open` records the coordinator's generation in a fence row (it only ever grows) and
terminates the sessions of older generations of the same job and sink, which aborts their open
transactions. Every epoch transaction reads the fence row before it writes, and writes its
marker row only if the fence still holds its generation (`INSERT ... SELECT ... WHERE
generation = mine`, right before PREPARE); otherwise it fails with FencedError. The check is a
plain read, not an `UPDATE ... WHERE fence = mine`: a prepared transaction keeps its row locks,
so an updating check would make the next `open` wait on exactly the prepared leftovers that only
it can resolve.

The DSN may hold a password: it is never logged, put in an error, a handle or a marker; `repr`
and messages show the DSN without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pgpq
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ._api import (
    JSON,
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from ._pg_types import TableColumn, ddl_type, mismatches, nul_characters, null_violations
from .errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    InDoubtError,
    ParticipantLostError,
    SchemaMismatchError,
    TransientError,
)
from .naming import ParticipantName, owner_prefix

if TYPE_CHECKING:
    import pyarrow as pa

#: Rows encoded per COPY write: small enough to overlap encoding with sending, large enough that
#: per-call overhead does not show (measured in benchmarks/postgres_sink.py).
COPY_SLICE_ROWS = 16_384
#: Times `open` ends older sessions and retries the fence bump when its row stays locked.
_FENCE_ATTEMPTS = 3
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


def redact(dsn: str) -> str:
    """The DSN without its password (for messages and reprs)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    params.pop("password", None)
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


@dataclass(frozen=True)
class PostgresSinkConfig:
    """Configuration of a PostgresSink (picklable; validated when built).

    - dsn: libpq connection string or URI (may hold a password; never shown).
    - table: target table, `table` or `schema.table` (unquoted identifiers).
    - mode: "append" (binary COPY into the table) or "upsert" (COPY into a per-epoch UNLOGGED
      staging table, then INSERT ... ON CONFLICT (key) DO UPDATE, in the same transaction).
    - key: the conflict key of upsert mode (a unique index on exactly these columns).
    - create_table: create the table from the first batch's Arrow schema if it is missing.
    - meta_schema: where the marker and fence tables live (default: the table's schema).
    - participants_in_flight: prepared transactions this sink may hold at once (validated
      against max_prepared_transactions).
    """

    dsn: str = field(repr=False)
    table: str
    name: str = "postgres"
    mode: Literal["append", "upsert"] = "append"
    key: tuple[str, ...] = ()
    create_table: bool = False
    meta_schema: str | None = None
    participants_in_flight: int = 2
    connect_timeout: int = 10

    def __post_init__(self) -> None:
        where = f"postgres sink {self.name!r}"
        if not self.dsn:
            raise ConfigError(f"{where}: `dsn` is empty", fix="give a libpq connection string")
        try:
            conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError:
            raise ConfigError(
                f"{where}: `dsn` is not a valid connection string",
                fix="use 'host=... port=... dbname=... user=...' or a postgresql:// URI",
            ) from None
        parts = self.table.split(".")
        if len(parts) > 2 or not all(_IDENTIFIER.match(p) for p in parts):
            raise ConfigError(
                f"{where}: table {self.table!r} is not `table` or `schema.table`",
                fix="use plain identifiers (letters, digits, _), at most one dot",
            )
        if self.mode not in ("append", "upsert"):
            raise ConfigError(
                f"{where}: mode {self.mode!r} is not 'append' or 'upsert'",
                fix="mode='append' (the default) or mode='upsert' with key=(...)",
            )
        if self.mode == "upsert" and not self.key:
            raise ConfigError(f"{where}: upsert mode needs `key`", fix="key=('id',)")
        if self.mode == "append" and self.key:
            raise ConfigError(
                f"{where}: `key` is only used in upsert mode",
                fix="add mode='upsert', or drop key=",
            )
        for column in self.key:
            if not _IDENTIFIER.match(column):
                raise ConfigError(
                    f"{where}: key column {column!r} is not a plain identifier",
                    fix="name key columns with letters, digits and _ (as in the table)",
                )
        if self.meta_schema is not None and not _IDENTIFIER.match(self.meta_schema):
            raise ConfigError(
                f"{where}: meta_schema {self.meta_schema!r} is not an identifier",
                fix="leave it unset (the table's schema) or name a schema with letters, digits "
                "and _",
            )
        if self.participants_in_flight < 1:
            raise ConfigError(
                f"{where}: participants_in_flight must be >= 1",
                fix="leave the default, or give how many prepared transactions the job may "
                "hold at once",
            )

    @property
    def schema_name(self) -> str:
        return self.table.split(".")[0] if "." in self.table else "public"

    @property
    def table_name(self) -> str:
        return self.table.split(".")[-1]

    def __repr__(self) -> str:
        return (
            f"PostgresSinkConfig(dsn={redact(self.dsn)!r}, table={self.table!r}, "
            f"name={self.name!r}, mode={self.mode!r})"
        )


class _Epoch:
    def __init__(self, epoch: int, name: ParticipantName) -> None:
        self.epoch = epoch
        self.name = name
        self.rows = 0
        self.bytes = 0
        self.checksum = 0  # CRC-32 of the COPY bytes, for audits
        self.stage: str | None = None
        #: Set by pre_commit in one-phase mode: the transaction waits for commit_with_decision.
        self.handle: CommitHandle | None = None


class PostgresSink:
    """Exactly-once into one Postgres table, through prepared transactions."""

    def __init__(self, config: PostgresSinkConfig) -> None:
        self.config = config
        self._context: OpenContext | None = None
        self._admin: psycopg.Connection[Any] | None = None
        self._tx: psycopg.Connection[Any] | None = None
        self._current: _Epoch | None = None
        self._attempts: dict[int, int] = {}
        self._columns: dict[str, TableColumn] | None = None
        self._checked_schema: pa.Schema | None = None
        #: Highest epoch whose marker is committed: read at open, then kept by commit_epoch
        #: (after open only this generation's coordinator commits this job's participants).
        self._last_committed: int | None = None
        self._counters = {"rows": 0.0, "bytes": 0.0, "epochs_committed": 0.0, "rollbacks": 0.0}
        meta = config.meta_schema or config.schema_name
        self._target = sql.Identifier(config.schema_name, config.table_name)
        self._markers = sql.Identifier(meta, "durable_sinks_epochs")
        self._fences = sql.Identifier(meta, "durable_sinks_fences")
        self._meta_schema = meta

    @property
    def name(self) -> str:
        return self.config.name

    def __repr__(self) -> str:
        return f"PostgresSink(name={self.name!r}, table={self.config.table!r})"

    # -- connections ---------------------------------------------------------------------------
    def _ctx(self) -> OpenContext:
        if self._context is None:
            raise ConfigError(f"{self!r} is not open; the coordinator opens sinks")
        return self._context

    def _application_name(self, generation: int) -> str:
        ctx = self._ctx()
        owner = hashlib.sha256(f"{ctx.job_id}\0{self.name}".encode()).hexdigest()[:16]
        return f"ds:{owner}:g{generation}"

    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        ctx = self._ctx()
        try:
            return psycopg.connect(
                self.config.dsn,
                autocommit=autocommit,
                connect_timeout=self.config.connect_timeout,
                application_name=self._application_name(ctx.generation),
            )
        except psycopg.OperationalError as exc:
            raise TransientError(
                f"cannot connect to Postgres at {redact(self.config.dsn)}: {_first_line(exc)}",
                job=ctx.job_id,
                sink=self.name,
                fix="check that the server runs and the DSN's host, port, user and password",
            ) from None

    def _admin_conn(self) -> psycopg.Connection[Any]:
        if self._admin is None or self._admin.closed:
            self._admin = self._connect(autocommit=True)
        return self._admin

    def _tx_conn(self) -> psycopg.Connection[Any]:
        if self._tx is None or self._tx.closed:
            self._tx = self._connect(autocommit=False)
        return self._tx

    @contextlib.contextmanager
    def _errors(self, epoch: int | None = None) -> Iterator[None]:
        """Translate psycopg errors: lost sessions become FencedError (terminated by a newer
        generation) or TransientError; data errors become SchemaMismatchError."""
        ctx = self._ctx()
        try:
            yield
        except DurableSinkError:
            raise
        except (
            psycopg.errors.NotNullViolation,
            psycopg.errors.CardinalityViolation,
            psycopg.errors.CharacterNotInRepertoire,
            psycopg.errors.UntranslatableCharacter,
            psycopg.errors.StringDataRightTruncation,
            psycopg.errors.NumericValueOutOfRange,
        ) as exc:
            raise SchemaMismatchError(
                f"Postgres refused the epoch's data: {_first_line(exc)}",
                job=ctx.job_id,
                sink=self.name,
                epoch=epoch,
                fix="fix the data or the table; nothing of the epoch was committed",
            ) from None
        except psycopg.OperationalError as exc:
            if self._fence_generation() > ctx.generation:
                raise FencedError(
                    "a newer coordinator opened this sink (and ended this session)",
                    job=ctx.job_id,
                    sink=self.name,
                    epoch=epoch,
                ) from None
            raise TransientError(
                f"Postgres connection problem: {_first_line(exc)}",
                job=ctx.job_id,
                sink=self.name,
                epoch=epoch,
            ) from None

    def _fence_generation(self) -> int:
        """The generation in the fence row, read on a fresh session (-1 if unknown)."""
        try:
            with psycopg.connect(
                self.config.dsn, autocommit=True, connect_timeout=self.config.connect_timeout
            ) as conn:
                row = conn.execute(
                    sql.SQL("SELECT generation FROM {} WHERE job_id = %s AND sink = %s").format(
                        self._fences
                    ),
                    (self._ctx().job_id, self.name),
                ).fetchone()
        except psycopg.Error:
            return -1
        return int(row[0]) if row else -1

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._context = context
        if context.worker:
            # The driver's instance created the tables and raised the fence; a worker only
            # connects (begin_epoch checks the fence still names this generation).
            with self._errors():
                self._tx_conn()
            return
        with self._errors():
            conn = self._admin_conn()
            self._create_meta_tables(conn)
            fenced = self._bump_fence(conn)
            if fenced is None:
                raise FencedError(
                    f"generation {context.generation} is older than the one that last opened "
                    "this sink",
                    job=context.job_id,
                    sink=self.name,
                    fix="stop this coordinator; a newer one owns the job",
                )
            self._last_committed = self._read_last_committed()
            self._tx_conn()  # the epochs' session, opened now rather than in the first epoch

    def _create_meta_tables(self, conn: psycopg.Connection[Any]) -> None:
        statements = [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (job_id text NOT NULL, sink text NOT NULL, "
                "epoch bigint NOT NULL, part text NOT NULL, participant text NOT NULL, "
                "rows bigint NOT NULL, checksum text NOT NULL, "
                "committed_at timestamptz NOT NULL DEFAULT now(), decision text, "
                "PRIMARY KEY (job_id, sink, epoch, part))"
            ).format(self._markers),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (job_id text NOT NULL, sink text NOT NULL, "
                "generation bigint NOT NULL, PRIMARY KEY (job_id, sink))"
            ).format(self._fences),
        ]
        for table, statement in zip((self._markers, self._fences), statements, strict=True):
            exists = conn.execute("SELECT to_regclass(%s)", (table.as_string(conn),)).fetchone()
            if exists and exists[0] is not None:
                if table is self._markers:
                    self._add_decision_column(conn)
                continue  # CREATE ... IF NOT EXISTS would still demand CREATE on the schema
            for attempt in range(3):  # concurrent CREATE ... IF NOT EXISTS can still collide
                try:
                    conn.execute(statement)
                    break
                except psycopg.errors.UniqueViolation:
                    if attempt == 2:
                        raise
                except psycopg.errors.InvalidSchemaName:
                    raise ConfigError(
                        f"schema {self._meta_schema!r} does not exist",
                        job=self._ctx().job_id,
                        sink=self.name,
                        fix=f"CREATE SCHEMA {self._meta_schema}, or fix `table`/`meta_schema`",
                    ) from None
                except psycopg.errors.InsufficientPrivilege:
                    raise ConfigError(
                        f"cannot create the marker/fence tables in schema {self._meta_schema!r}",
                        job=self._ctx().job_id,
                        sink=self.name,
                        fix=f"GRANT CREATE ON SCHEMA {self._meta_schema} to the job's user, or "
                        "create them once as an owner (see docs/postgres.md)",
                    ) from None

    def _bump_fence(self, conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
        """Raise the fence row to this generation (None if a newer one holds it). Older
        generations' sessions are ended first: a one-phase epoch transaction share-locks the
        fence row until its COMMIT, so the bump waits for (and then sees) a commit already
        under way, and never for a session that would never finish."""
        ctx = self._ctx()
        for attempt in range(_FENCE_ATTEMPTS):
            self._terminate_older_sessions(conn)
            try:
                with conn.transaction():
                    conn.execute("SET LOCAL lock_timeout = '5s'")
                    return conn.execute(
                        sql.SQL(
                            "INSERT INTO {f} (job_id, sink, generation) VALUES (%s, %s, %s) "
                            "ON CONFLICT (job_id, sink) DO UPDATE SET generation = "
                            "EXCLUDED.generation WHERE {f}.generation < EXCLUDED.generation "
                            "RETURNING generation"
                        ).format(f=self._fences),
                        (ctx.job_id, self.name, ctx.generation),
                    ).fetchone()
            except psycopg.errors.LockNotAvailable:
                if attempt == _FENCE_ATTEMPTS - 1:
                    raise TransientError(
                        "an older generation's session keeps the fence row locked",
                        job=ctx.job_id,
                        sink=self.name,
                        fix="end the old driver's sessions (pg_stat_activity, application_name "
                        f"{self._application_name(0)[:-1]}*) and restart",
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _add_decision_column(self, conn: psycopg.Connection[Any]) -> None:
        """Marker tables made before one-phase commit existed lack the decision column."""
        found = conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'decision' "
            "AND NOT attisdropped",
            (self._markers.as_string(conn),),
        ).fetchone()
        if found is not None:
            return
        try:
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS decision text").format(
                    self._markers
                )
            )
        except psycopg.errors.InsufficientPrivilege:
            raise ConfigError(
                f"the marker table {self._markers.as_string(conn)} lacks the `decision` column "
                "and the job's user may not add it",
                job=self._ctx().job_id,
                sink=self.name,
                fix="as its owner: ALTER TABLE <meta_schema>.durable_sinks_epochs "
                "ADD COLUMN decision text",
            ) from None

    def _terminate_older_sessions(self, conn: psycopg.Connection[Any]) -> None:
        mine = self._ctx().generation
        prefix = self._application_name(0)[: -len("g0")]
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity "
            "WHERE starts_with(application_name, %s) AND pid <> pg_backend_pid()",
            (prefix,),
        ).fetchall()
        for pid, application in rows:
            generation = application[len(prefix) + 1 :]
            if generation.isdigit() and int(generation) < mine:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def close(self) -> None:
        for conn in (self._tx, self._admin):
            if conn is not None and not conn.closed:
                conn.close()
        self._tx = self._admin = None
        self._current = None

    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(
            exactly_once=True,
            two_phase_commit=True,
            resumable_prepare=True,
            distributed_prepare=True,
            upsert=self.config.mode == "upsert",
            idempotent=self.config.mode == "upsert",
            partitioned=True,
        )

    def schema(self) -> pa.Schema | None:
        return self._checked_schema

    def metrics(self) -> Mapping[str, float]:
        return dict(self._counters)

    def health_check(self) -> None:
        ctx = self._ctx()
        with self._errors():
            conn = self._admin_conn()
            setting = conn.execute("SHOW max_prepared_transactions").fetchone()
            maximum = int(setting[0]) if setting else 0
            # A one-phase sink never prepares; recovery of older prepared leftovers works
            # whatever the setting.
            if not ctx.commit_point and maximum < self.config.participants_in_flight:
                raise ConfigError(
                    f"max_prepared_transactions is {maximum}; this sink needs at least "
                    f"{self.config.participants_in_flight} (two-phase commit)",
                    job=ctx.job_id,
                    sink=self.name,
                    fix="set max_prepared_transactions = 64 (or more) in postgresql.conf and "
                    "restart Postgres; it cannot be changed without a restart",
                )
            columns = self._table_columns()
            if columns is None:
                if not self.config.create_table:
                    raise ConfigError(
                        f"table {self.config.table} does not exist",
                        job=ctx.job_id,
                        sink=self.name,
                        fix="create it, or set create_table=True to create it from the first "
                        "batch's schema",
                    )
                return
            self._columns = columns
            self._check_privileges(conn)
            if self.config.mode == "upsert":
                self._check_upsert_key(conn, columns)

    def _check_privileges(self, conn: psycopg.Connection[Any]) -> None:
        def allowed(query: str, *args: str) -> bool:
            row = conn.execute(query, args).fetchone()
            return bool(row and row[0])

        needed = ["INSERT", "SELECT"] + (["UPDATE"] if self.config.mode == "upsert" else [])
        missing = [
            p
            for p in needed
            if not allowed("SELECT has_table_privilege(%s, %s)", self._qualified(), p)
        ]
        if self.config.mode == "upsert" and not allowed(
            "SELECT has_schema_privilege(%s, 'CREATE')", self.config.schema_name
        ):
            missing.append(f"CREATE ON SCHEMA {self.config.schema_name} (staging tables)")
        if missing:
            raise ConfigError(
                f"the job's user lacks {', '.join(missing)} on {self.config.table}",
                job=self._ctx().job_id,
                sink=self.name,
                fix=f"GRANT {', '.join(m for m in missing if ' ' not in m)} ON "
                f"{self.config.table} TO <the job's user>",
            )

    def _check_upsert_key(
        self, conn: psycopg.Connection[Any], columns: dict[str, TableColumn]
    ) -> None:
        absent = [k for k in self.config.key if k not in columns]
        if absent:
            raise ConfigError(
                f"upsert key columns {absent} are not in {self.config.table}",
                job=self._ctx().job_id,
                sink=self.name,
                fix=f"name columns of the table in key= (it has {sorted(columns)})",
            )
        indexes = conn.execute(
            "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = %s::regclass AND i.indisunique GROUP BY i.indexrelid",
            (self._qualified(),),
        ).fetchall()
        if sorted(self.config.key) not in [sorted(r[0]) for r in indexes]:
            raise ConfigError(
                f"upsert on {list(self.config.key)} needs a unique index on exactly those "
                f"columns of {self.config.table}",
                job=self._ctx().job_id,
                sink=self.name,
                fix=f"CREATE UNIQUE INDEX ON {self.config.table} ({', '.join(self.config.key)})",
            )

    def _qualified(self) -> str:
        return f'"{self.config.schema_name}"."{self.config.table_name}"'

    def _table_columns(self) -> dict[str, TableColumn] | None:
        conn = self._admin_conn()
        found = conn.execute("SELECT to_regclass(%s)", (self._qualified(),)).fetchone()
        if not found or found[0] is None:
            return None
        rows = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull, atthasdef "
            "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (self._qualified(),),
        ).fetchall()
        return {r[0]: TableColumn(r[0], r[1], r[2], r[3]) for r in rows}

    # -- phase 1 -------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        ctx = self._ctx()
        if self._current is not None:
            self._abandon_transaction()
        attempt = self._attempts.get(epoch, 0)
        self._attempts[epoch] = attempt + 1
        self._current = _Epoch(epoch, ctx.participant(epoch, attempt))
        with self._errors(epoch):
            self._check_fence(self._tx_conn(), epoch)

    def _check_fence(self, conn: psycopg.Connection[Any], epoch: int) -> None:
        try:
            row = conn.execute(
                sql.SQL("SELECT generation FROM {} WHERE job_id = %s AND sink = %s").format(
                    self._fences
                ),
                (self._ctx().job_id, self.name),
            ).fetchone()
        except psycopg.errors.UndefinedTable:
            raise ConfigError(
                f"no coordinator has opened this sink yet (no {self._fences.as_string(conn)})",
                job=self._ctx().job_id,
                sink=self.name,
                epoch=epoch,
                fix="workers prepare only for a started coordinator: start the job through "
                "durable_sink or the durable data source",
            ) from None
        found = None if row is None else int(row[0])
        if found != self._ctx().generation:
            raise self._fenced(found, epoch)

    def _fenced(self, found: int | None, epoch: int) -> FencedError:
        ctx = self._ctx()
        return FencedError(
            f"the sink's fence is at generation {found}, not {ctx.generation}: a newer "
            "coordinator owns it",
            job=ctx.job_id,
            sink=self.name,
            epoch=epoch,
            fix="stop this coordinator; the newer one replays the epoch",
        )

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        current = self._require_current()
        if current.handle is not None:
            raise ConfigError(
                "the epoch was pre-committed; no more batches",
                job=self._ctx().job_id,
                sink=self.name,
                epoch=current.epoch,
            )
        with self._errors(current.epoch):
            columns = self._columns_for(batch, current.epoch)
            self._refuse_bad_data(null_violations(batch, columns), current.epoch)
            if batch.num_rows == 0:
                return WriteResult(0, 0)
            conn = self._tx_conn()
            target = self._stage(conn, current) if self.config.mode == "upsert" else self._target
            copy_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT binary)").format(
                target, sql.SQL(", ").join(map(sql.Identifier, batch.schema.names))
            )
            sent = self._copy(conn, copy_sql, batch, current)
        current.rows += batch.num_rows
        current.bytes += sent
        self._counters["rows"] += batch.num_rows
        self._counters["bytes"] += sent
        return WriteResult(batch.num_rows, sent)

    def _refuse_bad_data(self, problems: list[str], epoch: int) -> None:
        if problems:
            raise SchemaMismatchError(
                "; ".join(problems),
                job=self._ctx().job_id,
                sink=self.name,
                epoch=epoch,
                fix="clean or filter the data; nothing of the epoch was committed",
            )

    def _copy(
        self,
        conn: psycopg.Connection[Any],
        copy_sql: sql.Composed,
        batch: pa.RecordBatch,
        current: _Epoch,
    ) -> int:
        """Encode the batch slice by slice and stream it into one COPY. The server parses one
        slice while the next is encoded (psycopg's writer thread measured slower: it contends
        for the GIL with the encoding)."""
        encoder = pgpq.ArrowToPostgresBinaryEncoder(batch.schema)
        sent = 0
        try:
            with conn.cursor() as cur, cur.copy(copy_sql) as copy:
                header = encoder.write_header()
                for offset in range(0, batch.num_rows, COPY_SLICE_ROWS):
                    chunk = encoder.write_batch(batch.slice(offset, COPY_SLICE_ROWS))
                    if offset == 0:
                        chunk = header + chunk
                    if offset + COPY_SLICE_ROWS >= batch.num_rows:
                        chunk += encoder.finish()
                    current.checksum = zlib.crc32(chunk, current.checksum)
                    copy.write(chunk)
                    sent += len(chunk)
        except psycopg.errors.CharacterNotInRepertoire:
            # Postgres refused a NUL character (text cannot hold U+0000) and the transaction
            # is aborted. Scanning for them only now keeps the scan off the fast path.
            self._refuse_bad_data(nul_characters(batch), current.epoch)
            raise
        return sent

    def _columns_for(self, batch: pa.RecordBatch, epoch: int) -> dict[str, TableColumn]:
        """The table's columns, checked against the batch's schema (once per schema)."""
        if self._columns is None:
            self._columns = self._table_columns()
            if self._columns is None:
                if not self.config.create_table:
                    raise ConfigError(
                        f"table {self.config.table} does not exist",
                        job=self._ctx().job_id,
                        sink=self.name,
                        epoch=epoch,
                        fix="create it, or set create_table=True",
                    )
                self._create_table(batch.schema, epoch)
                self._columns = self._table_columns()
                assert self._columns is not None
        if self._checked_schema is None or not batch.schema.equals(self._checked_schema):
            problems = mismatches(batch.schema, self._columns)
            if problems:
                raise SchemaMismatchError(
                    f"the batch does not fit table {self.config.table}: " + "; ".join(problems),
                    job=self._ctx().job_id,
                    sink=self.name,
                    epoch=epoch,
                    fix="cast the batch's columns to the table's types, or alter the table",
                )
            self._checked_schema = batch.schema
        return self._columns

    def _create_table(self, schema: pa.Schema, epoch: int) -> None:
        try:
            columns = [
                sql.SQL("{} {}{}").format(
                    sql.Identifier(f.name),
                    sql.SQL(ddl_type(f)),
                    sql.SQL("" if f.nullable else " NOT NULL"),
                )
                for f in schema
            ]
        except Exception as exc:  # noqa: BLE001 - ddl_type's TypeError and pgpq's own errors
            raise SchemaMismatchError(
                f"cannot create {self.config.table} from the batch: {exc}",
                job=self._ctx().job_id,
                sink=self.name,
                epoch=epoch,
                fix="cast the column to a type docs/postgres.md maps, or create the table yourself",
            ) from None
        key = (
            sql.SQL(", PRIMARY KEY ({})").format(
                sql.SQL(", ").join(map(sql.Identifier, self.config.key))
            )
            if self.config.key
            else sql.SQL("")
        )
        # Another worker (executor mode) may create it at the same moment.
        with contextlib.suppress(psycopg.errors.UniqueViolation):
            self._admin_conn().execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}{})").format(
                    self._target, sql.SQL(", ").join(columns), key
                )
            )

    def _stage(self, conn: psycopg.Connection[Any], current: _Epoch) -> sql.Composable:
        """The epoch's UNLOGGED staging table (upsert mode), created in the epoch's
        transaction (TEMP tables cannot be prepared)."""
        if current.stage is None:
            current.stage = (
                "ds_stage_" + hashlib.sha256(str(current.name).encode()).hexdigest()[:24]
            )
            conn.execute(
                sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(
                    sql.Identifier(self.config.schema_name, current.stage), self._target
                )
            )
        return sql.Identifier(self.config.schema_name, current.stage)

    def pre_commit(self, epoch: int) -> CommitHandle:
        current = self._require_current()
        ctx = self._ctx()
        gid = str(current.name)
        with self._errors(epoch):
            conn = self._tx_conn()
            if current.stage is not None:
                self._merge(conn, current)
            checksum = f"crc32:{current.checksum:08x}"
            if not ctx.commit_point:
                self._write_marker(conn, current, gid, checksum, decision=None)
                conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        handle = CommitHandle(
            self.name,
            epoch,
            gid,
            current.rows,
            current.bytes,
            checksum,
            {"part": current.name.part},
        )
        if ctx.commit_point:
            current.handle = handle  # stays open until commit_with_decision
        else:
            self._current = None
        return handle

    def _write_marker(
        self,
        conn: psycopg.Connection[Any],
        current: _Epoch,
        gid: str,
        checksum: str,
        decision: str | None,
    ) -> None:
        """Insert the epoch's marker row, only while the fence still holds this generation
        (check and marker in one statement, one round trip). In one-phase mode the fence row is
        also share-locked until COMMIT: a newer generation's open waits for this commit, so
        it sees it."""
        ctx = self._ctx()
        lock = sql.SQL(" FOR SHARE") if ctx.commit_point else sql.SQL("")
        marked = conn.execute(
            sql.SQL(
                "INSERT INTO {m} (job_id, sink, epoch, part, participant, rows, checksum, "
                "decision) SELECT job_id, sink, %s, %s, %s, %s, %s, %s FROM {f} "
                "WHERE job_id = %s AND sink = %s AND generation = %s{lock}"
            ).format(m=self._markers, f=self._fences, lock=lock),
            (
                current.epoch,
                current.name.part,
                gid,
                current.rows,
                checksum,
                decision,
                ctx.job_id,
                self.name,
                ctx.generation,
            ),
        )
        if marked.rowcount != 1:
            self._check_fence(conn, current.epoch)  # names the newer generation
            raise self._fenced(None, current.epoch)

    def _merge(self, conn: psycopg.Connection[Any], current: _Epoch) -> None:
        assert current.stage is not None
        assert self._checked_schema is not None
        stage = sql.Identifier(self.config.schema_name, current.stage)
        names = self._checked_schema.names
        updates = [n for n in names if n not in self.config.key]
        action = (
            sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(
                    sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in updates
                )
            )
            if updates
            else sql.SQL("DO NOTHING")
        )
        columns = sql.SQL(", ").join(map(sql.Identifier, names))
        conn.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) {}").format(
                self._target,
                columns,
                columns,
                stage,
                sql.SQL(", ").join(map(sql.Identifier, self.config.key)),
                action,
            )
        )
        conn.execute(sql.SQL("DROP TABLE {}").format(stage))

    def _require_current(self) -> _Epoch:
        if self._current is None:
            raise ConfigError(
                "no epoch is open; call begin_epoch first", job=self._ctx().job_id, sink=self.name
            )
        return self._current

    # -- phase 2 -------------------------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        with self._errors(epoch):
            conn = self._admin_conn()
            try:
                conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(handle.participant)))
            except psycopg.errors.UndefinedObject:
                if self._marker_participant(epoch, handle) == handle.participant:
                    self._committed(epoch)
                    return CommitOutcome.ALREADY_COMMITTED
                raise ParticipantLostError(
                    f"prepared transaction {handle.participant} does not exist and its marker "
                    "row is not there: it was rolled back or never prepared",
                    job=self._ctx().job_id,
                    sink=self.name,
                    epoch=epoch,
                    fix="someone ran ROLLBACK PREPARED on it; the epoch must be rewritten",
                ) from None
        self._counters["epochs_committed"] += 1
        self._committed(epoch)
        return CommitOutcome.COMMITTED

    def _committed(self, epoch: int) -> None:
        if self._last_committed is None or epoch > self._last_committed:
            self._last_committed = epoch

    def _marker_participant(self, epoch: int, handle: CommitHandle) -> str | None:
        name = ParticipantName.parse(handle.participant)
        part = name.part if name else str(handle.details.get("part", "0"))
        row = (
            self._admin_conn()
            .execute(
                sql.SQL(
                    "SELECT participant FROM {} WHERE job_id = %s AND sink = %s AND epoch = %s "
                    "AND part = %s"
                ).format(self._markers),
                (self._ctx().job_id, self.name, epoch, part),
            )
            .fetchone()
        )
        return None if row is None else str(row[0])

    # -- one-phase commit (the job's only sink carries the decision) ----------------------------
    def commit_with_decision(
        self, epoch: int, handle: CommitHandle, decision: Mapping[str, JSON]
    ) -> None:
        """Write the decision into the epoch's marker row and COMMIT: data, marker and decision
        become durable and visible at once. A lost connection during COMMIT leaves the outcome
        unknown: InDoubtError (read_decision tells, once the server answers again)."""
        current = self._require_current()
        ctx = self._ctx()
        if not ctx.commit_point or current.handle is None or current.handle != handle:
            raise ConfigError(
                f"commit_with_decision needs the epoch pre-committed by this sink as the job's "
                f"commit point (participant {handle.participant})",
                job=ctx.job_id,
                sink=self.name,
                epoch=epoch,
            )
        with self._errors(epoch):
            conn = self._tx_conn()
            self._write_marker(
                conn, current, handle.participant, handle.checksum, json.dumps(decision)
            )
            self._current = None
            try:
                conn.commit()
            except psycopg.OperationalError as exc:
                raise InDoubtError(
                    f"the connection broke during COMMIT of epoch {epoch}: {_first_line(exc)}",
                    job=ctx.job_id,
                    sink=self.name,
                    epoch=epoch,
                    fix="replaying the epoch or restarting the job reads the outcome",
                ) from None
        self._counters["epochs_committed"] += 1
        self._committed(epoch)

    def read_decision(self, epoch: int) -> Mapping[str, JSON] | None:
        """The decision a one-phase commit of `epoch` carried, or None."""
        ctx = self._ctx()
        with self._errors(epoch):
            row = (
                self._admin_conn()
                .execute(
                    sql.SQL(
                        "SELECT decision FROM {} WHERE job_id = %s AND sink = %s AND epoch = %s "
                        "AND decision IS NOT NULL LIMIT 1"
                    ).format(self._markers),
                    (ctx.job_id, self.name, epoch),
                )
                .fetchone()
            )
        if row is None:
            return None
        loaded: dict[str, JSON] = json.loads(row[0])
        return loaded

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        current = self._current
        if current is not None and (handle is None or handle.participant == str(current.name)):
            self._abandon_transaction()
        if handle is None:
            return
        with self._errors(epoch):
            try:
                self._admin_conn().execute(
                    sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(handle.participant))
                )
                self._counters["rollbacks"] += 1
            except psycopg.errors.UndefinedObject:
                pass  # never prepared, or already rolled back

    def _abandon_transaction(self) -> None:
        """Roll back the open (unprepared) transaction, if the session still lives."""
        self._current = None
        if self._tx is not None and not self._tx.closed:
            try:
                self._tx.rollback()
            except psycopg.Error:
                self._tx.close()

    # -- recovery ------------------------------------------------------------------------------
    def recover_prepared(self) -> list[CommitHandle]:
        ctx = self._ctx()
        with self._errors():
            rows = (
                self._admin_conn()
                .execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                    "AND starts_with(gid, %s) ORDER BY gid",
                    (owner_prefix(ctx.job_id, self.name),),
                )
                .fetchall()
            )
        handles = []
        for (gid,) in rows:
            name = ParticipantName.parse(gid)
            if name is None or not name.owned_by(ctx.job_id, self.name):
                continue
            if name.generation < ctx.generation:
                handles.append(
                    CommitHandle(self.name, name.epoch, gid, 0, 0, "", {"part": name.part})
                )
        return handles

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        ctx = self._ctx()
        with self._errors(epoch):
            rows = (
                self._admin_conn()
                .execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                    "AND starts_with(gid, %s) ORDER BY gid",
                    (f"{owner_prefix(ctx.job_id, self.name)}{epoch}:",),
                )
                .fetchall()
            )
        handles = []
        for (gid,) in rows:
            name = ParticipantName.parse(gid)
            if name is not None and name.owned_by(ctx.job_id, self.name) and name.epoch == epoch:
                handles.append(CommitHandle(self.name, epoch, gid, 0, 0, "", {"part": name.part}))
        return handles

    def last_committed_epoch(self) -> int | None:
        self._ctx()
        return self._last_committed

    def _read_last_committed(self) -> int | None:
        with self._errors():
            row = (
                self._admin_conn()
                .execute(
                    sql.SQL("SELECT max(epoch) FROM {} WHERE job_id = %s AND sink = %s").format(
                        self._markers
                    ),
                    (self._ctx().job_id, self.name),
                )
                .fetchone()
            )
        return None if row is None or row[0] is None else int(row[0])


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
