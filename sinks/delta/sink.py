"""Exactly-once rows in a Delta Lake table, one Delta commit per epoch (docs/delta.md).

- Phase 1 (`write_batch`, `pre_commit`): each participant writes Parquet files under the
  table's folder (append; Hive-style partition folders) or its staging folder (upsert). They
  are in no log version, so no reader sees them. Before each file is created the
  participant's journal lists it; `pre_commit` rewrites the journal with the whole handle
  (the files' `add` actions: path, size, partition values, stats).
- Phase 2: `commit_epoch` has nothing to move (the files are in place). `publish_epoch` makes
  the epoch's one log commit from every decided participant: their files as `add` actions
  (append) or a MERGE of their rows by key (upsert), with the application transaction
  `txn(appId=<job and sink>, version=<epoch>)` in the same commit. An epoch whose version the
  table already records is not committed again. Then the journals (and staged rows) go.
- Rollback: the participant's files and journal are deleted; never a file the table
  references.
- Recovery reads the journals only: a prepared participant of an older generation is handed
  to the coordinator; a half-written one (no handle yet) is deleted here; leftovers of an
  epoch the table records are cleaned up.
- `last_committed_epoch` is the table's transaction version for the job's sink.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from durable_sinks.core.errors import (
    ConfigError,
    CorruptRecordError,
    DurableSinkError,
    SchemaMismatchError,
)
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Bookkeeping, Holding, Prepared
from durable_sinks.core.protocol import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.sink_base import SinkBase, Step

from . import checks, errors, operations, recovery
from .committer import Committer
from .config import Delta
from .handles import (
    PREPARED,
    WRITING,
    DeltaHandleDetails,
    handle_shapes,
    paths_of,
)
from .journal import Journals
from .layout import Layout, app_id
from .shape import (
    Shape,
    conflicts,
    conform,
    creatable,
    evolved,
    normalised_schema,
)
from .storage import TableStorage
from .table import DeltaLog
from .writer import DeltaParticipant, checksum

if TYPE_CHECKING:
    import pyarrow as pa


#: The table property after which Delta drops a transaction identifier (the commit record).
TXN_RETENTION = "delta.setTransactionRetentionDuration"


class DeltaSink(SinkBase[Delta]):
    """Exactly-once appends or upserts into one Delta table (see the module docs)."""

    def __init__(self, config: Delta) -> None:
        super().__init__(config, counters=("files",))
        self.storage = TableStorage(config)
        self._layout: Layout | None = None
        self._log: DeltaLog | None = None
        self._journals: Journals | None = None
        self._committer: Committer | None = None
        #: The shape this epoch's rows are written in: the table's, with the columns this
        #: epoch added (schema evolution); before the table exists, the first batch's.
        self._shape: Shape | None = None
        #: The table's shape as last read or committed by this sink.
        self._table_shape: Shape | None = None
        self._current: DeltaParticipant | None = None
        self._pending: ParticipantName | None = None
        #: Where the next `expire_markers` starts removing epoch folders (None: it lists).
        self._expired_below: int | None = None
        #: A decided epoch's commit may run on another thread while this instance writes the
        #: next (commits_beside_writes): the log (DeltaLog and its cached table) is used under
        #: `_log_lock`; the shapes and the epoch begun change under `_shape_lock`.
        self._log_lock = threading.RLock()
        self._shape_lock = threading.Lock()

    def _target(self) -> str:
        return f"path={self.storage.where!r}"

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._opening(context)
        self._layout = Layout(context.job_id, self.name)
        self._log = DeltaLog(
            self.storage,
            app_id(context.job_id, self.name),
            self.config.commit_retries,
            self.logger(),
        )
        self._journals = Journals(self, self.storage, self._layout)
        self._committer = Committer(
            self, self.storage, self._log, self._journals, self._committed_up_to
        )
        # Read from the log's tail, not loaded (snapshot.py): the start does not grow with
        # the table's files. The first epoch's commit loads the table (DeltaLog.latest).
        snapshot = self._client_call(self._delta().snapshot, "read the table's log")
        if snapshot is None and not self.config.create_table and not context.inspect:
            raise ConfigError(
                f"no Delta table at {self.storage.where}",
                job=context.job_id,
                sink=self.name,
                fix="create the table first, or set create_table=True to create it from the "
                "first epoch's rows",
            )
        if snapshot is not None:
            self._shape = self._table_shape = snapshot.shape
            self._last_committed = snapshot.committed_epoch
            problems = checks.table_problems(self.config, snapshot)
            if problems:
                raise ConfigError(
                    f"the Delta table at {self.storage.where} cannot take this sink's rows: "
                    + "; ".join(problems),
                    job=context.job_id,
                    sink=self.name,
                    fix="point the sink at a table that fits, or change the sink's settings",
                )
        if context.worker or context.inspect:
            return
        self._client_call(lambda: checks.check_store(self.config, self.storage), "check the store")

    def close(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.abandon()

    def commit_record_kept(self) -> bool:
        """KeepsCommitRecord: the sink's commit record is the table's transaction identifier
        for the job and sink, which Delta drops once it is older than the table's
        `delta.setTransactionRetentionDuration`, when the table sets one: then no record is
        no evidence. A missing table keeps nothing and so forgets nothing."""
        with self.translated("read the table's properties"):
            table = self._delta().load()
        return table is None or TXN_RETENTION not in table.metadata().configuration

    def _read_last_committed(self) -> int | None:
        # A reread (what the open read looks short of the job's newest decision) loads the
        # table: the answer the log's tail cannot get wrong (a checkpoint hint that lags a
        # newer checkpoint whose older commits were cleaned up, say).
        with self.translated("read the table's committed epoch"):
            return self._delta().committed_epoch()

    def _delta(self) -> DeltaLog:
        if self._log is None:
            raise self._not_open()
        return self._log

    def _paths(self) -> Layout:
        if self._layout is None:
            raise self._not_open()
        return self._layout

    def _journal(self) -> Journals:
        if self._journals is None:
            raise self._not_open()
        return self._journals

    def _phase2(self) -> Committer:
        if self._committer is None:
            raise self._not_open()
        return self._committer

    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        return errors.translate(exc, step, self)

    def capabilities(self) -> SinkCapabilities:
        merging = self.config.mode == "upsert"
        return SinkCapabilities(
            exactly_once=True,
            idempotent=merging,
            upsert=merging,
            two_phase_commit=True,
            resumable_prepare=True,
            distributed_prepare=True,
            partitioned=True,
            schema_evolution=True,
            commits_beside_writes=True,
        )

    def schema(self) -> pa.Schema | None:
        return self._shape.schema if self._shape is not None else None

    def health_check(self) -> None:
        """Read the table's log (its checkpoint hint: the open read the log's tail)."""
        with self._log_lock:
            self._client_call(self._delta().reach, "read the table's log")

    # -- phase 1 -------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        """Begin writing `epoch` in the table's shape as of this sink's last commit. With the
        previous epoch's commit still running (commits_beside_writes) that may be the shape
        before it: `check_participants` then refuses, before the decision, files whose
        columns conflict with what that commit made."""
        if self._current is not None:  # a failed attempt whose rollback did not run
            with self._log_lock:
                self._phase2().delete_participant(self._current.name, self._current.abandon())
            self._current = None
        with self._shape_lock:
            self._shape = self._table_shape  # columns a failed attempt added are not the table's
            self._pending = self._next_participant(epoch)

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        name = self._require_epoch()
        shape = self._shape_for(batch, name.epoch)
        # With add_columns an append takes rows without a column an epoch added (null);
        # a merge would overwrite the column's values with null, so it still refuses them.
        fill = self.context.policy.adds_columns and self.config.mode == "append"
        fitted, problems = conform(batch, shape, fill_missing=fill)
        if fitted is None:
            raise self._mismatch(problems, name.epoch)
        if self.config.mode == "upsert":
            nulls = [k for k in self.config.key if fitted.column(k).null_count]
            if nulls:
                raise self._mismatch([f"key column {k!r} holds null" for k in nulls], name.epoch)
        if fitted.num_rows == 0:
            return WriteResult(0, 0)
        current = self._current or self._start(name, shape)
        written = self._client_call(lambda: current.write(fitted), "write a data file", name.epoch)
        self._count("rows", fitted.num_rows)
        self._count("bytes", written)
        return WriteResult(fitted.num_rows, int(written))

    def _require_epoch(self) -> ParticipantName:
        if self._pending is None:
            raise self._no_epoch()
        return self._pending

    def _shape_for(self, batch: pa.RecordBatch, epoch: int) -> Shape:
        """The table's shape; before the table exists, the first batch's (normalised). With
        schema evolution (add_columns), the batch's new columns are added to it for this
        epoch: its files hold them and its commit adds them to the table's schema."""
        if self._shape is not None and self.context.policy.adds_columns:
            shape, problems = evolved(self._shape, batch.schema)
            if problems:
                raise self._mismatch(problems, epoch)
            if shape is not self._shape:
                self._shape = shape
                if self._current is not None:  # files begun in the older shape are done
                    self._client_call(
                        lambda: self._current.reshape(shape) if self._current else None,
                        "finish the data files",
                        epoch,
                    )
        if self._shape is None:
            schema = normalised_schema(batch.schema)
            problems = creatable(schema, self.config.partition_by)
            problems += [
                f"key column {k!r} is not in the rows"
                for k in self.config.key
                if k not in schema.names
            ]
            if problems:
                raise self._mismatch(problems, epoch)
            self._shape = Shape(schema, self.config.partition_by)
        return self._shape

    def _mismatch(self, problems: Sequence[str], epoch: int) -> SchemaMismatchError:
        adding = self.context.policy.adds_columns
        return SchemaMismatchError(
            f"the rows do not fit the Delta table at {self.storage.where}: " + "; ".join(problems),
            **self.where(epoch),
            fix="select and cast the columns to the table's schema in the query (Delta types: "
            "docs/delta.md)"
            + ("" if adding else ", or let new columns be added: schema_evolution='add_columns'")
            + "; nothing of the epoch was committed",
        )

    def _start(self, name: ParticipantName, shape: Shape) -> DeltaParticipant:
        self._current = DeltaParticipant(
            self.storage,
            self._paths(),
            name,
            shape,
            staged=self.config.mode == "upsert",
            compression=self.config.compression,
            max_file_bytes=self.config.max_file_bytes,
            announce=lambda paths: self._journal().write(name, {"state": WRITING, "paths": paths}),
        )
        return self._current

    def pre_commit(self, epoch: int) -> CommitHandle:
        ctx = self.context
        name = self._require_epoch()
        current, self._current = self._current, None
        files = self._client_call(current.finish, "finish the data files", epoch) if current else []
        schema = None
        if self._shape is not None:
            from deltalake import Schema

            schema = Schema.from_arrow(self._shape.schema).to_json()
        details = DeltaHandleDetails(
            files=tuple(files),
            job_id=ctx.job_id,
            mode=self.config.mode,
            partition_by=self._shape.partition_by if self._shape else (),
            schema=schema,
        )
        handle = CommitHandle(
            sink=self.name,
            epoch=epoch,
            participant=str(name),
            rows=sum(int(f["rows"]) for f in files),
            bytes=sum(int(f["size"]) for f in files),
            checksum=checksum(files),
            details=details.to_json(),
        )
        if files:
            self._client_call(
                lambda: self._journal().write(
                    name, {"state": PREPARED, "handle": handle.to_json()}
                ),
                "write the participant's journal",
                epoch,
            )
        self._count("files", len(files))
        with self._shape_lock:
            self._pending = None
        return handle

    def check_participants(self, epoch: int, handles: Sequence[CommitHandle]) -> None:
        """Refuse an epoch whose files cannot all join the table (ChecksParticipants): a
        column two participants added with different types, or added with a type other
        than the one the table got meanwhile (the previous epoch's commit, running beside
        this epoch's writes, or a task that read the table before it), files partitioned
        otherwise than the table; in upsert mode also rows without one of the table's
        columns (the merge would set it to null). The table's shape is the one this sink
        last read or committed."""
        with self._shape_lock:
            table_shape = self._table_shape
        problems = conflicts(
            table_shape, handle_shapes(handles), complete=self.config.mode == "upsert"
        )
        if problems:
            raise self._mismatch(problems, epoch)

    # -- phase 2: committer.py -----------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        """The participant's files are in place already (the epoch's log commit is
        `publish_epoch`'s): ALREADY_COMMITTED once the table records the epoch, else
        COMMITTED. A participant of this coordinator's own generation (the live path:
        `_of_this_generation`) is trusted as its handle says, with no request per file; one
        of an older generation (recovery, or an older coordinator's decision being finished)
        is COMMITTED only while its files are there (Committer.commit)."""
        if self._last_committed is not None and self._last_committed >= epoch:
            return CommitOutcome.ALREADY_COMMITTED
        with self._log_lock:
            return self._phase2().commit(
                epoch, handle, check_files=not self._of_this_generation(handle)
            )

    def publish_epoch(self, epoch: int, handles: Sequence[CommitHandle]) -> CommitOutcome:
        with self._log_lock:
            made, shape = self._phase2().publish(epoch, handles, self._table_shape)
            self._committed_up_to(epoch)
        if shape is not None:
            with self._shape_lock:
                self._table_shape = shape
                if self._pending is None:  # no epoch being written in an older shape
                    self._shape = shape
        if made:
            self._count("epochs_committed")
        return CommitOutcome.COMMITTED if made else CommitOutcome.ALREADY_COMMITTED

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        """Delete the participant's files and journal (a participant never prepared: what
        this instance wrote of it). Never deletes a file the table references."""
        committer = self._phase2()
        if handle is None:
            pending = self._pending
            current, self._current = self._current, None
            with self._log_lock:
                if current is not None and current.name.epoch == epoch:
                    committer.delete_participant(current.name, current.abandon())
                elif pending is not None and pending.epoch == epoch:
                    committer.delete_participant(pending, [])
            with self._shape_lock:
                self._pending = None
                self._shape = self._table_shape
            return
        name = ParticipantName.parse(handle.participant)
        if name is None:
            raise CorruptRecordError(
                f"commit handle names participant {handle.participant!r}, not a durable-sinks "
                "participant name",
                **self.where(epoch),
                fix="this handle was not made by the Delta sink",
            )
        with self._log_lock:
            committer.delete_participant(name, paths_of(handle))
        self._count("rollbacks")

    # -- recovery: recovery.py -----------------------------------------------------------------
    def recover_prepared(self) -> list[CommitHandle]:
        journals, committer = self._journal(), self._phase2()
        return recovery.leftovers(self, self._delta(), journals, committer)

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        return recovery.prepared_of_epoch(self._journal(), epoch)

    # -- operations (durable-sinks status/inspect/verify; operations.py) -----------------------
    def in_doubt(self) -> list[Prepared]:
        journals = self._journal()
        return operations.in_doubt(journals.under(self._paths().folder), self.name)

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        # Loaded once per open and kept (DeltaLog.latest): the health check, recovery and
        # the first epoch catch up from it instead of replaying the log again.
        table = self._client_call(self._delta().latest, "read the table's log")
        return {} if table is None else operations.holdings(table, first, last)

    def live_generations(self) -> list[int]:
        return []  # a table keeps no sessions

    def expire_markers(self, before_epoch: int) -> int:
        """ExpiringSink: on a local table, remove the emptied journal folders
        `_durable_sinks/<job>/<sink>/e<epoch>/` (one per epoch: a commit deletes the journals,
        the folder stays) of epochs below `before_epoch`, never the last committed epoch's;
        a folder that still holds something (a participant recovery has not settled) stays.
        The first call of an opened sink lists the sink's folder once, later ones remove by
        name from where the previous one stopped. The table's log and data are not touched
        (the commit record is the log's `txn`). On S3 (no folders) nothing is kept: 0.
        Returns how many folders were removed."""
        _ = self.context  # UsageError before open
        last = self.last_committed_epoch()
        if self.config.on_s3 or last is None:
            return 0
        with self.translated("expire the emptied journal folders"):
            removed, self._expired_below = operations.expire_epoch_folders(
                self.storage, self._paths(), min(before_epoch, last), self._expired_below
            )
        return removed

    def drop_job(self, *, apply: bool, epoch_markers: bool = False) -> list[Bookkeeping]:
        """What is left in the sink's folder `_durable_sinks/<job>/<sink>/` (staged rows no
        journal names, emptied epoch folders: operations.drop_leftovers), removed with
        `apply`; and the application transaction (`txn`) of the job's commits in the Delta
        log, kept: it cannot be removed without rewriting the table's history. (Journals of
        prepared participants are in doubt: `durable-sinks drop` refuses before it gets
        here.)"""
        _ = self.context  # UsageError before open
        with self.translated("remove the job's leftovers"):
            left = operations.drop_leftovers(self.storage, self._paths(), apply=apply)
        return [
            *left,
            Bookkeeping(
                "application transaction (txn) in the Delta log",
                f"{self.storage.where} appId={app_id(self.context.job_id, self.name)}",
                kept="part of the table's log: removing it would rewrite the table's history; "
                "checkpoints carry it on, it costs one small entry",
            ),
        ]
