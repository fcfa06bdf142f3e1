"""What `durable-sinks` reads from Postgres (core/operations.py): prepared transactions of the
job and sink, its marker rows per epoch, the sessions of running coordinators; the expiry of
old marker rows, and the removal of a retired job's marker and fence rows (`drop`). Every
query but the expiry and an applied drop only reads."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from durable_sinks.core.naming import ParticipantName, owner_prefix
from durable_sinks.core.operations import Bookkeeping, Holding, Prepared
from durable_sinks.core.protocol import CommitHandle, OpenContext

from .fencing import GENERATION_IN_NAME, MetaTables, owner_token


def in_doubt(conn: psycopg.Connection[Any], context: OpenContext) -> list[Prepared]:
    """Every prepared transaction of the job and sink, any generation, with its age."""
    rows = conn.execute(
        "SELECT gid, extract(epoch FROM now() - prepared)::float8 FROM pg_prepared_xacts "
        "WHERE database = current_database() AND starts_with(gid, %s) ORDER BY gid",
        (owner_prefix(context.job_id, context.sink),),
    ).fetchall()
    found = []
    for gid, age in rows:
        name = ParticipantName.parse(gid)
        if name is None or not name.owned_by(context.job_id, context.sink):
            continue
        handle = CommitHandle.leftover(context.sink, name.epoch, gid, {"part": name.part})
        found.append(Prepared(handle, f"prepared transaction {gid}", age_s=float(age)))
    return found


def holdings(
    conn: psycopg.Connection[Any], meta: MetaTables, first: int, last: int
) -> dict[int, Holding]:
    """The marker rows of epochs `first..last`: participants, rows, when committed. The
    table's own rows carry no epoch, so rows are the markers' (not counted on the data)."""
    context = meta.context
    try:
        rows = conn.execute(
            sql.SQL(
                "SELECT epoch, array_agg(participant ORDER BY participant), sum(rows)::bigint, "
                "extract(epoch FROM max(committed_at))::float8 FROM {} "
                "WHERE job_id = %s AND sink = %s AND epoch BETWEEN %s AND %s GROUP BY epoch"
            ).format(meta.markers),
            (context.job_id, context.sink, first, last),
        ).fetchall()
    except psycopg.errors.UndefinedTable:
        conn.rollback()
        return {}  # the job never opened the sink here
    return {
        int(epoch): Holding(
            int(epoch), marker=True, participants=frozenset(names), rows=int(total), at=at
        )
        for epoch, names, total, at in rows
    }


def last_committed(conn: psycopg.Connection[Any], meta: MetaTables) -> int | None:
    """The highest epoch with a marker row (None without the table)."""
    try:
        return meta.last_committed(conn)
    except psycopg.errors.UndefinedTable:
        conn.rollback()
        return None


def live_generations(conn: psycopg.Connection[Any], context: OpenContext) -> list[int]:
    """Generations of the job and sink with a session open now (a running coordinator or
    worker; the `durable-sinks` command's own sessions end in `:cli` and do not count)."""
    rows = conn.execute(
        "SELECT application_name FROM pg_stat_activity WHERE application_name ~ %s "
        "AND pid <> pg_backend_pid()",
        (f":{owner_token(context)}:g[0-9]+$",),
    ).fetchall()
    found = {int(m.group(1)) for (name,) in rows if (m := GENERATION_IN_NAME.search(name))}
    return sorted(found)


def expire_markers(conn: psycopg.Connection[Any], meta: MetaTables, before_epoch: int) -> int:
    """Delete the marker rows of epochs below `before_epoch`, always keeping the newest epoch's
    (which `last_committed_epoch` reads). Returns how many rows were deleted."""
    context = meta.context
    try:
        cursor = conn.execute(
            sql.SQL(
                "DELETE FROM {m} WHERE job_id = %s AND sink = %s AND epoch < least(%s, "
                "(SELECT max(epoch) FROM {m} WHERE job_id = %s AND sink = %s))"
            ).format(m=meta.markers),
            (context.job_id, context.sink, before_epoch, context.job_id, context.sink),
        )
    except psycopg.errors.UndefinedTable:
        conn.rollback()
        return 0
    return cursor.rowcount


def drop_job(conn: psycopg.Connection[Any], meta: MetaTables, *, apply: bool) -> list[Bookkeeping]:
    """The job and sink's rows in the marker and fence tables (the tables are shared by every
    job of the meta schema and stay); with `apply`, deleted in one transaction. The user's
    table is not touched. A missing table holds nothing."""
    context = meta.context
    owner = (context.job_id, context.sink)
    found = []
    with conn.transaction():
        for table, what in ((meta.markers, "marker rows"), (meta.fences, "fence row")):
            try:
                with conn.transaction():  # a savepoint: a missing table spoils nothing else
                    count = _drop_rows(conn, table, owner, apply=apply)
            except psycopg.errors.UndefinedTable:
                continue  # the job never opened the sink here
            if count:
                found.append(Bookkeeping(what, table.as_string(conn), count))
    return found


def _drop_rows(
    conn: psycopg.Connection[Any], table: sql.Identifier, owner: tuple[str, str], *, apply: bool
) -> int:
    """How many rows of (job, sink) `table` holds; with `apply`, deleted."""
    if apply:
        query = sql.SQL("DELETE FROM {} WHERE job_id = %s AND sink = %s").format(table)
        return conn.execute(query, owner).rowcount
    query = sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s AND sink = %s").format(table)
    row = conn.execute(query, owner).fetchone()
    return int(row[0]) if row is not None else 0
