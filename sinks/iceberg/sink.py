"""Exactly-once rows in an Apache Iceberg table, one Iceberg commit per epoch.

- Phase 1 (`write_batch`, `pre_commit`): the participant's rows are written as Parquet data
  files of the table (its schema's field ids, its partition spec) by pyiceberg's writer, named
  from the participant (layout.py), under the table's data folder. No snapshot references
  them, so no reader sees them. `pre_commit` hands their records over in the handle (typed
  JSON, handles.py). A participant is the driver's whole epoch (driver mode) or one Spark
  task attempt's part of it (executor mode: the task opens the sink with `worker=True` and
  takes the table from the driver's task brief, task_brief.py, opening no catalog; without
  a brief it loads the table through the catalog itself).
- Phase 2: `commit_epoch` has nothing to move (the files are in place): for a participant
  read back by recovery it checks that its files are there (the live path's are taken as
  their handles say: committer.commit argues why). `publish_epoch` is the epoch's one
  Iceberg commit, of every decided participant together: one transaction that sets the
  table property
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
- Every participant writes its entry in the epoch journal (journal.py: one entry per
  participant, under a folder of the epoch) before its first data file; the epoch's commit
  and the participant's rollback delete it. Recovery lists the sink's journal (recovery.py):
  every participant of an older generation found there is handed to the coordinator, which
  commits it (if its epoch's decision names it) or rolls it back. A participant that never
  prepared is in no decision. After a distributed epoch, `prepared_participants` lists the
  epoch's journal folder, so the coordinator rolls back the losing task attempts at a cost
  that does not grow with the table.
- `last_committed_epoch` is the table property.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from durable_sinks.core.errors import (
    ConfigError,
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

from . import _pyiceberg, committer, errors, journal, operations, partitioning, recovery, task_brief
from .config import Iceberg, redacted
from .handles import (
    IcebergHandleDetails,
    paths_of,
)
from .layout import Layout
from .shape import fitted
from .table import IcebergTable
from .writer import IcebergParticipant

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table


class IcebergSink(SinkBase[Iceberg]):
    """Exactly-once appends into one Iceberg table (see the module docs)."""

    KEEPS_COMMIT_RECORD = True

    def __init__(self, config: Iceberg) -> None:
        super().__init__(config, counters=("files", "commit_conflicts", "snapshots_expired"))
        self._tables: IcebergTable | None = None
        self._current: IcebergParticipant | None = None
        self._arrow: tuple[Schema, pa.Schema] | None = None
        #: A decided epoch's commit may run on another thread while this instance writes the
        #: next (commits_beside_writes): the table's reads and commits (`IcebergTable`, its
        #: catalog session and `current`) happen under this lock.
        self._table_lock = threading.RLock()
        #: The epoch of the task brief the table was taken from (a worker's), if any.
        self._briefed: int | None = None

    def _target(self) -> str:
        return f"table={self.config.where!r}"

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        self._opening(context)
        config = self.config

        def loaded() -> Catalog:
            return self._client_call(
                lambda: load_catalog(config.catalog_name, **config.catalog_properties()),
                "load the catalog",
            )

        tables = IcebergTable(
            self, loaded, Layout(context.job_id, self.name), self._committed_up_to
        )
        self._tables = tables
        if (
            context.worker
            and context.task_brief is not None
            and self._take_brief(context.task_brief)
        ):
            return
        catalog = tables.catalog
        try:
            if not context.worker:  # the driver checked it at start
                self._client_call(
                    lambda: catalog.load_namespace_properties(config.namespace),
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
        # The driver's open reads the newest snapshot only (the epoch property says what is
        # committed); recovery, an epoch's start and the operator views read it all again.
        driver = not context.worker and not context.inspect
        try:
            tables.current = self._client_call(
                tables.load_referenced if driver else lambda: catalog.load_table(config.identifier),
                "load the table",
            )
        except DurableSinkError as exc:
            if not isinstance(exc.__cause__, NoSuchTableError):
                raise
            tables.current = None
        if tables.current is None and not config.create_table and not context.inspect:
            raise ConfigError(
                f"no Iceberg table {config.where}",
                job=context.job_id,
                sink=self.name,
                fix="create the table first, or set create_table=True to create it from the "
                "first epoch's rows",
            )
        if tables.current is not None:
            if driver:
                self._require_partitioning(tables.current, None)
            self._last_committed = tables.committed_epoch(tables.current)
            # On a worker (one task's part: open, one epoch, close), the table read here is
            # the epoch's: `begin_epoch` need not read it again.
            tables.fresh = context.worker
            if not context.worker:
                table = tables.current
                # The table's storage, asked once with the FileIO's own settings (endpoint,
                # keys), so that settings it refuses are refused here, before anything is
                # written. A task's open skips it: the driver's open already asked.
                self._client_call(
                    lambda: _pyiceberg.reach(table),
                    "reach the table's storage",
                )

    def _take_brief(self, brief: bytes) -> bool:
        """Take the table from the driver's task brief (task_brief.py): no catalog is opened
        and no metadata file read. False when the brief does not read as one of this
        release's: the worker then opens the catalog as without one. A brief of another
        epoch than the one begun is not used either (`begin_epoch` reads the table)."""
        found = task_brief.table_of(brief, self.config)
        if found is None:
            self.logger().warning("the task brief is not one this sink reads: opening the catalog")
            return False
        self._briefed, table = found
        tables = self._t()
        tables.current = table
        tables.fresh = True
        self._last_committed = tables.committed_epoch(table)
        return True

    def task_brief(self, epoch: int) -> bytes | None:
        """What this epoch's tasks need to write and prepare their parts without a catalog
        (task_brief.py: the table's metadata trimmed to its current schema, spec, sort order,
        properties, location and snapshot; the non-secret FileIO properties; no credential):
        from the table as the sink's own last commit left it, else read again now. None
        before the table exists (the tasks create it) or when the table's FileIO holds a
        secret the sink's configuration lacks (credentials the catalog vended): the tasks
        then open the catalog themselves. With the previous epoch's commit running
        (commits_beside_writes) the table as last read is taken: the tasks only write files
        in its schema and spec, which the epoch's commit checks again."""
        table = self._table_for(epoch)
        return None if table is None else task_brief.of(table, epoch, self.config)

    def _table_for(self, epoch: int, *, again: bool = False) -> Table | None:
        """The table `epoch` writes into (None before it exists): read again (its schema and
        spec as they are) unless the last read or commit was the catalog's latest answer
        and not `again`; as last read while the previous epoch's commit runs beside this
        epoch (commits_beside_writes), which leaves the table as the catalog answers it.
        Either way the next epoch reads it again."""
        tables = self._t()
        if tables.current is None or not self._table_lock.acquire(blocking=False):
            return tables.current
        try:
            if again or not tables.fresh:
                tables.reload(epoch)
            tables.fresh = False
            return tables.current
        finally:
            self._table_lock.release()

    def close(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.leftovers()  # closes an open file: a later start's recovery deletes it

    def _t(self) -> IcebergTable:
        if self._tables is None:
            raise self._not_open()
        return self._tables

    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        return errors.translate(exc, step, self)

    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(
            exactly_once=True,
            two_phase_commit=True,
            resumable_prepare=True,
            distributed_prepare=True,
            partitioned=True,
            commits_beside_writes=True,
        )

    def schema(self) -> pa.Schema | None:
        table = self._tables.current if self._tables is not None else None
        return table.schema().as_arrow() if table is not None else None

    def health_check(self) -> None:
        with self._table_lock:
            self._client_call(
                lambda: self._t().catalog.load_namespace_properties(self.config.namespace),
                "reach the catalog",
            )

    def _read_last_committed(self) -> int | None:
        tables = self._t()
        with self._table_lock:
            return tables.committed_epoch(tables.reload())

    # -- phase 1 -------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        """Begin `epoch` with the table `_table_for` gives (read again unless known fresh, or
        a task brief of another epoch); the schema and spec the files are written with are
        checked again at the epoch's commit (committer.publish)."""
        failed, self._current = self._current, None
        if failed is not None:  # a failed attempt not rolled back
            paths = failed.leftovers()
            with self._table_lock:
                committer.delete_unless_committed(self, self._t(), failed.epoch, paths)
                if failed.journaled:
                    self._forget(failed.epoch, [failed.name])
        self._current = IcebergParticipant(epoch, self._next_participant(epoch), self._t().layout)
        self._table_for(epoch, again=self._briefed is not None and self._briefed != epoch)

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        import pyarrow as pa

        current = self._current
        if current is None:
            raise self._no_epoch()
        if batch.num_rows == 0:
            return WriteResult(0, 0)
        table = self._t().current or self._create(batch.schema, current.epoch)
        rows = self._fitted(pa.Table.from_batches([batch]), table, current.epoch)
        if not current.journaled:  # before its first data file (recovery.py)
            data_path = table.location_provider().data_path
            journal.write(self, table.io, data_path, current.name, None)
            current.journaled = True
        size = self._client_call(
            lambda: current.write(table, rows), "write a data file", current.epoch
        )
        self._count("rows", rows.num_rows)
        self._count("bytes", size)
        return WriteResult(rows.num_rows, size)

    def _create(self, schema: pa.Schema, epoch: int) -> Table:
        """The table, made from the first batch's schema, partitioned by `partition_by`. A
        catalog that answers with an existing table keeps its own schema (the rows are
        checked against it) and must have the configured partitioning. A column type Iceberg
        has no counterpart for is a SchemaMismatchError; a partition field whose column the
        rows lack, or whose transform does not apply to its type, a ConfigError."""
        fields = self.config.partition_fields
        try:
            spec = partitioning.spec_for(schema, fields) if fields else None
            return self._made(schema, spec, epoch)
        except partitioning.UnfitPartitioningError as exc:  # (before anything is created)
            raise ConfigError(
                f"partition_by of {self.config.where} does not fit the rows: {exc}",
                **self.where(epoch),
                fix="partition by columns of the query's result: year, month, day and hour "
                "take dates and timestamps, truncate integers, decimals and strings, bucket "
                "those and more; nothing of the epoch was committed",
            ) from exc
        except (TypeError, ValueError) as exc:
            raise SchemaMismatchError(
                f"cannot create the Iceberg table {self.config.where} from the rows: {exc}",
                **self.where(epoch),
                fix="cast the columns to types Iceberg has (no null-typed or nanosecond "
                "columns in format version 2), or create the table first; nothing of the "
                "epoch was committed",
            ) from exc

    def _require_partitioning(self, table: Table, epoch: int | None) -> None:
        """ConfigError when `partition_by` is given and `table` is partitioned otherwise."""
        fields = self.config.partition_fields
        found = partitioning.differs(table, fields) if fields else None
        if found is not None:
            raise ConfigError(
                f"partition_by={[str(f) for f in fields]} but the table {self.config.where} "
                f"is partitioned by {found} (partition_by only shapes a table the sink "
                "creates)",
                job=self.context.job_id,
                sink=self.name,
                epoch=epoch,
                fix="give the table's own partitioning, or leave partition_by unset to write "
                "the table as it is partitioned",
            )

    def _made(self, schema: pa.Schema, spec: partitioning.Spec | None, epoch: int) -> Table:
        tables = self._t()
        with self._table_lock:
            table = self._client_call(
                lambda: partitioning.create_table(
                    tables.catalog, self.config.identifier, schema, spec
                ),
                "create the table",
                epoch,
            )
            self._require_partitioning(table, epoch)  # (another writer's, made first)
            tables.current = table
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
        details = IcebergHandleDetails(tuple(files), self.context.job_id, current.journaled)
        handle = CommitHandle(
            sink=self.name,
            epoch=epoch,
            participant=str(name),
            rows=sum(f.rows for f in files),
            bytes=sum(f.size for f in files),
            checksum="",
            details=details.to_json(),
        )
        table = self._t().current
        if self.context.worker and current.journaled and table is not None:
            # A task's handle reaches the driver through Spark, not through storage: the
            # entry keeps it for the sweep of losing attempts. The driver's own handle goes
            # into the decision record; a driver that stops before it is found by its
            # entry, its files by their names.
            journal.write(self, table.io, table.location_provider().data_path, name, handle)
        self._count("files", len(files))
        self._current = None
        return handle

    # -- phase 2: committer.py -----------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        """The participant's files are in place already (the epoch's Iceberg commit is
        `publish_epoch`'s): ALREADY_COMMITTED once the table's property covers the epoch,
        else COMMITTED. A participant of this coordinator's own generation (the live path)
        is trusted as its handle says, with no request per file; one of an older generation
        (recovery) only while its files are there (committer.commit)."""
        if self._last_committed is not None and self._last_committed >= epoch:
            return CommitOutcome.ALREADY_COMMITTED
        live = self._of_this_generation(handle)
        with self._table_lock:
            return committer.commit(self, self._t(), epoch, handle, check_files=not live)

    def publish_epoch(self, epoch: int, handles: Sequence[CommitHandle]) -> CommitOutcome:
        """The epoch's one Iceberg commit (committer.publish), the `keep_snapshots`
        house-keeping after a commit this call made; then the committed tasks'
        entries in the epoch's journal are deleted (a failure there fails the call, whose
        retry finds the epoch committed and deletes them again)."""
        with self._table_lock:
            outcome = committer.publish(self, self._t(), epoch, handles, self._count)
            if outcome is CommitOutcome.COMMITTED:
                expired = committer.expire_snapshots(self, self._t(), epoch)
                self._count("snapshots_expired", expired)
            journaled = [
                name
                for handle in handles
                if IcebergHandleDetails.of(handle).journaled
                and (name := ParticipantName.parse(handle.participant)) is not None
            ]
            self._forget(epoch, journaled)
        return outcome

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        """Delete the participant's data files unless the table holds them, then its entry
        in the epoch's journal (journal.py), if any."""
        with self._table_lock:
            self._roll_back(epoch, handle)

    def _roll_back(self, epoch: int, handle: CommitHandle | None) -> None:
        tables = self._t()
        if handle is None:
            current, self._current = self._current, None
            if current is not None:
                paths = current.leftovers()
                if current.epoch == epoch:
                    committer.delete_unless_committed(self, tables, epoch, paths)
                    if current.journaled:
                        self._forget(epoch, [current.name])
            return
        paths = paths_of(handle)
        committer.require_own(self, tables, handle, paths, epoch)
        committer.delete_unless_committed(self, tables, epoch, paths)
        name = ParticipantName.parse(handle.participant)
        if name is not None:  # require_own: one of this sink's participants
            self._forget(epoch, [name])
        self._count("rollbacks")

    def _forget(self, epoch: int, names: Sequence[ParticipantName]) -> None:
        """Delete the entries of `names` in the epoch's journal that are there."""
        table = self._t().current
        if table is not None and names:
            journal.delete(self, table, epoch, names)

    # -- recovery: recovery.py -----------------------------------------------------------------
    def recover_prepared(self) -> list[CommitHandle]:
        return recovery.leftovers(self, self._t())

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        """The epoch's task participants not in the table, from the epoch's journal alone
        (recovery.prepared_of_epoch): the cost is the epoch's, not the table's."""
        return recovery.prepared_of_epoch(self, self._t(), epoch)

    # -- operations (durable-sinks status/inspect/verify; operations.py) -----------------------
    def in_doubt(self) -> list[Prepared]:
        """Every participant with files in the data folder that the table does not hold."""
        tables = self._t()
        if tables.current is None:
            return []
        table = tables.reload()
        listed = tables.listed(table)
        held = tables.referenced(table)
        return operations.in_doubt(
            {n: p for n, p in listed.items() if not set(p) & held},
            lambda name, paths: recovery.leftover(self, name, paths),
            lambda path: table.io.new_input(path),
        )

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        tables = self._t()
        if tables.current is None:
            return {}
        table = tables.reload()
        return self._client_call(
            lambda: operations.holdings(table, self.context.job_id, self.name, first, last),
            "read the table's snapshots",
        )

    def live_generations(self) -> list[int]:
        return []  # a table keeps no sessions

    def drop_job(self, *, apply: bool, epoch_markers: bool = False) -> list[Bookkeeping]:
        """The table properties `durable-sinks.<job>.<sink>.epoch` (the job's last committed
        epoch) and `.journal`, removed with `apply` in a metadata-only table commit (no
        snapshot: what readers see of the rows does not change); and the job's snapshot
        summaries, kept: they are the table's immutable history."""
        _ = self.context  # UsageError before open
        layout = Layout(self.context.job_id, self.name)
        where = self.config.where
        found = [
            Bookkeeping(
                "snapshot summaries (durable-sinks.job/sink/epoch)",
                where,
                kept="part of the table's snapshots: removing them would rewrite its history; "
                "they expire with the snapshots (expire_snapshots)",
            )
        ]
        tables = self._t()
        if tables.current is None:
            return found  # no table: nothing of the job in it
        table = tables.reload()
        owned = (layout.epoch_property, layout.journal_property)
        keys = [k for k in owned if k in table.metadata.properties]
        if not keys:
            return found
        found += [Bookkeeping(f"table property {k}", where, 1) for k in keys]
        if apply:
            with self.translated("remove the job's table properties"), table.transaction() as tx:
                tx.remove_properties(*keys)
        return found
