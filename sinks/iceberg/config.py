"""The Iceberg sink's configuration, `durable_sinks.sinks.iceberg.Iceberg`: a frozen,
picklable dataclass checked when it is built (on the driver, before anything connects).
Importing it loads no client."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import check_sink_name
from durable_sinks.core.redaction import MASK, is_secret
from durable_sinks.core.secrets import check, resolve_settings
from durable_sinks.core.settings import apply_conveniences

from .partitioning import PartitionField

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")
#: A password inside a URL (`scheme://user:password@host`).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*:)[^@/\s]*(?=@)")


def redacted(properties: Mapping[str, str]) -> dict[str, str]:
    """Catalog properties safe to show: secret settings (by name) masked, and a password
    inside any URL value (`uri = postgresql+psycopg://user:secret@host/db`) masked."""
    return {
        key: MASK if is_secret(key) else _URL_PASSWORD.sub(rf"\g<head>{MASK}", value)
        for key, value in properties.items()
    }


@dataclass(frozen=True)
class Iceberg:
    """An Apache Iceberg table, through any pyiceberg catalog, as a sink.

    Each epoch's rows are written as Parquet data files under the table's location that no
    snapshot references yet; the epoch's one commit appends them and records the epoch in the
    table property `durable-sinks.<job>.<sink>.epoch`, in the same transaction (docs/iceberg.md).
    """

    kind: ClassVar[str] = "iceberg"

    table: str
    """The table's name within `namespace`. Required."""
    namespace: str
    """The table's namespace (dotted for nested ones). It must exist. Required."""
    catalog: Mapping[str, str] = field(default_factory=dict, repr=False)
    """pyiceberg catalog properties, e.g. `{"type": "sql", "uri":
    "postgresql+psycopg://...", "warehouse": "file:///data/warehouse"}` or a REST catalog's.
    Values may be `${env:NAME}` references; secrets are never shown."""
    catalog_name: str = "default"
    """The catalog's name (for a SQL catalog: the `catalog_name` column its tables are kept
    under; give the name Spark's catalog has to share the tables with it)."""
    name: str = "iceberg"
    """The sink's name within the job. Default "iceberg"."""
    create_table: bool = False
    """Create the table from the first batch's schema if it does not exist (partitioned by
    `partition_by`). Default False: a missing table is a ConfigError at start."""
    partition_by: tuple[str, ...] = ()
    """The partition fields of a table the sink creates, as in Spark SQL's `PARTITIONED BY`:
    a column (identity), `year(ts)`, `month(ts)`, `day(ts)`, `hour(ts)` (or the plural
    `days(ts)` ...), `bucket(16, id)`, `truncate(4, name)`. An existing table keeps its own
    spec, and a different one is refused at start. Default (): unpartitioned."""
    commit_retries: int = 10
    """How often an epoch's commit that lost a race with another writer is retried, each
    time after re-reading the table and re-checking the epoch. Default 10."""
    keep_snapshots: int | None = None
    """House-keeping after the epoch's commit: once the table holds more than
    `keep_snapshots` + half as many again snapshots, every snapshot but the newest
    `keep_snapshots` (and those a branch or tag points at) is expired, in one commit of the
    table's metadata (no data file is deleted). An epoch's commit grows with the table's
    snapshot count (docs/iceberg.md), this keeps it bounded. It expires every writer's
    snapshots, not only the job's: time travel reaches back `keep_snapshots` snapshots, an
    expired epoch no longer shows in `durable-sinks verify`, and the files of its losing
    attempts are left to orphan-file removal. Default None: nothing expired."""

    def __post_init__(self) -> None:
        apply_conveniences(self)
        where = f"iceberg sink {self.name!r}"
        check_sink_name(self.name, where)
        for what, value in (("table", self.table), ("catalog_name", self.catalog_name)):
            if not isinstance(value, str) or not _NAME.match(value) or "." in value:
                raise ConfigError(
                    f"{where}: {what} {value!r} must be a plain name (letters, digits, _ and -)",
                    fix=f"{what}='events'",
                )
        if not isinstance(self.namespace, str) or not all(
            _NAME.match(part) for part in self.namespace.split(".")
        ):
            raise ConfigError(
                f"{where}: namespace {self.namespace!r} must be a name (dotted when nested)",
                fix="namespace='analytics'",
            )
        if not isinstance(self.catalog, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.catalog.items()
        ):
            raise ConfigError(
                f"{where}: catalog must map pyiceberg catalog properties to strings",
                fix="catalog={'type': 'sql', 'uri': 'postgresql+psycopg://...', "
                "'warehouse': 'file:///data/warehouse'}",
            )
        if not self.catalog:
            raise ConfigError(
                f"{where}: catalog is empty (pyiceberg would look for ~/.pyiceberg.yaml)",
                fix="give the catalog's properties: catalog={'type': 'rest', 'uri': ...}",
            )
        for key, value in self.catalog.items():
            check(value, f"{where}: catalog[{key!r}]")
        fields = [PartitionField.parse(entry, where) for entry in self.partition_by]
        if len(set(fields)) != len(fields):
            raise ConfigError(
                f"{where}: partition_by {list(self.partition_by)!r} names a field twice",
                fix="give each partition field once",
            )
        if not isinstance(self.commit_retries, int) or not 0 <= self.commit_retries <= 1000:
            raise ConfigError(
                f"{where}: commit_retries must be between 0 and 1000",
                fix="leave the default (10)",
            )

        if self.keep_snapshots is not None and (
            not isinstance(self.keep_snapshots, int)
            or isinstance(self.keep_snapshots, bool)
            or not 1 <= self.keep_snapshots <= 1_000_000
        ):
            raise ConfigError(
                f"{where}: keep_snapshots must be a number of snapshots (1 or more) or None",
                fix="keep_snapshots=100, or leave it unset to expire nothing",
            )

    @property
    def partition_fields(self) -> tuple[PartitionField, ...]:
        """`partition_by`, parsed (checked when the configuration was built)."""
        return tuple(PartitionField.parse(entry, self.name) for entry in self.partition_by)

    @property
    def identifier(self) -> tuple[str, ...]:
        return (*self.namespace.split("."), self.table)

    @property
    def where(self) -> str:
        """The table, for messages: `catalog_name.namespace.table`."""
        return ".".join((self.catalog_name, self.namespace, self.table))

    def catalog_properties(self) -> dict[str, Any]:
        """The catalog's properties with their secret references resolved (never log them)."""
        return dict(resolve_settings(self.catalog, f"iceberg sink {self.name!r}: catalog"))

    def __repr__(self) -> str:
        return (
            f"Iceberg(table={self.where!r}, name={self.name!r}, catalog={redacted(self.catalog)!r})"
        )
