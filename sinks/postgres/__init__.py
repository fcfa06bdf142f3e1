"""Postgres: prepared transactions, binary COPY from Arrow, epoch markers, fencing, append and
upsert (docs/postgres.md). `sink` holds the protocol's methods; `config`, `catalog` (the
table's checks), `fencing` (marker and fence tables), `load` (COPY and merge), `columns`
(Arrow to Postgres types) and `errors` (psycopg's errors translated) the pieces they use."""

from durable_sinks.core.kinds import SinkKind

from .config import PostgresSinkConfig
from .sink import PostgresSink

#: The kind `durable_sink("postgres", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("postgres", PostgresSinkConfig, PostgresSink)

__all__ = ["KIND", "PostgresSink", "PostgresSinkConfig"]
