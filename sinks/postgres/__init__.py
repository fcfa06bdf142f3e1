"""Postgres: prepared transactions, binary COPY from Arrow, epoch markers, fencing, append and
upsert (docs/postgres.md). `sink` holds the protocol's methods; `config`, `catalog` (the
table's checks), `fencing` (marker and fence tables), `load` (COPY and merge), `columns`
(Arrow to Postgres types) and `errors` (psycopg's errors translated) the pieces they use.

Importing this package loads only the configuration (no client): `PostgresSink` loads
psycopg when first used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_sinks.core.kinds import Deferred, SinkKind, deferred_members

from .config import Postgres

if TYPE_CHECKING:
    from .sink import PostgresSink

#: The kind `durable_sink("postgres", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("postgres", Postgres, Deferred(f"{__name__}.sink", "PostgresSink"))

__getattr__ = deferred_members(__name__, {"PostgresSink": ".sink"})

__all__ = ["KIND", "Postgres", "PostgresSink"]
