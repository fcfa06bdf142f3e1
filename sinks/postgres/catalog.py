"""The target table as the server has it: checked at start (settings, privileges, the upsert
key, the owner's role for schema evolution), created from the first batch's schema on
request, compared with each new batch schema before anything of the batch is written, and
altered by schema evolution (`TargetTable.evolve`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from durable_sinks.core.bad_rows import dead_letter_schema
from durable_sinks.core.errors import ConfigError, SchemaMismatchError
from durable_sinks.core.protocol import OpenContext

from .columns import Evolution, TableColumn, cast_up, ddl_type, evolution, mismatches
from .config import Postgres
from .errors import config_error

if TYPE_CHECKING:
    import pyarrow as pa

Connect = Callable[[], "psycopg.Connection[Any]"]
#: Makes schema evolution's changes; returns the table's columns after them.
Evolve = Callable[[list[Evolution]], dict[str, TableColumn]]
#: How long an ALTER TABLE of schema evolution waits for the table's lock before it gives up
#: (TransientError: the epoch is retried), so that it never waits on a reader or another
#: participant for long.
EVOLUTION_LOCK_TIMEOUT_S = 5.0
#: The primary key of a table the sink creates for dead letters.
DEAD_LETTER_KEY = ("job_id", "sink", "epoch", "part", "row_number")
#: Postgres keeps at most NAMEDATALEN - 1 = 63 bytes of an identifier.
MAX_IDENTIFIER_BYTES = 63


class TargetTable:
    """One sink's table. `connect()` gives an autocommit session; each call may run on a new
    one. The table's columns are read once, and each new batch schema is checked once."""

    def __init__(self, config: Postgres, context: OpenContext, connect: Connect) -> None:
        self.config = config
        self.context = context
        self._connect = connect
        self.identifier = sql.Identifier(config.schema_name, config.table_name)
        self._columns: dict[str, TableColumn] | None = None
        #: The last batch schema found to fit the table.
        self.checked_schema: pa.Schema | None = None

    # -- at start ------------------------------------------------------------------------------
    def check_schemas(self, conn: psycopg.Connection[Any]) -> None:
        """Refuse a table or meta schema that does not exist (ConfigError), at open, before
        the marker and fence tables are created: create_table creates the table, never its
        schema."""
        wanted = dict.fromkeys((self.config.schema_name, self.config.meta_schema_name))
        found = {
            r[0]
            for r in conn.execute(
                "SELECT nspname::text FROM pg_namespace WHERE nspname = ANY(%s)", (list(wanted),)
            ).fetchall()
        }
        missing = [s for s in wanted if s not in found]
        if missing:
            named = []
            for schema in missing:
                settings = [f"table={self.config.table!r}"] * (schema == self.config.schema_name)
                if self.config.meta_schema == schema:
                    settings.append(f"meta_schema={schema!r}")
                named.append(
                    f"schema {schema!r} does not exist (named by {' and '.join(settings)})"
                )
            raise config_error(
                self.context,
                "; ".join(named) + "; nothing was created",
                fix=" ".join(f"CREATE SCHEMA {s};" for s in missing)
                + " or fix `table`/`meta_schema` to name an existing schema",
            )

    def check(self) -> None:
        """Everything a job needs of the server and the table, before anything is written:
        enough prepared transactions (unless this sink commits in one phase), the table (or
        create_table), the privileges, and the upsert key's unique index."""
        conn = self._connect()
        setting = conn.execute("SHOW max_prepared_transactions").fetchone()
        maximum = int(setting[0]) if setting else 0
        # A one-phase sink never prepares; recovery of older prepared leftovers works
        # whatever the setting.
        if not self.context.commit_point and maximum < self.config.participants_in_flight:
            raise config_error(
                self.context,
                f"max_prepared_transactions is {maximum}; this sink needs at least "
                f"{self.config.participants_in_flight}: the job has other sinks (or a "
                "dead-letter sink), so each batch is prepared here until the job's decision "
                "(two-phase commit); a job whose only sink is this table commits in one phase "
                "and needs none",
                fix="set max_prepared_transactions = 64 (or more) in postgresql.conf and "
                "restart Postgres (it cannot be changed without a restart) before adding a sink "
                "to the job; or keep this table the job's only sink",
            )
        columns = self._read_columns(conn)
        if columns is None:
            if not self.config.create_table:
                raise self._missing()
            return
        self._columns = columns
        self._check_privileges(conn)
        if self.context.policy.adds_columns:
            self._check_owner(conn)
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
            if not allowed("SELECT has_table_privilege(%s, %s)", self.config.qualified, p)
        ]
        if self.config.mode == "upsert" and not allowed(
            "SELECT has_schema_privilege(%s, 'CREATE')", self.config.schema_name
        ):
            missing.append(f"CREATE ON SCHEMA {self.config.schema_name} (staging tables)")
        if missing:
            raise config_error(
                self.context,
                f"the job's user lacks {', '.join(missing)} on {self.config.table}",
                fix=f"GRANT {', '.join(m for m in missing if ' ' not in m)} ON "
                f"{self.config.table} TO <the job's user>",
            )

    def _check_owner(self, conn: psycopg.Connection[Any]) -> None:
        """Schema evolution alters the table, which only its owner's role may."""
        row = conn.execute(
            "SELECT pg_has_role(c.relowner, 'USAGE'), pg_get_userbyid(c.relowner)::text "
            "FROM pg_class c WHERE c.oid = %s::regclass",
            (self.config.qualified,),
        ).fetchone()
        if row is not None and not row[0]:
            raise config_error(
                self.context,
                f"schema_evolution='add_columns' alters {self.config.table}, which only its "
                f"owner ({row[1]}) may: the job's user is not a member of that role",
                fix=f"GRANT {row[1]} TO <the job's user>, or ALTER TABLE {self.config.table} "
                "OWNER TO <the job's user>, or leave schema_evolution out (new columns are "
                "then refused)",
            )

    def _check_upsert_key(
        self, conn: psycopg.Connection[Any], columns: dict[str, TableColumn]
    ) -> None:
        absent = [k for k in self.config.key if k not in columns]
        if absent:
            raise config_error(
                self.context,
                f"upsert key columns {absent} are not in {self.config.table}",
                fix=f"name columns of the table in key= (it has {sorted(columns)})",
            )
        indexes = conn.execute(
            "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = %s::regclass AND i.indisunique GROUP BY i.indexrelid",
            (self.config.qualified,),
        ).fetchall()
        if sorted(self.config.key) not in [sorted(r[0]) for r in indexes]:
            raise config_error(
                self.context,
                f"upsert on {list(self.config.key)} needs a unique index on exactly those "
                f"columns of {self.config.table}",
                fix=f"CREATE UNIQUE INDEX ON {self.config.table} ({', '.join(self.config.key)})",
            )

    # -- per batch -----------------------------------------------------------------------------
    def columns_for(
        self, batch: pa.RecordBatch, epoch: int, evolve: Evolve | None = None
    ) -> dict[str, TableColumn]:
        """The table's columns, checked against the batch's schema (once per schema); the
        table is created from it first when it is missing and create_table is set. With
        `evolve` (schema_evolution="add_columns"), the changes `columns.evolution` finds are
        made first by `evolve(changes)`, which returns the table's columns after them."""
        if self.checked_schema is None or not batch.schema.equals(self.checked_schema):
            self._refuse_bad_names(batch.schema, epoch)  # before a table is made from them
        if self._columns is None:
            self._columns = self._read_columns(self._connect())
            if self._columns is None:
                if not self.config.create_table:
                    raise self._missing(epoch)
                self._create(batch.schema, epoch)
                self._columns = self._read_columns(self._connect())
                assert self._columns is not None
        if self.checked_schema is None or not batch.schema.equals(self.checked_schema):
            if evolve is not None:
                changes = evolution(batch.schema, self._columns)
                if changes:
                    self._columns = evolve(changes)
            problems = mismatches(batch.schema, self._columns)
            if problems:
                raise SchemaMismatchError(
                    f"the batch does not fit table {self.config.table}: "
                    + "; ".join(p.problem for p in problems),
                    job=self.context.job_id,
                    sink=self.context.sink,
                    epoch=epoch,
                    fix="; ".join(f"{p.fix}" for p in problems)
                    + "; nothing of the epoch was committed",
                )
            self.checked_schema = batch.schema
        return self._columns

    def cast_up(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Schema evolution: `batch` with columns narrower than the table's cast up
        (`columns.cast_up`); as given while the table is not there yet."""
        if self._columns is None:
            self._columns = self._read_columns(self._connect())
        return batch if self._columns is None else cast_up(batch, self._columns)

    def _refuse_bad_names(self, schema: pa.Schema, epoch: int) -> None:
        """Column names Postgres cannot hold as given: with a NUL, or longer than 63 bytes
        (it would silently cut them, so two could become one or a batch miss its column)."""
        bad = [
            f"{name!r} ({'a NUL character' if chr(0) in name else f'{len(name.encode())} bytes'})"
            for name in schema.names
            if chr(0) in name or len(name.encode()) > MAX_IDENTIFIER_BYTES
        ]
        if bad:
            raise SchemaMismatchError(
                f"the batch's column names cannot be Postgres column names: {', '.join(bad)}",
                job=self.context.job_id,
                sink=self.context.sink,
                epoch=epoch,
                fix=f"rename them in the query (at most {MAX_IDENTIFIER_BYTES} bytes of UTF-8, "
                "no NUL): df.withColumnRenamed(...); nothing of the epoch was written",
            )

    def _create(self, schema: pa.Schema, epoch: int) -> None:
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
                job=self.context.job_id,
                sink=self.context.sink,
                epoch=epoch,
                fix="cast the column to a type docs/postgres.md maps, or create the table yourself",
            ) from None
        # A dead-letter table's key names each dead letter once (core/bad_rows.py): a row
        # written twice would be refused rather than duplicated.
        key_columns = self.config.key or (
            DEAD_LETTER_KEY if schema.names == dead_letter_schema().names else ()
        )
        key = (
            sql.SQL(", PRIMARY KEY ({})").format(
                sql.SQL(", ").join(map(sql.Identifier, key_columns))
            )
            if key_columns
            else sql.SQL("")
        )
        # Another worker (executor mode) may create it at the same moment: Postgres then
        # refuses the second CREATE on a catalog row (the table's or its row type's name,
        # "type ... already exists") once the first has committed, so the table is there.
        with contextlib.suppress(
            psycopg.errors.UniqueViolation,
            psycopg.errors.DuplicateObject,
            psycopg.errors.DuplicateTable,
        ):
            self._connect().execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}{})").format(
                    self.identifier, sql.SQL(", ").join(columns), key
                )
            )

    # -- schema evolution ----------------------------------------------------------------------
    def evolve(
        self,
        conn: psycopg.Connection[Any],
        changes: list[Evolution],
    ) -> dict[str, TableColumn]:
        """Make `changes` to the table in one ALTER TABLE, on `conn`, waiting at most
        EVOLUTION_LOCK_TIMEOUT_S for the table's lock (a lock time-out is a TransientError:
        nothing of the change was made). `conn` is the epoch's session (the change commits or
        rolls back with the epoch) or an autocommit one (committed at once). The changes are
        read again from the catalog first: another participant may have made them. Returns
        the table's columns as `conn` now sees them."""
        found = self._read_columns(conn) or {}
        wanted = [c for c in changes if c.needed(found)]
        if wanted:
            clauses = alter_clauses(wanted)
            timeout = sql.Literal(f"{round(EVOLUTION_LOCK_TIMEOUT_S * 1000)}ms")
            if conn.autocommit:
                with conn.transaction():
                    conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(timeout))
                    conn.execute(sql.SQL("ALTER TABLE {} {}").format(self.identifier, clauses))
            else:
                conn.execute(
                    sql.SQL(
                        "SET LOCAL lock_timeout = {t}; ALTER TABLE {n} {c}; "
                        "SET LOCAL lock_timeout TO DEFAULT"
                    ).format(t=timeout, n=self.identifier, c=clauses)
                )
        columns = self._read_columns(conn)
        assert columns is not None
        return columns

    def forget(self) -> None:
        """Read the table's columns again before the next batch (an epoch that changed them
        was rolled back)."""
        self._columns = None
        self.checked_schema = None

    # -- helpers -------------------------------------------------------------------------------
    def _read_columns(self, conn: psycopg.Connection[Any]) -> dict[str, TableColumn] | None:
        found = conn.execute("SELECT to_regclass(%s)", (self.config.qualified,)).fetchone()
        if not found or found[0] is None:
            return None
        rows = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull, atthasdef "
            "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (self.config.qualified,),
        ).fetchall()
        return {r[0]: TableColumn(r[0], r[1], r[2], r[3]) for r in rows}

    def _missing(self, epoch: int | None = None) -> ConfigError:
        return config_error(
            self.context,
            f"table {self.config.table} does not exist",
            epoch=epoch,
            fix="create it, or set create_table=True to create it from the first batch's schema",
        )


def alter_clauses(changes: list[Evolution]) -> sql.Composable:
    """The actions of an ALTER TABLE making `changes`."""
    return sql.SQL(", ").join(_clause(c) for c in changes)


def _clause(change: Evolution) -> sql.Composable:
    name = sql.Identifier(change.column)
    if change.kind == "add":
        return sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(name, sql.SQL(change.type))
    return sql.SQL("ALTER COLUMN {} TYPE {}").format(name, sql.SQL(change.type))


def refuse_foreign_prepared(
    conn: psycopg.Connection[Any], context: OpenContext, prefix: str
) -> None:
    """Refuse to start when a transaction this sink prepared (gid starting with `prefix`)
    belongs to another role and the job's user is no superuser: Postgres lets only the role
    that prepared a transaction, or a superuser, commit or roll it back, so recovery could
    not finish it (checked before anything is written)."""
    rows = conn.execute(
        "SELECT gid, owner::text FROM pg_prepared_xacts WHERE database = current_database() "
        "AND starts_with(gid, %s) AND owner <> current_user "
        "AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) ORDER BY gid",
        (prefix,),
    ).fetchall()
    if rows:
        owners = sorted({owner for _, owner in rows})
        raise config_error(
            context,
            f"{len(rows)} prepared transaction(s) of this sink (e.g. {rows[0][0]!r}) belong to "
            f"role(s) {', '.join(owners)}, not to the job's user: Postgres lets only the role "
            "that prepared a transaction, or a superuser, commit or roll it back",
            fix=f"run the job (or `durable-sinks resolve`) as {owners[0]} (or a superuser) "
            "until they are resolved; a job keeps one Postgres role for its whole life "
            "(docs/security.md, rotating credentials: change the password, not the role)",
        )
