"""Exactly-once rows in an Apache Iceberg table, one Iceberg commit per epoch.

- Phase 1 (`write_batch`, `pre_commit`): the participant's rows are written as Parquet data
  files of the table (its schema's field ids, its partition spec) by pyiceberg's writer, named
  from the participant (layout.py), under the table's data folder. No snapshot references
  them, so no reader sees them. `pre_commit` hands their records over in the handle (typed
  JSON, handles.py). A participant is the driver's whole epoch (driver mode) or one Spark
  task attempt's part of it (executor mode: the task opens the sink with `worker=True` and
  reads the table's schema and spec itself).
- Phase 2: `commit_epoch` has nothing to move (the files are in place): it checks that the
  participant's files are there. `publish_epoch` is the epoch's one Iceberg commit, of every
  decided participant together: one transaction that sets the table property
  `durable-sinks.<job>.<sink>.epoch` to the epoch and fast-appends the epoch's files (snapshot
  summary `durable-sinks.job`, `.sink`, `.epoch`). If the table as last read (at the epoch's
  start, or as the catalog answered the sink's own last commit: the table's metadata then,
  every writer's changes included) shows the epoch in the property, nothing is done; the
  commit asserts that the table's main branch has not moved since that read (pyiceberg's
  AssertRefSnapshotId, part of every append), so any commit of another writer or process
  meanwhile, which always adds a snapshot, fails it as a lost race. pyiceberg's own retries
  are off for it (they would rebase a replayed append onto a newer head without re-checking);
  a commit that lost a race is retried here, after re-reading and re-checking, up to
  `commit_retries`. Any other failure leaves the outcome unknown (InDoubtError): nothing is
  deleted then.
- Rollback deletes the participant's files only when the table proves they are not part of
  it: the property shows the epoch not committed, or the epoch's snapshot does not list them.
- Recovery lists the table's data folder: every participant of an older generation whose
  files are there is handed to the coordinator, which commits it (if its epoch's decision
  names it) or rolls it back. A participant that never prepared is in no decision. After a
  distributed epoch, `prepared_participants` lists the epoch's participants the same way, so
  the coordinator rolls back the losing task attempts.
- `last_committed_epoch` is the table property.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
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

from . import _pyiceberg, errors, operations
from .config import Iceberg, redacted
from .errors import CommitConflictError
from .handles import (
    IcebergHandleDetails,
    data_files_of,
    path_entry,
    paths_of,
)
from .layout import SUMMARY_EPOCH, SUMMARY_JOB, SUMMARY_PARTICIPANTS, SUMMARY_SINK, Layout
from .shape import fitted
from .writer import IcebergParticipant

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table


class IcebergSink(SinkBase[Iceberg]):
    """Exactly-once appends into one Iceberg table (see the module docs)."""

    KEEPS_COMMIT_RECORD = True

    def __init__(self, config: Iceberg) -> None:
        super().__init__(config, counters=("files", "commit_conflicts"))
        self._catalog: Catalog | None = None
        self._table: Table | None = None
        self._layout: Layout | None = None
        self._current: IcebergParticipant | None = None
        self._arrow: tuple[Schema, pa.Schema] | None = None
        #: On a worker (one task's part: open, one epoch, close), the table `open` read is
        #: the epoch's: `begin_epoch` need not read it again.
        self._fresh = False

    def _target(self) -> str:
        return f"table={self.config.where!r}"

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        self._opening(context)
        self._layout = Layout(context.job_id, self.name)
        config = self.config
        self._catalog = self._client_call(
            lambda: load_catalog(config.catalog_name, **config.catalog_properties()),
            "load the catalog",
        )
        try:
            if not context.worker:  # the driver checked it at start
                self._client_call(
                    lambda: self._cat().load_namespace_properties(config.namespace),
                    "read the namespace",
                )
        except DurableSinkError as exc:
            if not isinstance(exc.__cause__, NoSuchNamespaceError):
                raise
            raise ConfigError(
                f"the catalog {config.catalog_name!r} ({redacted(config.catalog)}) has no "
                f"namespace {config.namespace!r}",
                job=context.job_id,
                sink=self.name,
                fix=f"create it first (pyiceberg: catalog.create_namespace({config.namespace!r}); "
                f"Spark SQL: CREATE NAMESPACE {config.namespace}), or check the catalog's "
                "warehouse (a REST catalog serves the namespaces of the warehouse it is given)",
            ) from exc.__cause__
        try:
            self._table = self._client_call(
                lambda: self._cat().load_table(config.identifier), "load the table"
            )
        except DurableSinkError as exc:
            if not isinstance(exc.__cause__, NoSuchTableError):
                raise
            self._table = None
        if self._table is None and not config.create_table and not context.inspect:
            raise ConfigError(
                f"no Iceberg table {config.where}",
                job=context.job_id,
                sink=self.name,
                fix="create the table first, or set create_table=True to create it from the "
                "first epoch's rows",
            )
        if self._table is not None:
            self._last_committed = self._committed_epoch(self._table)
            self._fresh = context.worker
            if not context.worker:
                table = self._table
                # The table's storage, asked once with the FileIO's own settings (endpoint,
                # keys), so that settings it refuses are refused here, before anything is
                # written. A task's open skips it: the driver's open already asked.
                self._client_call(
                    lambda: _pyiceberg.reach(table),
                    "reach the table's storage",
                )

    def close(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.leftovers()  # closes an open file: a later start's recovery deletes it

    def _cat(self) -> Catalog:
        if self._catalog is None:
            raise self._not_open()
        return self._catalog

    def _paths(self) -> Layout:
        if self._layout is None:
            raise self._not_open()
        return self._layout

    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        return errors.translate(exc, step, self)

    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(
            exactly_once=True,
            two_phase_commit=True,
            resumable_prepare=True,
            distributed_prepare=True,
            partitioned=True,
        )

    def schema(self) -> pa.Schema | None:
        return self._table.schema().as_arrow() if self._table is not None else None

    def health_check(self) -> None:
        self._client_call(
            lambda: self._cat().load_namespace_properties(self.config.namespace),
            "reach the catalog",
        )

    # -- the epoch marker ----------------------------------------------------------------------
    def _committed_epoch(self, table: Table) -> int | None:
        value = table.metadata.properties.get(self._paths().epoch_property)
        return int(value) if value is not None else None

    def _read_last_committed(self) -> int | None:
        return self._committed_epoch(self._reload())

    def _reload(self, epoch: int | None = None) -> Table:
        table = self._client_call(
            lambda: self._cat().load_table(self.config.identifier), "load the table", epoch
        )
        self._table = table
        committed = self._committed_epoch(table)
        if committed is not None:
            self._committed_up_to(committed)
        return table

    # -- phase 1 -------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        failed, self._current = self._current, None
        if failed is not None:  # a failed attempt not rolled back
            paths = failed.leftovers()
            if paths:
                self._delete_unless_committed(failed.epoch, paths)
        self._current = IcebergParticipant(epoch, self._next_participant(epoch), self._paths())
        if self._table is not None and not self._fresh:  # its schema and spec as they are now
            self._reload(epoch)
        self._fresh = False

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        import pyarrow as pa

        current = self._current
        if current is None:
            raise self._no_epoch()
        if batch.num_rows == 0:
            return WriteResult(0, 0)
        table = self._table or self._create(batch.schema, current.epoch)
        rows = self._fitted(pa.Table.from_batches([batch]), table, current.epoch)
        size = self._client_call(
            lambda: current.write(table, rows), "write a data file", current.epoch
        )
        self._count("rows", rows.num_rows)
        self._count("bytes", size)
        return WriteResult(rows.num_rows, size)

    def _create(self, schema: pa.Schema, epoch: int) -> Table:
        """The table, made from the first batch's schema (unpartitioned). A catalog that
        answers with an existing table keeps its own schema: the rows are checked against it.
        A column type Iceberg has no counterpart for is a SchemaMismatchError."""
        try:
            return self._made(schema, epoch)
        except (TypeError, ValueError) as exc:
            raise SchemaMismatchError(
                f"cannot create the Iceberg table {self.config.where} from the rows: {exc}",
                **self.where(epoch),
                fix="cast the columns to types Iceberg has (no null-typed or nanosecond "
                "columns in format version 2), or create the table first; nothing of the "
                "epoch was committed",
            ) from exc

    def _made(self, schema: pa.Schema, epoch: int) -> Table:
        table = self._client_call(
            lambda: self._cat().create_table_if_not_exists(self.config.identifier, schema=schema),
            "create the table",
            epoch,
        )
        self._table = table
        return table

    def _fitted(self, rows: pa.Table, table: Table, epoch: int) -> pa.Table:
        return fitted(rows, self._arrow_schema(table), self.config.where, self.where(epoch))

    def _arrow_schema(self, table: Table) -> pa.Schema:
        """The table's schema in Arrow, converted once per schema object (a new one comes with
        each read of the table)."""
        schema = table.schema()
        if self._arrow is None or self._arrow[0] is not schema:
            self._arrow = (schema, schema.as_arrow())
        return self._arrow[1]

    def pre_commit(self, epoch: int) -> CommitHandle:
        current = self._current
        if current is None or current.epoch != epoch:
            raise self._no_epoch(epoch)
        self._count("bytes", self._client_call(current.finish, "write a data file", epoch))
        files, name = current.files, current.name
        handle = CommitHandle(
            sink=self.name,
            epoch=epoch,
            participant=str(name),
            rows=sum(f.rows for f in files),
            bytes=sum(f.size for f in files),
            checksum="",
            details=IcebergHandleDetails(tuple(files), self.context.job_id).to_json(),
        )
        self._count("files", len(files))
        self._current = None
        return handle

    # -- phase 2 -------------------------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        """The participant's files are in place already: COMMITTED while they are there (the
        epoch's Iceberg commit is `publish_epoch`'s), ALREADY_COMMITTED once the table's
        property covers the epoch. A decided participant whose files are gone before the
        epoch's commit is data loss (ParticipantLostError)."""
        if self._last_committed is not None and self._last_committed >= epoch:
            return CommitOutcome.ALREADY_COMMITTED
        files = IcebergHandleDetails.of(handle).files
        self._require_own(handle, [entry.path for entry in files], epoch)
        if not files:
            return CommitOutcome.COMMITTED
        io = self._table.io if self._table is not None else self._io(epoch)
        for entry in files:
            there = self._client_call(
                lambda e=entry: io.new_input(e.path).exists(),  # type: ignore[misc]
                "find a data file",
                epoch,
            )
            if there:
                continue
            table = self._existing_table(epoch)
            committed = None if table is None else self._committed_epoch(table)
            if committed is not None and committed >= epoch:
                return CommitOutcome.ALREADY_COMMITTED
            raise ParticipantLostError(
                f"data loss: participant {handle.participant} is decided to commit, but its "
                f"data file {entry.path} is gone",
                **self.where(epoch),
                fix="someone deleted it (orphan file removal while the job was down?): "
                "restore the epoch's rows from the source; keep the decision record",
            )
        return CommitOutcome.COMMITTED

    def _io(self, epoch: int) -> Any:
        """The FileIO of the table (read now; before the first epoch it may not be loaded)."""
        table = self._existing_table(epoch)
        if table is None:
            raise ConfigError(
                f"no Iceberg table {self.config.where}, yet a participant of epoch {epoch} "
                "wrote data files into it",
                **self.where(epoch),
                fix="the table was dropped while the job ran: restore it or start a new job",
            )
        return table.io

    def publish_epoch(self, epoch: int, handles: Sequence[CommitHandle]) -> CommitOutcome:
        """The epoch's one Iceberg commit of every participant in `handles` (see the module
        docs); idempotent by the table's epoch property."""
        writes = any(IcebergHandleDetails.of(h).files for h in handles)
        names = sorted(h.participant for h in handles)
        for attempt in range(self.config.commit_retries + 1):
            if self._table is None and not writes:  # no table, nothing written: nothing to record
                return CommitOutcome.COMMITTED
            # The table as last read (at the epoch's start, or as the last commit left it) is
            # enough for the first try: its epoch property only ever rises, and the commit
            # asserts that the main branch is still where this read saw it, so a commit of
            # anyone else since (an epoch's replay in another process included) makes it
            # fail as a lost race, retried below after a fresh read.
            table = self._table if attempt == 0 and self._table is not None else self._reload(epoch)
            committed = self._committed_epoch(table)
            if committed is not None and committed >= epoch:
                return CommitOutcome.ALREADY_COMMITTED
            try:
                files = [f for h in handles for f in data_files_of(h, table)]
            except CorruptRecordError:
                if attempt > 0:
                    raise
                # Files written under a partition spec newer than this read (a task's own
                # read of the table): read it again before deciding they do not fit.
                table = self._reload(epoch)
                committed = self._committed_epoch(table)
                if committed is not None and committed >= epoch:
                    return CommitOutcome.ALREADY_COMMITTED
                files = [f for h in handles for f in data_files_of(h, table)]
            try:
                self._client_call(
                    lambda t=table, f=files: self._commit(t, epoch, f, names),  # type: ignore[misc]
                    Step(
                        "commit the epoch",
                        epoch,
                        in_doubt="the next start's recovery (or the epoch's replay) reads the "
                        "table's epoch property and commits or skips the epoch",
                    ),
                )
            except CommitConflictError:
                self._count("commit_conflicts")
                continue
            self._committed_up_to(epoch)
            self._fresh = True  # the catalog's answer: the table as of this commit
            self._count("epochs_committed")
            return CommitOutcome.COMMITTED
        raise CommitConflictError(
            f"the commit of epoch {epoch} to {self.config.where} lost the race with other "
            f"writers {self.config.commit_retries + 1} times",
            **self.where(epoch),
            fix="nothing of the epoch is visible; it is retried. If other writers commit "
            "this often, raise commit_retries",
        )

    def _commit(
        self, table: Table, epoch: int, files: list[DataFile], participants: Sequence[str]
    ) -> None:
        summary = {
            SUMMARY_JOB: self.context.job_id,
            SUMMARY_SINK: self.name,
            SUMMARY_EPOCH: str(epoch),
            SUMMARY_PARTICIPANTS: json.dumps(list(participants)),
        }
        _pyiceberg.without_commit_retries(table)
        with table.transaction() as tx:
            tx.set_properties({self._paths().epoch_property: str(epoch)})
            with tx.update_snapshot(snapshot_properties=summary).fast_append() as append:
                for data_file in files:
                    append.append_data_file(data_file)

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        if handle is None:
            current, self._current = self._current, None
            if current is not None:
                paths = current.leftovers()
                if current.epoch == epoch:
                    self._delete_unless_committed(epoch, paths)
            return
        paths = paths_of(handle)
        self._require_own(handle, paths, epoch)
        self._delete_unless_committed(epoch, paths)
        self._count("rollbacks")

    def _require_own(self, handle: CommitHandle, paths: Sequence[str], epoch: int) -> None:
        """CorruptRecordError unless every path is a data file the handle's participant
        wrote (its name encodes the participant: Layout.parse) with no `..` in it: a handle
        read back from a decision may be forged, and its files are committed or deleted."""
        name = ParticipantName.parse(handle.participant)
        layout = self._paths()
        foreign = [
            p for p in paths if name is None or layout.parse(p) != name or ".." in p.split("/")
        ]
        if not foreign:
            return
        raise CorruptRecordError(
            f"participant {handle.participant[:200]!r} lists {foreign[0][:300]!r}, not one of "
            "its own data files; nothing was committed or deleted for it",
            **self.where(epoch),
            fix="the decision store holds a handle this job did not write: check who writes "
            "there, remove the record, then restart",
        )

    def _delete_unless_committed(self, epoch: int, paths: list[str]) -> None:
        """Delete `paths` unless the table holds them: when its property shows `epoch`
        committed, only files the epoch's snapshot does not list (a losing attempt's) go; if
        that snapshot is gone (expired), nothing is deleted."""
        if not paths:
            return
        table = self._existing_table(epoch)
        if table is None:  # no table: nothing references the files, and none were written
            return
        committed = self._committed_epoch(table)
        doomed = list(paths)
        location = table.location_provider().data_path.rstrip("/") + "/"
        outside = [p for p in doomed if not p.startswith(location)]
        if outside:
            raise CorruptRecordError(
                f"a data file to delete, {outside[0][:300]!r}, is not under the table's "
                f"data folder {location}; nothing was deleted",
                **self.where(epoch),
                fix="a handle this job did not write is in the decision store: check who "
                "writes there, remove the record, then restart",
            )
        if committed is not None and committed >= epoch:
            added = self._client_call(
                lambda: self._added_by(table, epoch), "read the epoch's snapshot", epoch
            )
            if added is None:
                self.logger(epoch).warning(
                    "epoch %d is committed and its snapshot is gone: its other files are kept",
                    epoch,
                )
                return
            doomed = [p for p in paths if p not in added]
        for path in doomed:
            self._delete_file(table, path, epoch)

    def _delete_file(self, table: Table, path: str, epoch: int) -> None:
        try:
            self._client_call(lambda: table.io.delete(path), "delete a data file", epoch)
        except DurableSinkError as exc:
            if not isinstance(exc.__cause__, FileNotFoundError):
                raise

    def _existing_table(self, epoch: int) -> Table | None:
        """The table re-read, or None if it does not exist."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self._reload(epoch)
        except ConfigError as exc:
            if isinstance(exc.__cause__, NoSuchTableError):
                return None
            raise

    def _added_by(self, table: Table, epoch: int) -> set[str] | None:
        """The data files the snapshot that committed `epoch` for this job's sink added;
        None if no such snapshot is left."""
        layout = self._paths()
        for snapshot in table.snapshots():
            if layout.epoch_of(snapshot.summary) == epoch:
                return {str(f.file_path) for f in operations.added_data_files(table, snapshot)}
        return None

    # -- recovery ------------------------------------------------------------------------------
    def recover_prepared(self) -> list[CommitHandle]:
        """Every participant of an older generation with files in the table's data folder, as
        a handle naming its files (the coordinator commits the decision's own handle)."""
        if self._table is None:
            return []
        table = self._reload()
        found = {
            name: paths
            for name, paths in self._listed(table).items()
            if name.generation < self.context.generation
        }
        committed = self._committed_epoch(table)
        if any(committed is not None and name.epoch <= committed for name in found):
            # Files the table holds are not leftovers (else every start would hand back every
            # committed participant); what it does not hold of a committed epoch is a losing
            # attempt's, whose rollback re-checks against the epoch's snapshot.
            held = self._client_call(lambda: self._referenced(table), "read the table's files")
            found = {k: v for k, v in found.items() if not set(v) & held}
        return [self._leftover(name, paths) for name, paths in sorted(found.items())]

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        """Every participant of `epoch` with files in the data folder that the table does not
        hold (any generation): after a distributed epoch, its losing task attempts."""
        table = self._existing_table(epoch)
        if table is None:
            return []
        found = {n: p for n, p in self._listed(table).items() if n.epoch == epoch}
        committed = self._committed_epoch(table)
        if found and committed is not None and committed >= epoch:
            added = self._client_call(
                lambda: self._added_by(table, epoch), "read the epoch's snapshot", epoch
            )
            found = {k: v for k, v in found.items() if added is None or not set(v) & added}
        return [self._leftover(name, paths) for name, paths in sorted(found.items())]

    def _listed(self, table: Table) -> dict[ParticipantName, list[str]]:
        """The data files of this job's sink in the table's data folder, by participant."""
        found: dict[ParticipantName, list[str]] = {}
        for path in self._client_call(lambda: list(self._data_files(table)), "list the data files"):
            name = self._paths().parse(path)
            if name is not None:
                found.setdefault(name, []).append(path)
        return found

    def _leftover(self, name: ParticipantName, paths: list[str]) -> CommitHandle:
        """A handle naming a participant's files (enough to roll it back)."""
        entries = tuple(path_entry(p) for p in sorted(paths))
        return CommitHandle(
            sink=self.name,
            epoch=name.epoch,
            participant=str(name),
            rows=0,
            bytes=0,
            checksum="",
            details=IcebergHandleDetails(entries, self.context.job_id).to_json(),
        )

    # -- operations (durable-sinks status/inspect/verify; operations.py) -----------------------
    def in_doubt(self) -> list[Prepared]:
        """Every participant with files in the data folder that the table does not hold."""
        if self._table is None:
            return []
        table = self._reload()
        listed = self._listed(table)
        held = self._client_call(lambda: self._referenced(table), "read the table's files")
        return operations.in_doubt(
            {n: p for n, p in listed.items() if not set(p) & held},
            self._leftover,
            lambda path: table.io.new_input(path),
        )

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        if self._table is None:
            return {}
        table = self._reload()
        return self._client_call(
            lambda: operations.holdings(table, self.context.job_id, self.name, first, last),
            "read the table's snapshots",
        )

    def live_generations(self) -> list[int]:
        return []  # a table keeps no sessions

    @staticmethod
    def _referenced(table: Table) -> set[str]:
        """The data files of the table's current snapshot."""
        return {str(task.file.file_path) for task in table.scan().plan_files()}

    def _data_files(self, table: Table) -> Iterator[str]:
        """The files under the folder the table's data files are written to: `<location>/data`,
        or the table's `write.data.path`."""
        return _pyiceberg.list_files(table, table.location_provider().data_path)
