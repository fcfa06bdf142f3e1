"""Choosing a decision store from what a user writes in a job's options."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from durable_sinks.core.errors import ConfigError

from ._file_store import LocalDirectoryStore
from ._store import DecisionStore

_LIBPQ_KEYWORD = re.compile(r"(^|\s)(host|hostaddr|dbname|user|port|service)\s*=")


def is_postgres_dsn(text: str) -> bool:
    """True for a postgresql:// URI or a libpq `key=value` connection string."""
    return text.startswith(("postgresql://", "postgres://")) or bool(_LIBPQ_KEYWORD.search(text))


def store_from(target: str | os.PathLike[str] | DecisionStore) -> DecisionStore:
    """A decision store from `target`: a store as is, a Postgres DSN (table in `public`), or
    the path of a local directory (on storage that survives the machine: fsync and link
    must work there)."""
    if isinstance(target, DecisionStore):
        return target
    if isinstance(target, str) and is_postgres_dsn(target):
        from .postgres import PostgresDecisionStore

        return PostgresDecisionStore(target)
    if isinstance(target, str | os.PathLike) and str(target).strip():
        return LocalDirectoryStore(target)
    raise ConfigError(
        f"decision_store must be a directory path, a Postgres DSN or a DecisionStore, not "
        f"{type(target).__name__}",
        fix="decision_store='/durable/volume/my-job' or decision_store='postgresql://...'",
    )


def default_store_for(kind: str, config: Mapping[str, Any]) -> DecisionStore | None:
    """The store a job may use when it names none: one next to a sink that can host it (a
    Postgres sink's database, in the sink's meta schema). None when `kind` cannot."""
    if kind != "postgres" or not isinstance(config.get("dsn"), str):
        return None
    from .postgres import PostgresDecisionStore

    table = str(config.get("table", ""))
    schema = config.get("meta_schema") or (table.split(".")[0] if "." in table else "public")
    # Its errors say where it lives: the user never named this store.
    name = str(config.get("name", kind))
    timeout = config.get("connect_timeout")
    return PostgresDecisionStore(
        config["dsn"],
        schema=str(schema),
        connect_timeout=timeout if isinstance(timeout, int) else None,
        where=f"the job's decision store, in the database of postgres sink {name!r}",
    )
