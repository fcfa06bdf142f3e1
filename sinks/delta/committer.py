"""Phase 2 of the Delta sink, from handles alone (any process, any instance that wrote
nothing):

- `commit`: nothing to move (the participant's files are in place): COMMITTED, or
  ALREADY_COMMITTED once the table records the epoch. For a participant of an older
  generation (recovery) its files are checked to be there first: a decided participant
  whose files are gone before the epoch's commit is data loss (ParticipantLostError). The
  live path's participants are taken as their handles say (`Committer.commit`).
- `publish`: the epoch's one log commit from every decided participant: their files as
  `add` actions (append) or a MERGE of their rows by key (upsert), with the application
  transaction `txn(appId=<job and sink>, version=<epoch>)` in the same commit; an epoch
  whose version the table records is not committed again. Then the journals (and a merge's
  staged rows) are deleted.
- `delete_participant`: a rollback: the participant's files and journal, never a file the
  table references.

Every path read from a handle or a journal is checked to be the participant's own file
first (`require_own`): anyone who can write the table's storage can forge them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from durable_sinks.core.errors import CorruptRecordError, ParticipantLostError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle, CommitOutcome
from durable_sinks.core.sink_base import SinkBase

from .config import Delta
from .handles import files_of, handle_shape, journal_paths, last_per_key, paths_of
from .journal import Journals
from .shape import Shape, adds_columns, union
from .storage import TableStorage
from .table import DeltaLog

if TYPE_CHECKING:
    import pyarrow as pa


class Committer:
    """Phase 2 of one sink on one table. `on_committed(epoch)` is told every committed
    epoch the table's log shows."""

    def __init__(
        self,
        sink: SinkBase[Delta],
        storage: TableStorage,
        log: DeltaLog,
        journals: Journals,
        on_committed: Callable[[int], None],
    ) -> None:
        self._sink, self._storage, self._log = sink, storage, log
        self._journals, self._on_committed = journals, on_committed

    def recorded(self, epoch: int) -> bool:
        """Whether the table's log records `epoch` (or a later one) for the sink."""
        with self._sink.translated("read the table's log", epoch):
            committed = self._log.committed_epoch()
        if committed is not None:
            self._on_committed(committed)
        return committed is not None and committed >= epoch

    def commit(
        self, epoch: int, handle: CommitHandle, *, check_files: bool = True
    ) -> CommitOutcome:
        """COMMITTED for a participant whose files are there (asked of the storage one by one
        with `check_files`; else taken from the handle: the live path, see below),
        ALREADY_COMMITTED when one is gone and the table records the epoch, else
        ParticipantLostError.

        Without `check_files` nothing is asked of the storage: the participant was prepared
        moments ago under the coordinator's own generation, and its handle names only files
        of its own (`require_own`), each complete when the handle was made. A check here would
        not close the window it guards: a file deleted by someone outside the job after the
        check and before the log commit is just as gone. Such a deletion (VACUUM with a zero
        retention, an operator's cleanup of files no version references) leaves the epoch's
        log commit naming a missing file: every reader that scans it fails, naming the file
        (delta-rs and Spark raise a file-not-found error; Spark's `FSCK REPAIR TABLE` drops
        the dangling entry), so nothing is read silently short.
        Handles read back from storage after a restart are always checked: there time passes
        between the prepare and the commit."""
        name = ParticipantName.parse(handle.participant)
        paths = paths_of(handle)
        self.require_own(name, paths, epoch, handle.participant)
        for path in paths if check_files else ():
            with self._sink.translated("find a data file", epoch):
                if self._storage.exists(path):
                    continue
            if self.recorded(epoch):  # committed (and its staged rows deleted) already
                return CommitOutcome.ALREADY_COMMITTED
            raise ParticipantLostError(
                f"data loss: participant {handle.participant} is decided to commit, but "
                f"its file {self._storage.where}/{path} is gone",
                **self._sink.where(epoch),
                fix="someone deleted it (VACUUM with a zero retention while the job was "
                "down?): restore the epoch's rows from the source; keep the decision record",
            )
        return CommitOutcome.COMMITTED

    def publish(
        self, epoch: int, handles: Sequence[CommitHandle], table_shape: Shape | None
    ) -> tuple[bool, Shape | None]:
        """The epoch's one Delta commit; idempotent by the table's transaction version. Then
        the participants' journals and staged rows are deleted. Whether this call made the
        commit, and the table's shape after it (None: unchanged)."""
        config = self._sink.config
        shape = union([s for s in (table_shape, handle_shape(handles)) if s is not None])
        rewritten = (
            shape is not None
            and config.mode == "append"
            and table_shape is not None
            and adds_columns(table_shape.schema, shape)
        )
        with self._sink.translated("commit the epoch", epoch):
            made = self._commit(epoch, handles, shape, rewritten)
        if made:
            self._sink.logger(epoch).info(
                "committed %d participant(s) to %s", len(handles), self._storage.where
            )
        done = []  # the journals, and a merge's staged rows (an append's files are the table's)
        for handle in handles:
            name = ParticipantName.parse(handle.participant)
            if name is not None:
                done += paths_of(handle) if config.mode == "upsert" or rewritten else []
                done.append(self._journals.layout.journal(name))
        with self._sink.translated("delete the journals", epoch):
            self._storage.delete(done)
        return made, shape

    def _commit(
        self,
        epoch: int,
        handles: Sequence[CommitHandle],
        shape: Shape | None,
        rewritten: bool,
    ) -> bool:
        """`rewritten`: an append epoch adds columns to an existing table. delta-rs appends
        files only with the table's schema, so such an epoch's rows are written again by
        the one commit that adds the columns (a metaData action beside the add actions)."""
        config = self._sink.config
        merging = config.mode == "upsert"
        if (merging or rewritten) and self.recorded(epoch):
            return False  # committed before: its staged rows or files may be gone
        participants = [h.participant for h in handles]
        if shape is None:  # nothing was ever written and there is no table: nothing to record
            return not self.recorded(epoch)
        if merging:
            rows = last_per_key(self._epoch_rows(handles, shape), config.key)
            return self._log.merge(
                epoch, rows, config.key, shape, participants, config.create_table
            )
        if rewritten:
            rows = self._epoch_rows(handles, shape)
            return self._log.append_rows(epoch, rows, shape, participants)
        files = [f for h in handles for f in files_of(h)]
        return self._log.append(epoch, files, shape, participants, config.create_table)

    def _epoch_rows(self, handles: Sequence[CommitHandle], shape: Shape) -> pa.Table:
        """The epoch's rows read back from its participants' files, in participant order,
        then in the order they were written, as `shape`'s schema (a column a file lacks is
        null; a partition column comes from the file's partition values)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = []
        for handle in sorted(handles, key=lambda h: h.participant):
            for file in files_of(handle):
                full = self._storage.full_path(str(file["path"]))
                with self._storage.filesystem().open_input_file(full) as f:
                    rows = pq.read_table(f, schema=shape.schema)
                for column, value in dict(file.get("partition_values") or {}).items():
                    index = rows.schema.get_field_index(column)
                    kind = shape.schema.field(column).type
                    filled = pa.array([value] * rows.num_rows, pa.string()).cast(kind)
                    rows = rows.set_column(index, shape.schema.field(column), filled)
                tables.append(rows)
        return pa.concat_tables(tables) if tables else shape.schema.empty_table()

    def delete_participant(self, name: ParticipantName, paths: Sequence[str]) -> None:
        """Delete `paths` and whatever else the journal lists, then the journal."""
        journal_path = self._journals.layout.journal(name)
        journal = self._journals.read(journal_path)
        listed = set(paths) | set(journal_paths(journal))
        self.require_own(name, sorted(listed), name.epoch, str(name))
        if listed and self._sink.config.mode == "append" and self.recorded(name.epoch):
            with self._sink.translated("read the table's log", name.epoch):
                table = self._log.load()
            kept = listed & self._log.referenced(table) if table is not None else set()
            if kept:
                self._sink.logger(name.epoch).warning(
                    "participant %s's files are in the table: only its journal is deleted", name
                )
            listed -= kept
        with self._sink.translated("delete files", name.epoch):
            self._storage.delete(sorted(listed))
        with self._sink.translated("delete a journal", name.epoch):
            self._storage.delete([journal_path])

    def require_own(
        self, name: ParticipantName | None, paths: Sequence[str], epoch: int, participant: str
    ) -> None:
        """CorruptRecordError unless every path is one of participant `name`'s own files
        (Layout.owns): paths come from handles and journals, which anyone who can write the
        table's storage can forge, and are added to the log or deleted."""
        layout = self._journals.layout
        foreign = [p for p in paths if name is None or not layout.owns(name, p)]
        if not foreign:
            return
        raise CorruptRecordError(
            f"participant {participant[:200]!r} lists {foreign[0][:300]!r}, not one of its own "
            f"files in {self._storage.where}; nothing was committed or deleted for it",
            **self._sink.where(epoch),
            fix="a handle or journal this job did not write is in the decision store or the "
            "table's _durable_sinks folder: check who writes there, remove it, then restart",
        )
