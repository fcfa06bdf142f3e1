"""Postgres: two-phase commit with PREPARE TRANSACTION, binary COPY from Arrow, epoch markers,
fencing, append and upsert. This module holds the protocol's methods; the pieces they use are
the configuration (config), the target table's checks (catalog), the marker and fence tables
(fencing), the COPY/merge path (load) and the error translation (errors).

What is durable when:
- `pre_commit`: the epoch's rows and its marker row (job, sink, epoch, part, participant,
  rows, checksum) are in a prepared transaction named by the participant (the gid): durable,
  surviving crashes and restarts of Postgres, invisible to readers;
- `commit_epoch`: `COMMIT PREPARED` makes rows and marker visible at once. A gid that no longer
  exists whose marker row names it was committed before: ALREADY_COMMITTED;
- one-phase (the job's only sink, `commit_with_decision`): rows, marker and the decision
  commit in one plain transaction; nothing is ever prepared.

Fencing: see fencing.py. The DSN may hold a password: it is never logged, put in an error, a
handle or a marker; `repr` and messages show it redacted.

Faults: no psycopg error leaves a method (errors.translate, through the sink base's
`translated`). A session lost to a restart of
the server, `pg_terminate_backend` or the network is a TransientError (UnreachableError when
a new session cannot be opened) naming the server (`host:port/db`) and the step, except during
the three statements whose outcome it leaves unknown: PREPARE TRANSACTION (pre_commit), COMMIT
PREPARED (commit_epoch) and the one-phase COMMIT (commit_with_decision) raise InDoubtError.
Both are retriable: a new coordinator (new sessions, a new generation, recovery) replays the
epoch, and recovery or the replay settles what is in doubt. A session found closed is
reopened by the next call that needs it; the epoch's transaction is never silently carried
over to a new session (it died with the old one: the call that finds it gone fails).
`close` never raises, even when the server is gone.

Sessions: every session the sink opens carries an application_name (fencing.application_name)
`ds:<job>:<sink>:<owner>:g<generation>`, cut to Postgres's 63 bytes: `<owner>` (12 hex digits
of a hash of job and sink) and the generation always survive the cut; the DSN's own
application_name, when it sets one, replaces `ds:<job>:<sink>`. Operators find a job's
sessions with `application_name LIKE 'ds:<job>:%'` (the decision store's are
`ds:<job>:store`).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from durable_sinks.clients.postgres import bounded_connect, connection_failure, server_of
from durable_sinks.core.bad_rows import BadRowsError, RefusedRows
from durable_sinks.core.errors import (
    LOST_EPOCHS_CAUSES,
    LOST_EPOCHS_DOC,
    CommittedEpochLostError,
    ConfigError,
    DurableSinkError,
    SchemaMismatchError,
    UsageError,
)
from durable_sinks.core.naming import ParticipantName, owner_prefix
from durable_sinks.core.operations import (
    Bookkeeping,
    DecidedCommit,
    EpochRepair,
    Holding,
    Prepared,
)
from durable_sinks.core.protocol import (
    JSON,
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.secrets import resolve
from durable_sinks.core.sink_base import SinkBase, Step

from . import committer, errors, operations, recovery
from .catalog import TargetTable, refuse_foreign_prepared
from .columns import Evolution, TableColumn, bad_values
from .config import Postgres
from .errors import PostgresStep, bad_rows_fix, first_line
from .fencing import MetaTables, application_name
from .handles import PostgresHandleDetails
from .repair import EpochCopy, record_lost_epochs
from .waits import SiblingWatch
from .writer import PostgresParticipant

if TYPE_CHECKING:
    import pyarrow as pa


#: How long an executor's part waits for a row lock (a key held by another transaction)
#: before its epoch fails with a TransientError (see `_tx_conn`).
WORKER_LOCK_TIMEOUT_S = 30


@dataclass(frozen=True)
class _Opened:
    """What `open` sets up for one generation."""

    context: OpenContext
    meta: MetaTables
    table: TargetTable


class PostgresSink(SinkBase[Postgres]):
    """Exactly-once into one Postgres table, through prepared transactions."""

    KEEPS_COMMIT_RECORD = True

    def __init__(self, config: Postgres) -> None:
        super().__init__(config, counters=("columns_changed", "isolation_copies"))
        self._opened: _Opened | None = None
        self._admin: psycopg.Connection[Any] | None = None
        self._tx: psycopg.Connection[Any] | None = None
        #: The extra sessions `commit_participants` commits on, beside the admin session.
        self._committers: list[psycopg.Connection[Any]] = []
        self._current: PostgresParticipant | None = None
        #: Epochs whose transaction changed the table's columns (schema evolution): their
        #: rollback makes the table's columns be read again.
        self._evolved: set[int] = set()

    def _target(self) -> str:
        return f"table={self.config.table!r}"

    # -- connections and errors ----------------------------------------------------------------
    def _state(self) -> _Opened:
        if self._opened is None:
            raise self._not_open()
        return self._opened

    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        ctx = self.context
        try:
            return bounded_connect(
                resolve(self.config.dsn, f"postgres sink {self.name!r}: dsn"),
                statement_timeout_s=self.config.statement_timeout_s,
                lock_timeout_s=self.config.lock_timeout_s,
                autocommit=autocommit,
                connect_timeout=self.config.effective_connect_timeout_s,
                application_name=application_name(ctx, ctx.generation, self.config.dsn),
            )
        except psycopg.OperationalError as exc:
            raise connection_failure(
                first_line(exc), self.config.dsn, job=ctx.job_id, sink=self.name
            ) from None

    def _passwords(self) -> tuple[str, ...]:
        """The DSN's passwords, which a refusal's message (the server's words) must not show."""
        params = conninfo_to_dict(resolve(self.config.dsn, f"postgres sink {self.name!r}: dsn"))
        return tuple(str(params[k]) for k in ("password", "sslpassword") if params.get(k))

    def _admin_conn(self) -> psycopg.Connection[Any]:
        if self._admin is None or self._admin.closed:
            self._admin = self._session(autocommit=True, replacing=self._admin is not None)
        return self._admin

    def _session(self, *, autocommit: bool, replacing: bool) -> psycopg.Connection[Any]:
        """A new session; one that replaces a lost one is first checked to reach a server
        holding every epoch this sink committed (`_check_epochs_held`), and dropped if not
        (so the next replacement is checked again)."""
        conn = self._connect(autocommit=autocommit)
        if replacing:
            try:
                self._check_epochs_held(conn)
                if not autocommit:
                    conn.commit()
            except BaseException:
                conn.close()
                raise
        return conn

    def _tx_conn(self) -> psycopg.Connection[Any]:
        if self._tx is None or self._tx.closed:
            self._tx = self._session(autocommit=False, replacing=self._tx is not None)
            if self.context.worker:
                # A part's rows may wait on keys that a dead attempt of the same part holds in
                # a prepared transaction (a unique index): only the driver's decision, which
                # waits for this part, would end it. Waiting a bounded time turns that into a
                # TransientError; the driver's next attempt recovers (rolls the dead attempt
                # back) and writes the batch.
                self._tx.execute(
                    sql.SQL("SET lock_timeout = {}").format(
                        sql.Literal(f"{WORKER_LOCK_TIMEOUT_S * 1000}ms")
                    )
                )
                self._tx.commit()
        return self._tx

    def _check_epochs_held(self, conn: psycopg.Connection[Any]) -> None:
        """On a session that replaced a lost one (the driver's, once open): the server must
        still hold every epoch this sink committed. A reconnect may reach another server
        than the lost session's (a promoted standby, by a multi-host DSN); one that lagged
        lacks the last commits, and epochs committed after it would hide the gap from the
        checks at the next start: CommittedEpochLostError, before anything more is written.
        Markers are expired oldest first, never the newest, so a lower newest marker is a
        loss. One query per reconnect."""
        ctx = self.context
        held = self._last_committed
        if ctx.worker or ctx.inspect or self._opened is None or held is None:
            return
        found = self._opened.meta.last_committed(conn)
        if found is not None and found >= held:
            return
        first = 0 if found is None else found + 1
        lost = f"epoch {held}" if first == held else f"epochs {first}..{held}"
        raise CommittedEpochLostError(
            f"the server this sink reconnected to ({server_of(self.config.dsn)}) no longer "
            f"holds {lost}, which this sink committed (their marker rows are gone: the newest "
            f"is {'none' if found is None else f'epoch {found}'}); likely causes: "
            f"{LOST_EPOCHS_CAUSES}",
            **self.where(held),
            first_lost=first,
            last_lost=held,
            holder=self.name,
            fix=f"stop the job and repair {lost} of postgres sink {self.name!r} before "
            "restarting: `durable-sinks repair-epochs` copies them from the old primary's data "
            "if it still exists, else re-supply their rows and record the loss (`durable-sinks "
            f"repair-epochs --record-loss`); see {LOST_EPOCHS_DOC}",
        )

    def _step(
        self,
        call: str,
        epoch: int | None = None,
        *,
        in_doubt: str | None = None,
        in_epoch: bool = False,
    ) -> PostgresStep:
        """A Postgres step for the base's `translated`: `call` names the protocol call and
        its statement; `in_doubt` is the fix of an InDoubtError, for a statement whose
        outcome a lost session leaves unknown; `in_epoch` says the statements run in the
        epoch's own transaction."""
        return PostgresStep(call, epoch, in_doubt, server_of(self.config.dsn), in_epoch)

    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        return errors.translate(exc, step, self)

    def fence_moved(self) -> bool:
        """Whether a newer generation holds the fence, read on a fresh session (False when
        the server cannot tell)."""
        ctx = self.context
        try:
            with bounded_connect(
                resolve(self.config.dsn, f"postgres sink {self.name!r}: dsn"),
                statement_timeout_s=self.config.statement_timeout_s,
                lock_timeout_s=self.config.lock_timeout_s,
                autocommit=True,
                connect_timeout=self.config.effective_connect_timeout_s,
                application_name=application_name(ctx, ctx.generation, self.config.dsn),
            ) as conn:
                found = self._state().meta.fence_generation(conn)
        except psycopg.Error:
            return False
        return found is not None and found > ctx.generation

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._opening(context)
        if context.policy.isolates and self.config.mode == "upsert":
            raise ConfigError(
                "on_bad_rows='dead_letter' is not supported with mode='upsert': the rows the "
                "server refuses (keys, constraints, triggers) show only when the epoch's rows "
                "are merged at pre-commit, after the dead letters are written",
                **self.where(),
                fix="use mode='append' with a dead-letter sink, or on_bad_rows='fail' with "
                "mode='upsert' (and filter bad rows in the query)",
            )
        self._opened = opened = _Opened(
            context,
            MetaTables(self.config, context),
            TargetTable(self.config, context, self._admin_conn),
        )
        if context.worker:
            # The driver's instance created the tables and raised the fence; a worker only
            # connects (begin_epoch checks the fence still names this generation).
            with self.translated(self._step("open")):
                self._tx_conn()
            return
        if context.inspect:  # an operator's tool: read only (operations.py)
            with self.translated(self._step("open (reading the marker rows)")):
                self._last_committed = operations.last_committed(self._admin_conn(), opened.meta)
            return
        with self.translated(self._step("open (tables, fence, last committed epoch)")):
            conn = self._admin_conn()
            opened.table.check_schemas(conn)  # before anything is created in them
            refuse_foreign_prepared(conn, context, owner_prefix(context.job_id, self.name))
            opened.table.check()  # settings and privileges, before the marker tables exist
            opened.meta.create(conn)
            opened.meta.take_over(conn)
            self._last_committed = opened.meta.last_committed(conn)
            self._tx_conn()  # the epochs' session, opened now rather than in the first epoch

    def close(self) -> None:
        """Close both sessions (an open epoch transaction rolls back with its session); never
        raises, even when the server or the network is gone."""
        for conn in (self._tx, self._admin, *self._committers):
            if conn is not None and not conn.closed:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
        self._tx = self._admin = None
        self._committers = []
        self._current = None

    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(
            exactly_once=True,
            two_phase_commit=True,
            resumable_prepare=True,
            distributed_prepare=True,
            upsert=self.config.mode == "upsert",
            idempotent=self.config.mode == "upsert",
            partitioned=True,
            schema_evolution=True,
            commits_beside_writes=True,
        )

    def schema(self) -> pa.Schema | None:
        return None if self._opened is None else self._opened.table.checked_schema

    def health_check(self) -> None:
        """A coordinator's `open` has just checked the server's settings, the table and the
        privileges, before creating anything (not again here); a worker's or an operator's
        open did not, so they are checked now."""
        ctx = self.context
        if ctx.worker or ctx.inspect:
            with self.translated(
                self._step("health_check (the server's settings, the table, privileges)")
            ):
                self._state().table.check()

    # -- phase 1 -------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        state = self._state()
        if self._current is not None:
            self._abandon_transaction()
        name = self._next_participant(epoch)
        self._current = current = PostgresParticipant(epoch, name, self.config, state.context)
        with self.translated(self._step("begin_epoch (the fence check)", epoch, in_epoch=True)):
            current.session = self._tx_conn()
            state.meta.check_fence(current.session, epoch)
            if state.context.policy.isolates:
                # Deferred constraints are checked at each COPY, where the rows breaking them
                # can be isolated, rather than at PREPARE, where they could only fail the epoch.
                current.session.execute("SET CONSTRAINTS ALL IMMEDIATE")
                current.secrets = self._passwords()

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        current = self._require_current()
        if current.handle is not None:
            raise UsageError(
                "the epoch was pre-committed; no more batches", **self.where(current.epoch)
            )
        with self.translated(self._step("write_batch (COPY)", current.epoch, in_epoch=True)):
            table = self._state().table
            evolve = None
            if self.context.policy.adds_columns:
                evolve = self._evolve
                batch = table.cast_up(batch)  # same rows: refusals name the batch given
            columns = table.columns_for(batch, current.epoch, evolve)
            refused = bad_values(batch, columns)
            try:
                kept = self._refuse(batch, refused, current.epoch)
            except BadRowsError as exc:  # fail policy: say how to fix each column
                raise BadRowsError(
                    exc.message,
                    refused=refused,
                    **self.where(current.epoch),
                    fix=bad_rows_fix(refused, self.config),
                ) from None
            if kept.num_rows == 0:
                return WriteResult(0, 0, refused)
            if not self.context.policy.isolates:
                with self._siblings_watched(current):
                    written, sent = kept.num_rows, current.copy(current.conn(), kept)
            else:
                before = current.isolation_copies
                with self._siblings_watched(current):
                    written, sent, by_server = current.copy_isolating(current.conn(), kept)
                self._count("isolation_copies", current.isolation_copies - before)
                if by_server:
                    self._count("refused_rows", len(by_server))
                    refused = refused.merged(_through(by_server, refused, batch.num_rows))
        self._count("rows", written)
        self._count("bytes", sent)
        return WriteResult(written, sent, refused)

    def _evolve(self, changes: list[Evolution]) -> dict[str, TableColumn]:
        """Schema evolution (docs/postgres.md, "Schema evolution"). The driver's instance
        changes the table inside the epoch's transaction: the new column or wider type
        prepares, commits and rolls back with the epoch's rows. A worker (executor mode)
        changes it in a short transaction of its own, committed before the part's COPY: a
        prepared part holding the table's ACCESS EXCLUSIVE lock would block every other part
        of the epoch until the decision, which needs them all. Either way the ALTER waits at
        most catalog.EVOLUTION_LOCK_TIMEOUT_S for the lock (then TransientError)."""
        current = self._require_current()
        table = self._state().table
        if self.context.worker:
            if current.rows:
                # Its own transaction holds the table's lock since its first COPY: an ALTER on
                # another session would wait on it.
                raise SchemaMismatchError(
                    f"the batches of part {current.name.part} changed columns after its first "
                    f"COPY ({', '.join(c.column for c in changes)}): in executor mode a part "
                    "adds columns before it writes",
                    **self.where(current.epoch),
                    fix="give every batch of a partition the same columns (Spark does), or "
                    "run the query in driver mode; nothing of the epoch was committed",
                )
            columns = table.evolve(self._admin_conn(), changes)
        else:
            columns = table.evolve(current.conn(), changes)
            self._evolved.add(current.epoch)
            # The change ran under the dead-letter mode's savepoint: released before the
            # next COPY, so that a refused row never rolls it back.
            current.seal_next = current.savepoint != "none"
        current.evolve_stage(current.conn(), changes)
        self._count("columns_changed", len(changes))
        return columns

    def pre_commit(self, epoch: int) -> CommitHandle:
        current = self._require_current()
        state = self._state()
        gid = str(current.name)
        with self.translated(
            self._step("pre_commit (the merge and the marker row)", epoch, in_epoch=True)
        ):
            conn = current.conn()
            if state.table.checked_schema is not None:
                with self._siblings_watched(current):
                    current.merge(conn, state.table.checked_schema.names)
            if not state.context.commit_point:
                self._mark(conn, current, gid, current.checksum_text, decision=None)
        if not state.context.commit_point:
            in_doubt = (
                f"whether {gid} was prepared is known once the server answers; no decision "
                "was recorded, so recovery (a new coordinator, or the query's restart) rolls "
                "it back if it exists and the replay writes the epoch again"
            )
            with self.translated(
                self._step(f"pre_commit (PREPARE TRANSACTION {gid})", epoch, in_doubt=in_doubt)
            ):
                conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        handle = CommitHandle(
            self.name,
            epoch,
            gid,
            current.rows,
            current.bytes,
            current.checksum_text,
            PostgresHandleDetails(current.name.part).to_json(),
        )
        if state.context.commit_point:
            current.handle = handle  # stays open until commit_with_decision
        else:
            self._current = None
        return handle

    @contextlib.contextmanager
    def _siblings_watched(self, current: PostgresParticipant) -> Iterator[None]:
        """Around a worker's statement that may wait on a key (the COPY into the table, the
        upsert's merge): a wait on a key that another slice of the epoch holds prepared ends
        at once in SchemaMismatchError (waits.py), rather than at the lock time-out and again
        in every retry. Nothing for the driver's instance, whose epoch is one transaction."""
        if not self.context.worker:
            yield
            return
        conn = current.conn()
        connect = functools.partial(self._connect, autocommit=True)
        log = self.logger(current.epoch)
        with SiblingWatch(current.name, conn.info.backend_pid, connect, log) as watch:
            try:
                yield
            except psycopg.errors.QueryCanceled:
                if watch.sibling is None:
                    raise
        if watch.sibling is not None:
            raise self._key_in_two_slices(current, watch.sibling)

    def _key_in_two_slices(
        self, current: PostgresParticipant, holder: ParticipantName
    ) -> SchemaMismatchError:
        key = self.config.key if self.config.mode == "upsert" else ()
        what = (
            f"an upsert key ({', '.join(key)})"
            if key
            else "a value of a primary key or unique index of the table"
        )
        dedup = (
            f"df.dropDuplicates([{', '.join(repr(k) for k in key)}])"
            if key
            else "df.dropDuplicates([<the unique columns>])"
        )
        return SchemaMismatchError(
            f"the epoch holds {what} more than once, in two Spark partitions: part "
            f"{current.name.part} waits on a row that part {holder.part} holds in its prepared "
            "transaction, and in executor mode each partition keeps its rows apart until the "
            "driver's decision, which waits for both",
            **self.where(current.epoch),
            fix=f"deduplicate by key in the query, e.g. {dedup} (a key twice in one batch is "
            "refused in driver mode too); nothing of the epoch was committed",
        )

    def _mark(
        self,
        conn: psycopg.Connection[Any],
        current: PostgresParticipant,
        participant: str,
        checksum: str,
        decision: str | None,
    ) -> None:
        self._state().meta.write_marker(
            conn,
            current.epoch,
            current.name.part,
            participant,
            current.rows,
            checksum,
            decision,
        )

    def _require_current(self) -> PostgresParticipant:
        if self._current is None:
            raise self._no_epoch()
        return self._current

    # -- phase 2: committer.py -----------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        outcome = self._commit_on(self._admin_conn(), epoch, handle)
        self._committed(epoch, [outcome])
        return outcome

    def commit_participants(
        self, epoch: int, handles: Sequence[CommitHandle]
    ) -> list[CommitOutcome]:
        """COMMIT PREPARED of each handle on up to `commit_sessions` sessions at once (the
        admin session and extra ones, each opened by its worker when missing and checked
        like a replacement session to reach a server holding every committed epoch): the
        server groups their WAL flushes."""
        workers = min(self.config.commit_sessions, len(handles))
        if workers <= 1:
            return super().commit_participants(epoch, handles)
        admin = self._admin_conn()
        extra = [c for c in self._committers if not c.closed][: workers - 1]
        sessions: list[psycopg.Connection[Any] | None] = [admin, *extra]
        sessions += [None] * (workers - len(sessions))

        def session(slot: int) -> psycopg.Connection[Any]:
            conn = sessions[slot]
            if conn is None:  # opened in its worker's thread, beside the others' commits
                with self.translated(self._step("open a session to commit on", epoch)):
                    conn = sessions[slot] = self._session(autocommit=True, replacing=True)
            return conn

        def commit(handle: CommitHandle) -> Callable[[int], CommitOutcome]:
            return lambda slot: self._commit_on(session(slot), epoch, handle)

        try:
            outcomes = self._commit_concurrently([commit(h) for h in handles], workers)
        finally:
            kept = [c for c in sessions[1:] if c is not None and not c.closed]
            rest = [c for c in self._committers if c not in kept and not c.closed]
            self._committers = kept + rest
        self._committed(epoch, outcomes)
        return outcomes

    def _commit_on(
        self, conn: psycopg.Connection[Any], epoch: int, handle: CommitHandle
    ) -> CommitOutcome:
        in_doubt = (
            f"the epoch is decided: committing {handle.participant} again (the coordinator's "
            "retry, the epoch's replay or recovery at the next start) finishes it; a second "
            "COMMIT PREPARED of a committed one finds its marker row"
        )
        call = f"commit_epoch (COMMIT PREPARED {handle.participant})"
        with self.translated(self._step(call, epoch, in_doubt=in_doubt)):
            return committer.commit_prepared(
                conn, self._state().meta, epoch, handle, self.where(epoch)
            )

    def _committed(self, epoch: int, outcomes: Sequence[CommitOutcome]) -> None:
        self._committed_up_to(epoch)
        committed = sum(outcome is CommitOutcome.COMMITTED for outcome in outcomes)
        if committed:
            self._count("epochs_committed", committed)
            self._evolved.discard(epoch)

    # -- one-phase commit (the job's only sink carries the decision) ----------------------------
    def commit_with_decision(
        self, epoch: int, handle: CommitHandle, decision: Mapping[str, JSON]
    ) -> None:
        """Write the decision into the epoch's marker row and COMMIT: data, marker and decision
        become durable and visible at once. A lost connection during COMMIT leaves the outcome
        unknown: InDoubtError (read_decision tells, once the server answers again)."""
        current = self._require_current()
        ctx = self.context
        if not ctx.commit_point or current.handle is None or current.handle != handle:
            raise UsageError(
                f"commit_with_decision needs the epoch pre-committed by this sink as the job's "
                f"commit point (participant {handle.participant})",
                job=ctx.job_id,
                sink=self.name,
                epoch=epoch,
            )
        with self.translated(
            self._step("commit_with_decision (the marker row)", epoch, in_epoch=True)
        ):
            conn = current.conn()
            self._mark(conn, current, handle.participant, handle.checksum, json.dumps(decision))
        self._current = None
        in_doubt = (
            f"whether epoch {epoch} committed is known once the server answers: replaying the "
            "epoch or restarting the job reads its marker row, and writes it again only if "
            "it did not commit"
        )
        with self.translated(self._step("commit_with_decision (COMMIT)", epoch, in_doubt=in_doubt)):
            conn.commit()
        self._evolved.discard(epoch)
        self._count("epochs_committed")
        self._committed_up_to(epoch)

    def read_decision(self, epoch: int) -> Mapping[str, JSON] | None:
        """The decision a one-phase commit of `epoch` carried, or None."""
        with self.translated(self._step("read_decision (the marker row)", epoch)):
            return committer.read_decision(self._admin_conn(), self._state().meta, epoch)

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        if epoch in self._evolved:
            self._evolved.discard(epoch)
            self._state().table.forget()
        current = self._current
        if current is not None and (handle is None or handle.participant == str(current.name)):
            self._abandon_transaction()
        if handle is None:
            return
        with self.translated(
            self._step(f"rollback_epoch (ROLLBACK PREPARED {handle.participant})", epoch)
        ):
            if committer.rollback_prepared(self._admin_conn(), handle.participant):
                self._count("rollbacks")

    def _abandon_transaction(self) -> None:
        """Roll back the open (unprepared) transaction, if the session still lives."""
        if self._current is not None and self._current.epoch in self._evolved:
            self._evolved.discard(self._current.epoch)
            self._state().table.forget()
        self._current = None
        if self._tx is not None and not self._tx.closed:
            try:
                self._tx.rollback()
            except psycopg.Error:
                self._tx.close()

    # -- recovery: recovery.py -----------------------------------------------------------------
    def recover_prepared(self) -> list[CommitHandle]:
        ctx = self.context
        with self.translated(self._step("the list of prepared transactions (pg_prepared_xacts)")):
            return recovery.leftovers(self._admin_conn(), ctx.job_id, self.name, ctx.generation)

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        with self.translated(
            self._step("the list of prepared transactions (pg_prepared_xacts)", epoch)
        ):
            return recovery.prepared_of_epoch(
                self._admin_conn(), self.context.job_id, self.name, epoch
            )

    def last_committed_epoch(self) -> int | None:
        self._state()  # UsageError before open
        return super().last_committed_epoch()

    def _read_last_committed(self) -> int | None:
        with self.translated(self._step("read the marker rows")):
            return recovery.last_committed(self._admin_conn(), self._state().meta)

    # -- operations (durable-sinks status/inspect/verify/expire; operations.py) ----------------
    def in_doubt(self) -> list[Prepared]:
        with self.translated(self._step("in_doubt (pg_prepared_xacts)")):
            return operations.in_doubt(self._admin_conn(), self.context)

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        with self.translated(self._step("holdings (the marker rows)")):
            return operations.holdings(self._admin_conn(), self._state().meta, first, last)

    def live_generations(self) -> list[int]:
        with self.translated(self._step("live_generations (pg_stat_activity)")):
            return operations.live_generations(self._admin_conn(), self.context)

    def expire_markers(self, before_epoch: int) -> int:
        with self.translated(self._step("expire_markers (the marker rows)")):
            return operations.expire_markers(self._admin_conn(), self._state().meta, before_epoch)

    def drop_job(self, *, apply: bool, epoch_markers: bool = False) -> list[Bookkeeping]:
        """The job and sink's marker and fence rows (operations.drop_job); the table's rows
        stay. `epoch_markers` changes nothing: the marker rows are the sink's own
        bookkeeping, not what readers of the table read."""
        with self.translated(self._step("drop_job (the marker and fence rows)")):
            return operations.drop_job(self._admin_conn(), self._state().meta, apply=apply)

    # -- repair of lost epochs (durable-sinks repair-epochs; repair.py) ------------------------
    def copy_lost_epochs(
        self, source: str, decided: DecidedCommit, *, apply: bool
    ) -> list[EpochRepair]:
        """The epochs newer than this sink's last committed one that the old server at
        `source` (a DSN of the old primary's data, started alone) holds, copied with their
        marker rows in one transaction (repair.py says how their rows are picked)."""
        old_server = server_of(source)
        with self.translated(self._step(f"copy_lost_epochs (from {old_server})")):
            ctx = self.context
            try:
                old = bounded_connect(
                    resolve(source, "repair-epochs: --from"),
                    statement_timeout_s=self.config.statement_timeout_s,
                    lock_timeout_s=self.config.lock_timeout_s,
                    autocommit=True,
                    connect_timeout=self.config.effective_connect_timeout_s,
                    application_name=application_name(ctx, ctx.generation),
                )
            except psycopg.OperationalError as exc:
                raise connection_failure(
                    first_line(exc), source, job=ctx.job_id, sink=self.name
                ) from None
            with old:
                copy = EpochCopy(
                    self.config, self._state().meta, self._admin_conn(), old, old_server
                )
                return copy.run(decided, apply=apply)

    def record_lost_epochs(self, through: int, note: str, *, apply: bool) -> list[EpochRepair]:
        """Marker rows recording the epochs after the last committed one up to `through` as
        lost (repair.py), in one transaction."""
        with self.translated(self._step("record_lost_epochs (the marker rows)")):
            return record_lost_epochs(
                self._admin_conn(), self._state().meta, through, note, apply=apply
            )


def _through(inner: RefusedRows, outer: RefusedRows, rows: int) -> RefusedRows:
    """`inner`'s rows (indices into a batch of `rows` rows without `outer`'s rows) as
    indices of that batch."""
    if not outer:
        return inner
    import pyarrow as pa
    import pyarrow.compute as pc

    every = pc.indices_nonzero(pc.is_null(pa.nulls(rows)))
    left = pc.invert(pc.is_in(every, pa.array(outer.rows, pa.uint64())))
    kept = pc.indices_nonzero(left)
    mapped = kept.take(pa.array(inner.rows, pa.int64())).to_pylist()
    return RefusedRows(tuple(mapped), inner.refusals)
