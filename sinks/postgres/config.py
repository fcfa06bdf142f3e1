"""The Postgres sink's configuration: a picklable dataclass checked when it is built (on the
driver, before anything connects)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict

from durable_sinks.core.connecting import connect_timeout
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.redaction import redact
from durable_sinks.core.secrets import check

#: What the sink accepts as a schema, table, column or meta-schema name (unquoted).
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


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
    connect_timeout: int | None = None

    def __post_init__(self) -> None:
        where = f"postgres sink {self.name!r}"
        if not self.dsn:
            raise ConfigError(f"{where}: `dsn` is empty", fix="give a libpq connection string")
        check(self.dsn, f"{where}: dsn")
        try:
            conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError:
            raise ConfigError(
                f"{where}: `dsn` is not a valid connection string",
                fix="use 'host=... port=... dbname=... user=...' or a postgresql:// URI",
            ) from None
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
        if self.participants_in_flight < 1:
            raise ConfigError(
                f"{where}: participants_in_flight must be >= 1",
                fix="leave the default, or give how many prepared transactions the job may "
                "hold at once",
            )

    @property
    def connect_timeout_s(self) -> int:
        """The connection time-out in effect (the option, the DSN's, or 10 s)."""
        return connect_timeout(self.dsn, self.connect_timeout)

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
            f"PostgresSinkConfig(dsn={redact(self.dsn)!r}, table={self.table!r}, "
            f"name={self.name!r}, mode={self.mode!r})"
        )
