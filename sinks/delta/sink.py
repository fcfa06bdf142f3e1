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

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import (
    ConfigError,
    CorruptRecordError,
    DurableSinkError,
    ParticipantLostError,
    SchemaMismatchError,
)
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.sink_base import SinkBase, Step

from . import checks, errors, operations
from .config import Delta
from .handles import (
    PREPARED,
    WRITING,
    DeltaHandleDetails,
    files_of,
    handle_shape,
    journal_handle,
    journal_paths,
    last_per_key,
    paths_of,
)
from .layout import Layout, app_id
from .shape import (
    Shape,
    adds_columns,
    conform,
    creatable,
    evolved,
    normalised_schema,
    union,
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
        #: The shape this epoch's rows are written in: the table's, with the columns this
        #: epoch added (schema evolution); before the table exists, the first batch's.
        self._shape: Shape | None = None
        #: The table's shape as last read or committed by this sink.
        self._table_shape: Shape | None = None
        self._current: DeltaParticipant | None = None
        self._pending: ParticipantName | None = None

    def _target(self) -> str:
        return f"path={self.storage.where!r}"

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._opening(context)
        self._layout = Layout(context.job_id, self.name)
        self._log = DeltaLog(
            self.storage, app_id(context.job_id, self.name), self.config.commit_retries
        )
        table = self._client_call(self._delta().load, "read the table's log")
        if table is None and not self.config.create_table and not context.inspect:
            raise ConfigError(
                f"no Delta table at {self.storage.where}",
                job=context.job_id,
                sink=self.name,
                fix="create the table first, or set create_table=True to create it from the "
                "first epoch's rows",
            )
        if table is not None:
            self._shape = self._table_shape = self._delta().shape(table)
            self._last_committed = self._delta().committed_epoch(table)
            problems = checks.table_problems(self.config, self._shape, table)
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
        )

    def schema(self) -> pa.Schema | None:
        return self._shape.schema if self._shape is not None else None

    def health_check(self) -> None:
        self._client_call(self._delta().load, "read the table's log")

    # -- phase 1 -------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        if self._current is not None:  # a failed attempt whose rollback did not run
            self._delete_participant(self._current.name, self._current.abandon())
            self._current = None
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
            announce=lambda paths: self._journal(name, {"state": WRITING, "paths": paths}),
        )
        return self._current

    def _journal(self, name: ParticipantName, content: Mapping[str, Any]) -> None:
        data = json.dumps({"participant": str(name), **content}, sort_keys=True).encode()
        self.storage.write_bytes(self._paths().journal(name), data)

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
                lambda: self._journal(name, {"state": PREPARED, "handle": handle.to_json()}),
                "write the participant's journal",
                epoch,
            )
        self._count("files", len(files))
        self._pending = None
        return handle

    # -- phase 2 -------------------------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        """The participant's files are in place already: COMMITTED while they are there (the
        epoch's log commit is `publish_epoch`'s), ALREADY_COMMITTED once the table records the
        epoch. A decided participant whose files are gone before the epoch's commit is data
        loss (ParticipantLostError)."""
        if self._last_committed is not None and self._last_committed >= epoch:
            return CommitOutcome.ALREADY_COMMITTED
        name = ParticipantName.parse(handle.participant)
        paths = paths_of(handle)
        self._require_own(name, paths, epoch, handle.participant)
        for path in paths:
            with self.translated("find a data file", epoch):
                if self.storage.exists(path):
                    continue
            if self._recorded(epoch):  # committed (and its staged rows deleted) already
                return CommitOutcome.ALREADY_COMMITTED
            raise ParticipantLostError(
                f"data loss: participant {handle.participant} is decided to commit, but "
                f"its file {self.storage.where}/{path} is gone",
                **self.where(epoch),
                fix="someone deleted it (VACUUM with a zero retention while the job was "
                "down?): restore the epoch's rows from the source; keep the decision record",
            )
        return CommitOutcome.COMMITTED

    def _recorded(self, epoch: int) -> bool:
        committed = self._client_call(self._delta().committed_epoch, "read the table's log", epoch)
        if committed is not None:
            self._committed_up_to(committed)
        return committed is not None and committed >= epoch

    def publish_epoch(self, epoch: int, handles: Sequence[CommitHandle]) -> CommitOutcome:
        """The epoch's one Delta commit (see the module docs); idempotent by the table's
        transaction version. Then the participants' journals and staged rows are deleted."""
        shape = self._epoch_shape(handles)
        rewritten = shape is not None and self._rewrites(shape)
        made = self._client_call(
            lambda: self._commit(epoch, handles, shape, rewritten), "commit the epoch", epoch
        )
        if shape is not None:
            self._table_shape = self._shape = shape
        if made:
            self._count("epochs_committed")
            self._logger(epoch).info(
                "committed %d participant(s) to %s", len(handles), self.storage.where
            )
        self._committed_up_to(epoch)
        done = []  # the journals, and a merge's staged rows (an append's files are the table's)
        for handle in handles:
            name = ParticipantName.parse(handle.participant)
            if name is not None:
                done += paths_of(handle) if self.config.mode == "upsert" or rewritten else []
                done.append(self._paths().journal(name))
        self._client_call(lambda: self.storage.delete(done), "delete the journals", epoch)
        return CommitOutcome.COMMITTED if made else CommitOutcome.ALREADY_COMMITTED

    def _epoch_shape(self, handles: Sequence[CommitHandle]) -> Shape | None:
        """The shape of the epoch's commit: the table's, with every column a participant
        added (schema evolution); the participants' before the table exists."""
        return union([s for s in (self._table_shape, handle_shape(handles)) if s is not None])

    def _rewrites(self, shape: Shape) -> bool:
        """Whether an append epoch adds columns to an existing table: delta-rs appends files
        only with the table's schema, so such an epoch's rows are written again by the one
        commit that adds the columns (a metaData action beside the add actions)."""
        table_shape = self._table_shape
        return (
            self.config.mode == "append"
            and table_shape is not None
            and adds_columns(table_shape.schema, shape)
        )

    def _commit(
        self,
        epoch: int,
        handles: Sequence[CommitHandle],
        shape: Shape | None,
        rewritten: bool,
    ) -> bool:
        merging = self.config.mode == "upsert"
        if (merging or rewritten) and self._recorded(epoch):
            return False  # committed before: its staged rows or files may be gone
        participants = [h.participant for h in handles]
        if shape is None:  # nothing was ever written and there is no table: nothing to record
            return not self._recorded(epoch)
        if merging:
            rows = last_per_key(self._epoch_rows(handles, shape), self.config.key)
            return self._delta().merge(
                epoch, rows, self.config.key, shape, participants, self.config.create_table
            )
        if rewritten:
            rows = self._epoch_rows(handles, shape)
            return self._delta().append_rows(epoch, rows, shape, participants)
        files = [f for h in handles for f in files_of(h)]
        return self._delta().append(epoch, files, shape, participants, self.config.create_table)

    def _epoch_rows(self, handles: Sequence[CommitHandle], shape: Shape) -> pa.Table:
        """The epoch's rows read back from its participants' files, in participant order,
        then in the order they were written, as `shape`'s schema (a column a file lacks is
        null; a partition column comes from the file's partition values)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = []
        for handle in sorted(handles, key=lambda h: h.participant):
            for file in files_of(handle):
                full = self.storage.full_path(str(file["path"]))
                with self.storage.filesystem().open_input_file(full) as f:
                    rows = pq.read_table(f, schema=shape.schema)
                for column, value in dict(file.get("partition_values") or {}).items():
                    index = rows.schema.get_field_index(column)
                    kind = shape.schema.field(column).type
                    filled = pa.array([value] * rows.num_rows, pa.string()).cast(kind)
                    rows = rows.set_column(index, shape.schema.field(column), filled)
                tables.append(rows)
        return pa.concat_tables(tables) if tables else shape.schema.empty_table()

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        """Delete the participant's files and journal (a participant never prepared: what
        this instance wrote of it). Never deletes a file the table references."""
        if handle is None:
            pending = self._pending
            current, self._current = self._current, None
            if current is not None and current.name.epoch == epoch:
                self._delete_participant(current.name, current.abandon())
            elif pending is not None and pending.epoch == epoch:
                self._delete_participant(pending, [])
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
        self._delete_participant(name, paths_of(handle))
        self._count("rollbacks")

    def _delete_participant(self, name: ParticipantName, paths: Sequence[str]) -> None:
        """Delete `paths` and whatever else the journal lists, then the journal."""
        journal_path = self._paths().journal(name)
        journal = self._read_journal(journal_path)
        listed = set(paths) | set(journal_paths(journal))
        self._require_own(name, sorted(listed), name.epoch, str(name))
        if listed and self.config.mode == "append" and self._recorded(name.epoch):
            table = self._client_call(self._delta().load, "read the table's log", name.epoch)
            kept = listed & self._delta().referenced(table) if table is not None else set()
            if kept:
                self._logger(name.epoch).warning(
                    "participant %s's files are in the table: only its journal is deleted", name
                )
            listed -= kept
        with self.translated("delete files", name.epoch):
            self.storage.delete(sorted(listed))
        with self.translated("delete a journal", name.epoch):
            self.storage.delete([journal_path])

    def _require_own(
        self, name: ParticipantName | None, paths: Sequence[str], epoch: int, participant: str
    ) -> None:
        """CorruptRecordError unless every path is one of participant `name`'s own files
        (Layout.owns): paths come from handles and journals, which anyone who can write the
        table's storage can forge, and are added to the log or deleted."""
        layout = self._paths()
        foreign = [p for p in paths if name is None or not layout.owns(name, p)]
        if not foreign:
            return
        raise CorruptRecordError(
            f"participant {participant[:200]!r} lists {foreign[0][:300]!r}, not one of its own "
            f"files in {self.storage.where}; nothing was committed or deleted for it",
            **self.where(epoch),
            fix="a handle or journal this job did not write is in the decision store or the "
            "table's _durable_sinks folder: check who writes there, remove it, then restart",
        )

    def _read_journal(self, path: str) -> Mapping[str, Any] | None:
        data = self._client_call(lambda: self.storage.read_bytes(path), "read a journal")
        if data is None:
            return None
        try:
            found = json.loads(data)
        except ValueError:
            return {"state": WRITING, "paths": []}  # cut short by a crash while written
        return found if isinstance(found, dict) else None

    # -- recovery ------------------------------------------------------------------------------
    def _journals(self, folder: str) -> list[tuple[ParticipantName, Mapping[str, Any]]]:
        layout = self._paths()
        listed = self._client_call(lambda: self.storage.list(folder), "list the journals")
        found = []
        for item in listed:
            name = layout.parse_journal(item.path)
            if name is None:
                continue
            journal = self._read_journal(item.path)
            if journal is not None:
                found.append((name, journal))
        return found

    def recover_prepared(self) -> list[CommitHandle]:
        ctx = self.context
        committed = self._client_call(self._delta().committed_epoch, "read the table's log")
        leftovers = []
        for name, journal in self._journals(self._paths().folder):
            if name.generation >= ctx.generation:
                continue
            handle = journal_handle(journal)
            recorded = committed is not None and name.epoch <= committed
            if handle is None or recorded:
                # Half-written (nothing can commit it), or of an epoch the table records
                # (committed, or a losing attempt of it): clean up.
                self._delete_participant(name, paths_of(handle) if handle else [])
                continue
            leftovers.append(handle)
        return leftovers

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        found = []
        for _, journal in self._journals(self._paths().epoch_folder(epoch)):
            handle = journal_handle(journal)
            if handle is not None:
                found.append(handle)
        return found

    # -- operations (durable-sinks status/inspect/verify; operations.py) -----------------------
    def in_doubt(self) -> list[Prepared]:
        return operations.in_doubt(self._journals(self._paths().folder), self.name)

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        table = self._client_call(self._delta().load, "read the table's log")
        return {} if table is None else operations.holdings(table, first, last)

    def live_generations(self) -> list[int]:
        return []  # a table keeps no sessions
