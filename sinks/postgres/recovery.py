"""What a restart of the Postgres sink finds, on its autocommit connection: the last
committed epoch (the newest marker row, fencing.py) and the participants left prepared
(pg_prepared_xacts, each gid being its participant's name: job, sink, epoch, part,
generation and attempt). An older generation's prepared transactions are handed to the
coordinator, which commits the decided ones and rolls back the rest.

psycopg's errors leave these functions raw: the sink's callers translate them
(errors.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg

from durable_sinks.core.naming import ParticipantName, owner_prefix
from durable_sinks.core.protocol import CommitHandle

from .fencing import MetaTables
from .handles import PostgresHandleDetails


def last_committed(conn: psycopg.Connection[Any], meta: MetaTables) -> int | None:
    return meta.last_committed(conn)


def _prepared(
    conn: psycopg.Connection[Any], job_id: str, sink: str, prefix: str
) -> Iterator[tuple[ParticipantName, CommitHandle]]:
    """Prepared transactions of the job's sink whose gid starts with `prefix`."""
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND starts_with(gid, %s) ORDER BY gid",
        (prefix,),
    ).fetchall()
    for (gid,) in rows:
        name = ParticipantName.parse(gid)
        if name is not None and name.owned_by(job_id, sink):
            details = PostgresHandleDetails(name.part).to_json()
            yield name, CommitHandle.leftover(sink, name.epoch, gid, details)


def leftovers(
    conn: psycopg.Connection[Any], job_id: str, sink: str, generation: int
) -> list[CommitHandle]:
    """The transactions older generations of the job's sink left prepared."""
    return [
        handle
        for name, handle in _prepared(conn, job_id, sink, owner_prefix(job_id, sink))
        if name.generation < generation
    ]


def prepared_of_epoch(
    conn: psycopg.Connection[Any], job_id: str, sink: str, epoch: int
) -> list[CommitHandle]:
    """Every prepared transaction of the job's sink for `epoch`, of any generation."""
    prefix = f"{owner_prefix(job_id, sink)}{epoch}:"
    return [h for name, h in _prepared(conn, job_id, sink, prefix) if name.epoch == epoch]
