"""Putting back committed epochs the sink's server lost (`durable-sinks repair-epochs`;
docs/reliability.md, "Lost committed epochs").

A failover to an asynchronous standby loses the newest transactions the old primary
acknowledged. The old primary's data still has them: started alone (never again as a
primary of the cluster), it is the `source` the lost epochs are copied from.

Which rows an epoch wrote: the sink writes each epoch's rows and its marker row in one
transaction (or, in executor mode, one per part, each with its own marker row), so every row
version that transaction wrote carries its transaction id as `xmin`, the marker row's too.
The rows of a part are the rows whose `xmin` is its marker row's. That is exact only while
those rows are the part's: the copy counts them against the marker row's `rows` and
refuses on a difference (nothing written):
- append: the count must be equal. Fewer means rows were written under savepoints (dead-letter
  mode, whose subtransactions have ids of their own) or changed since by someone else;
- upsert: the count may be lower: a key a later lost epoch wrote again carries that epoch's
  `xmin` and is copied with it (each key once, its last version). Upsert never takes
  savepoints (dead letters are refused with it).
A part left PREPAREd on the old server whose decision says commit is committed there first
(COMMIT PREPARED, on the old server only): its rows then carry its marker's `xmin` as well.

What is durable when: the copy writes every lost epoch's rows and marker rows into the
sink's server in one transaction; when it returns, all of them are committed, or (on any
error) none. The old server is changed only by the COMMIT PREPARED of decided parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from durable_sinks.core.errors import LOST_EPOCHS_DOC, DurableSinkError
from durable_sinks.core.naming import ParticipantName, owner_prefix
from durable_sinks.core.operations import DecidedCommit, EpochRepair
from durable_sinks.core.protocol import CommitHandle

from .config import Postgres
from .fencing import MetaTables
from .handles import PostgresHandleDetails

#: The marker row's `part` of an epoch recorded as lost (no rows of it were written by a job).
LOST_PART = "lost"
#: The marker row's `checksum` of an epoch recorded as lost.
LOST_CHECKSUM = "lost"
#: The staging table an upsert copy merges from (dropped at commit).
STAGE = "ds_repair_rows"


class RepairRefused(DurableSinkError):  # noqa: N818 - reads as what happened
    """The lost epochs cannot be copied exactly; nothing was written."""


@dataclass(frozen=True)
class _Marker:
    epoch: int
    part: str
    participant: str
    rows: int
    checksum: str
    committed_at: Any
    decision: str | None
    xmin: str


class EpochCopy:
    """The copy of one sink's lost epochs from the old server (`old`, autocommit) into the
    sink's server (`new`, a transaction of its own)."""

    def __init__(
        self,
        config: Postgres,
        meta: MetaTables,
        new: psycopg.Connection[Any],
        old: psycopg.Connection[Any],
        old_server: str,
    ) -> None:
        self.config = config
        self.meta = meta
        self.new = new
        self.old = old
        self.old_server = old_server
        self.table = sql.Identifier(config.schema_name, config.table_name)
        context = meta.context
        self.where: dict[str, Any] = {"job": context.job_id, "sink": context.sink}

    def _refused(self, message: str, fix: str, epoch: int | None = None) -> RepairRefused:
        return RepairRefused(
            message, **self.where, epoch=epoch, fix=f"{fix}; see {LOST_EPOCHS_DOC}"
        )

    def run(self, decided: DecidedCommit, *, apply: bool) -> list[EpochRepair]:
        self._require_two_servers()
        held = self.meta.last_committed(self.new)
        after = -1 if held is None else held
        planned: list[EpochRepair] = []
        for handle, decision in self._decided_prepared(after, decided):
            if not apply:
                planned.append(
                    EpochRepair(
                        handle.epoch,
                        1,
                        decision.rows,
                        f"commit prepared transaction {handle.participant} on "
                        f"{self.old_server} (its decision commits it), then copy it",
                    )
                )
                continue
            self._require_writable_old(handle)
            self.old.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(handle.participant)))
        markers = self._old_markers(after)
        if markers:
            self._require_same_columns()
        counts = {m.xmin: self._count(m) for m in markers}
        for marker in markers:
            self._require_exact(marker, counts[marker.xmin], markers)
        copied = _by_epoch(markers, counts, f"copied from {self.old_server}")
        if apply and markers:
            self._copy(markers)
        return sorted([*planned, *copied], key=lambda r: r.epoch)

    # -- what the old server holds -----------------------------------------------------------
    def _require_two_servers(self) -> None:
        """RepairRefused when `old` and `new` are the same database of the same server."""
        query = (
            "SELECT pg_postmaster_start_time()::text, current_database(), current_setting('port')"
        )
        if self.new.execute(query).fetchone() == self.old.execute(query).fetchone():
            raise self._refused(
                f"{self.old_server} is the sink's own database",
                "give the old primary's data (started alone, on another port) as the source",
            )

    def _decided_prepared(
        self, after: int, decided: DecidedCommit
    ) -> list[tuple[CommitHandle, CommitHandle]]:
        """Parts of epochs after `after` left prepared on the old server whose decision
        commits them, with the decision's copy of each. Undecided ones are nobody's loss
        (presumed abort): left alone."""
        context = self.meta.context
        rows = self.old.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
            "AND starts_with(gid, %s) ORDER BY gid",
            (owner_prefix(context.job_id, context.sink),),
        ).fetchall()
        found = []
        for (gid,) in rows:
            name = ParticipantName.parse(gid)
            if name is None or not name.owned_by(context.job_id, context.sink):
                continue
            if name.epoch <= after:
                continue
            details = PostgresHandleDetails(name.part).to_json()
            handle = CommitHandle.leftover(context.sink, name.epoch, gid, details)
            decision = decided(handle)
            if decision is not None:
                found.append((handle, decision))
        return found

    def _require_writable_old(self, handle: CommitHandle) -> None:
        row = self.old.execute("SELECT pg_is_in_recovery()").fetchone()
        if row is not None and row[0]:
            raise self._refused(
                f"epoch {handle.epoch}'s part {handle.participant} is prepared on "
                f"{self.old_server}, which is in recovery (a standby): it cannot be committed "
                "there",
                "start the old primary's data alone, as a primary that no client and no "
                "standby reaches (a copy of its data directory, without standby.signal)",
                handle.epoch,
            )

    def _old_markers(self, after: int) -> list[_Marker]:
        context = self.meta.context
        try:
            rows = self.old.execute(
                sql.SQL(
                    "SELECT epoch, part, participant, rows, checksum, committed_at, decision, "
                    "xmin::text FROM {} WHERE job_id = %s AND sink = %s AND epoch > %s "
                    "ORDER BY epoch, part"
                ).format(self.meta.markers),
                (context.job_id, context.sink, after),
            ).fetchall()
        except psycopg.errors.UndefinedTable:
            raise self._refused(
                f"{self.old_server} has no marker table {self.meta.markers.as_string(self.old)}",
                "give the database the sink wrote to on the old primary",
            ) from None
        return [
            _Marker(int(e), str(part), str(who), int(n), str(checksum), at, decision, str(xmin))
            for e, part, who, n, checksum, at, decision, xmin in rows
        ]

    def _columns(self, conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
        return [
            (str(name), str(kind))
            for name, kind in conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
                "AND attgenerated = '' ORDER BY attnum",
                (self.table.as_string(conn),),
            ).fetchall()
        ]

    def _require_same_columns(self) -> None:
        new, old = self._columns(self.new), self._columns(self.old)
        if sorted(new) != sorted(old):
            missing = sorted(set(old) - set(new))
            raise self._refused(
                f"the table's columns differ: {self.old_server} has {old}, the sink's server "
                f"{new} (a lost epoch may have added {missing})",
                "make the sink's table the same as on the old server first (ALTER TABLE ... "
                "ADD COLUMN as there), then run the repair again",
            )

    def _count(self, marker: _Marker) -> int:
        row = self.old.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE xmin = {}::xid").format(
                self.table, sql.Literal(marker.xmin)
            )
        ).fetchone()
        return 0 if row is None else int(row[0])

    def _require_exact(self, marker: _Marker, found: int, markers: list[_Marker]) -> None:
        later = any(m.epoch > marker.epoch for m in markers)
        upsert = self.config.mode == "upsert"
        if found == marker.rows or (upsert and later and found < marker.rows):
            return
        raise self._refused(
            f"epoch {marker.epoch}'s part {marker.part!r} recorded {marker.rows} rows, but "
            f"{self.old_server} holds {found} rows written by its transaction (xmin "
            f"{marker.xmin}): its rows cannot be picked exactly (rows written under savepoints "
            "with dead letters on, or changed on the old server since); nothing was copied",
            "re-supply the lost epochs' rows from the source and record the loss "
            "(`durable-sinks repair-epochs --record-loss`)",
            marker.epoch,
        )

    # -- the copy ------------------------------------------------------------------------------
    def _copy(self, markers: list[_Marker]) -> None:
        names = [name for name, _ in self._columns(self.new)]
        columns = sql.SQL(", ").join(sql.Identifier(n) for n in names)
        upsert = self.config.mode == "upsert"
        into = sql.Identifier(STAGE) if upsert else self.table
        with self.new.transaction():
            if upsert:
                self.new.execute(
                    sql.SQL(
                        "CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA"
                    ).format(into, columns, self.table)
                )
            for marker in markers:
                out = sql.SQL(
                    "COPY (SELECT {} FROM {} WHERE xmin = {}::xid) TO STDOUT (FORMAT binary)"
                )
                with (
                    self.old.cursor().copy(
                        out.format(columns, self.table, sql.Literal(marker.xmin))
                    ) as source,
                    self.new.cursor().copy(
                        sql.SQL("COPY {} ({}) FROM STDIN (FORMAT binary)").format(into, columns)
                    ) as target,
                ):
                    for data in source:
                        target.write(data)
                if upsert:
                    self._merge(names, columns)
                self._insert_marker(marker)

    def _merge(self, names: list[str], columns: sql.Composable) -> None:
        keys = list(self.config.key)
        rest = [n for n in names if n not in keys]
        action = (
            sql.SQL("DO UPDATE SET ({}) = ROW({})").format(
                sql.SQL(", ").join(sql.Identifier(n) for n in rest),
                sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(sql.Identifier(n)) for n in rest),
            )
            if rest
            else sql.SQL("DO NOTHING")
        )
        self.new.execute(
            sql.SQL("INSERT INTO {t} ({c}) SELECT {c} FROM {s} ON CONFLICT ({k}) {a}").format(
                t=self.table,
                c=columns,
                s=sql.Identifier(STAGE),
                k=sql.SQL(", ").join(sql.Identifier(k) for k in keys),
                a=action,
            )
        )
        self.new.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(STAGE)))

    def _insert_marker(self, marker: _Marker) -> None:
        context = self.meta.context
        self.new.execute(
            sql.SQL(
                "INSERT INTO {} (job_id, sink, epoch, part, participant, rows, checksum, "
                "committed_at, decision) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            ).format(self.meta.markers),
            (
                context.job_id,
                context.sink,
                marker.epoch,
                marker.part,
                marker.participant,
                marker.rows,
                marker.checksum,
                marker.committed_at,
                marker.decision,
            ),
        )


def _by_epoch(markers: list[_Marker], counts: dict[str, int], action: str) -> list[EpochRepair]:
    epochs: dict[int, tuple[int, int]] = {}
    for marker in markers:
        parts, rows = epochs.get(marker.epoch, (0, 0))
        epochs[marker.epoch] = (parts + 1, rows + counts[marker.xmin])
    return [EpochRepair(e, p, r, action) for e, (p, r) in sorted(epochs.items())]


def record_lost_epochs(
    conn: psycopg.Connection[Any], meta: MetaTables, through: int, note: str, *, apply: bool
) -> list[EpochRepair]:
    """Marker rows recording epochs after the last committed one up to `through` as lost
    (part "lost", no rows, `note` as the participant), in one transaction with `apply`.
    Nothing to record when the sink holds `through` already."""
    context = meta.context
    held = meta.last_committed(conn)
    first = 0 if held is None else held + 1
    action = f"recorded as lost ({note})"
    planned = [EpochRepair(epoch, 1, 0, action) for epoch in range(first, through + 1)]
    if apply and planned:
        with conn.transaction():
            for repair in planned:
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (job_id, sink, epoch, part, participant, rows, checksum) "
                        "VALUES (%s, %s, %s, %s, %s, 0, %s)"
                    ).format(meta.markers),
                    (context.job_id, context.sink, repair.epoch, LOST_PART, note, LOST_CHECKSUM),
                )
    return planned
