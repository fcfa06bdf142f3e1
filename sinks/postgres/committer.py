"""Phase 2 of the Postgres sink, on the sink's autocommit connection, from a handle alone
(any process, any instance that wrote nothing):

- `commit_prepared`: COMMIT PREPARED of the participant's transaction (its gid is the
  participant's name). One that no longer exists was committed before if the epoch's marker
  row names the participant (ALREADY_COMMITTED); otherwise it was lost or rolled back by
  hand, and the epoch's decision says commit: ParticipantLostError.
- `rollback_prepared`: ROLLBACK PREPARED; one that does not exist was never prepared, or is
  rolled back already.
- `read_decision`: the decision a one-phase commit carried in the epoch's marker row.

psycopg's errors leave these functions raw: the sink's callers translate them
(errors.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from durable_sinks.core.errors import LOST_EPOCHS_DOC, ParticipantLostError
from durable_sinks.core.protocol import JSON, CommitHandle, CommitOutcome

from .fencing import MetaTables
from .handles import PostgresHandleDetails


def commit_prepared(
    conn: psycopg.Connection[Any],
    meta: MetaTables,
    epoch: int,
    handle: CommitHandle,
    where: Mapping[str, Any],
) -> CommitOutcome:
    """COMMIT PREPARED the participant's transaction; `where` names the job, sink and epoch
    of an error."""
    try:
        conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(handle.participant)))
    except psycopg.errors.UndefinedObject:
        part = PostgresHandleDetails.of(handle).part
        if meta.marker_participant(conn, epoch, part) == handle.participant:
            return CommitOutcome.ALREADY_COMMITTED
        raise ParticipantLostError(
            f"prepared transaction {handle.participant} does not exist and its marker "
            "row is not there, although the epoch's decision says commit: it was "
            "lost (a failover to an asynchronous standby that had not received the "
            "PREPARE, a restore from an older backup) or rolled back by hand "
            "(ROLLBACK PREPARED)",
            **where,
            fix="stop the job; if the old primary's data still exists, `durable-sinks "
            "repair-epochs` commits the epoch from it into this server, otherwise "
            "re-supply the epoch's rows and record the loss (`durable-sinks "
            f"repair-epochs --record-loss`); see {LOST_EPOCHS_DOC}",
        ) from None
    return CommitOutcome.COMMITTED


def rollback_prepared(conn: psycopg.Connection[Any], participant: str) -> bool:
    """ROLLBACK PREPARED the participant's transaction; True if there was one."""
    try:
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(participant)))
    except psycopg.errors.UndefinedObject:
        return False  # never prepared, or already rolled back
    return True


def read_decision(
    conn: psycopg.Connection[Any], meta: MetaTables, epoch: int
) -> Mapping[str, JSON] | None:
    """The decision a one-phase commit of `epoch` carried, or None."""
    return meta.decision(conn, epoch)
