"""The Postgres sink's configuration, `durable_sinks.Postgres`: a frozen, picklable dataclass
checked when it is built (on the driver, before anything connects). Importing it loads no
client: the DSN is parsed with psycopg when psycopg is installed, and a missing psycopg is a
ConfigError naming the extra when the sink is built."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from durable_sinks.clients.postgres import (
    SEVERAL_SERVERS_FIX,
    connect_timeout,
    may_reach_a_standby,
    server_of,
)
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.redaction import redact
from durable_sinks.core.secrets import check
from durable_sinks.core.settings import apply_conveniences

#: What the sink accepts as a schema, table, column or meta-schema name (unquoted).
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


@dataclass(frozen=True)
class Postgres:
    """A Postgres table as a sink: `durable_sink(Postgres(dsn=..., table="events"),
    job_id="orders")`.

    Each epoch is one prepared transaction (`PREPARE TRANSACTION`) holding the rows and the
    epoch's marker row; it becomes visible at `COMMIT PREPARED`, after the job's decision
    (docs/postgres.md). Frozen and picklable; checked when built, on the driver, before
    anything connects.
    """

    kind: ClassVar[str] = "postgres"

    dsn: str = field(repr=False)
    """libpq connection string or `postgresql://` URI. May hold a password (never shown in
    logs or errors) or a `${env:NAME}` reference. Required."""
    table: str
    """The target table: `table` (schema `public`) or `schema.table`, plain identifiers
    (letters, digits, `_`, `$`). Required."""
    name: str = "postgres"
    """The sink's name within the job (participant names, markers, logs). Default
    "postgres"; give each sink of a job its own."""
    mode: Literal["append", "upsert"] = "append"
    """`"append"` (default): binary COPY into the table. `"upsert"`: COPY into a per-epoch
    UNLOGGED staging table, then `INSERT ... ON CONFLICT (key) DO UPDATE`, in the same
    transaction (TEMP tables cannot be prepared)."""
    key: tuple[str, ...] = ()
    """The conflict key of upsert mode (refused in append mode): the columns of a unique index
    on exactly these columns of the table. With `create_table`, the new table's primary key."""
    create_table: bool = False
    """Create the table from the first batch's Arrow schema if it is missing. Default False:
    a missing table is a ConfigError at start."""
    meta_schema: str | None = None
    """The schema of the marker table `durable_sinks_epochs` and the fence table
    `durable_sinks_fences` (and of the default decision store). Default: the table's schema."""
    participants_in_flight: int = 2
    """Prepared transactions this sink may hold at once; checked against the server's
    `max_prepared_transactions` at start (two-phase jobs only). Default 2; executor mode needs
    one per partition."""
    commit_sessions: int = 4
    """Sessions the driver commits an epoch's prepared transactions on at once (executor mode:
    one per part), so that the server groups their WAL flushes; opened when an epoch first has
    more than one part to commit. Default 4; 1 commits them one after the other on one
    session."""
    connect_timeout_s: float | None = None
    """Seconds a connection attempt may take (rounded up to whole seconds, libpq's unit), for
    every connection the sink (and the default decision store in its database) opens; given, it
    overrides the DSN's. Default: the DSN's `connect_timeout`, else 10."""
    statement_timeout_s: float | None = 300.0
    """The sessions' `statement_timeout`: the server ends a statement of the sink running
    longer (a TransientError: the batch is rolled back and ridden out as an outage). It also
    bounds every wait for the server: one lasting this + 10 s ends the session as lost, which
    is how a connection that carries nothing is noticed (docs/postgres.md, "Bounded waits").
    Raise it for batches whose COPY or upsert takes longer. None: no statement_timeout set
    (the server's or role's stays) and no bound on waits. Default 300."""
    lock_timeout_s: float | None = 60.0
    """The sessions' `lock_timeout`: a statement waiting longer for a lock (another session's
    `LOCK TABLE`, a migration's `ALTER TABLE`, a long transaction holding a conflicting row)
    ends with a TransientError and the batch is ridden out as an outage. None: not set (the
    server's or role's stays). Default 60."""

    def __post_init__(self) -> None:
        apply_conveniences(self)
        where = f"postgres sink {self.name!r}"
        if not self.dsn:
            raise ConfigError(f"{where}: `dsn` is empty", fix="give a libpq connection string")
        check(self.dsn, f"{where}: dsn")
        _check_dsn(self.dsn, where)
        parts = self.table.split(".")
        if len(parts) > 2 or not all(IDENTIFIER.match(p) for p in parts):
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
            if not IDENTIFIER.match(column):
                raise ConfigError(
                    f"{where}: key column {column!r} is not a plain identifier",
                    fix="name key columns with letters, digits and _ (as in the table)",
                )
        if self.meta_schema is not None and not IDENTIFIER.match(self.meta_schema):
            raise ConfigError(
                f"{where}: meta_schema {self.meta_schema!r} is not an identifier",
                fix="leave it unset (the table's schema) or name a schema with letters, digits "
                "and _",
            )
        if self.connect_timeout_s is not None and not self.connect_timeout_s > 0:
            raise ConfigError(
                f"{where}: connect_timeout_s must be > 0 seconds",
                fix="connect_timeout_s=10, or leave it unset (the DSN's, else 10 s)",
            )
        for option in ("statement_timeout_s", "lock_timeout_s"):
            seconds = getattr(self, option)
            if seconds is not None and not (0 < seconds < float("inf")):
                raise ConfigError(
                    f"{where}: {option} must be > 0 seconds or None",
                    fix=f"leave the default, or give {option}=None for the server's own",
                )
        if self.commit_sessions < 1:
            raise ConfigError(
                f"{where}: commit_sessions must be >= 1",
                fix="leave the default (4), or give 1 to commit on one session",
            )
        if self.participants_in_flight < 1:
            raise ConfigError(
                f"{where}: participants_in_flight must be >= 1",
                fix="leave the default, or give how many prepared transactions the job may "
                "hold at once",
            )

    @property
    def effective_connect_timeout_s(self) -> int:
        """The connection time-out in effect, in whole seconds (the option rounded up, the
        DSN's, or 10 s)."""
        given = self.connect_timeout_s
        return connect_timeout(self.dsn, None if given is None else math.ceil(given))

    @property
    def schema_name(self) -> str:
        return self.table.split(".")[0] if "." in self.table else "public"

    @property
    def table_name(self) -> str:
        return self.table.split(".")[-1]

    @property
    def meta_schema_name(self) -> str:
        """Where the marker and fence tables live."""
        return self.meta_schema or self.schema_name

    @property
    def qualified(self) -> str:
        """The table as a quoted `"schema"."table"` string (for regclass lookups)."""
        return f'"{self.schema_name}"."{self.table_name}"'

    def __repr__(self) -> str:
        return (
            f"Postgres(dsn={redact(self.dsn)!r}, table={self.table!r}, "
            f"name={self.name!r}, mode={self.mode!r})"
        )


def _check_dsn(dsn: str, where: str) -> None:
    """ConfigError unless libpq can read `dsn`. Without psycopg the check waits: building
    the sink then raises the ConfigError naming the `postgres` extra."""
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ModuleNotFoundError:
        return
    try:
        params = conninfo_to_dict(dsn)
    except ProgrammingError:
        raise ConfigError(
            f"{where}: `dsn` is not a valid connection string",
            fix="use 'host=... port=... dbname=... user=...' or a postgresql:// URI",
        ) from None
    if may_reach_a_standby(params):
        raise ConfigError(
            f"{where}: `dsn` names several servers ({server_of(dsn)}) without "
            "target_session_attrs=read-write: libpq could connect to a standby",
            fix=SEVERAL_SERVERS_FIX,
        )
