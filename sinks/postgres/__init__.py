"""Postgres: prepared transactions, binary COPY from Arrow, epoch markers, fencing, append and
upsert (docs/postgres.md). `sink` holds the protocol's methods; `config`, `catalog` (the
table's checks), `fencing` (marker and fence tables), `load` (COPY and merge), `columns`
(Arrow to Postgres types) and `errors` (psycopg's errors translated) the pieces they use.

Importing this package loads only the configuration (no client): `PostgresSink` loads
psycopg when first used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable_sinks.core.kinds import SinkKind
from durable_sinks.core.protocol import SinkConnector

from .config import Postgres, PostgresSinkConfig

if TYPE_CHECKING:
    from .sink import PostgresSink


def _build(config: Postgres) -> SinkConnector:
    from .sink import PostgresSink

    return PostgresSink(config)


#: The kind `durable_sink("postgres", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("postgres", Postgres, _build)


def __getattr__(name: str) -> Any:
    if name == "PostgresSink":
        from .sink import PostgresSink

        return PostgresSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["KIND", "Postgres", "PostgresSink", "PostgresSinkConfig"]
