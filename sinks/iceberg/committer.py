"""Phase 2 of the Iceberg sink, from handles alone (any process, any instance that wrote
nothing):

- `commit`: nothing to move (the participant's files are in place): COMMITTED, or
  ALREADY_COMMITTED once the table's epoch property covers the epoch. For a participant of
  an older generation (recovery) its files are checked to be there first: a decided
  participant whose files are gone before the epoch's commit is data loss
  (ParticipantLostError). The live path's participants are taken as their handles say.
- `publish`: the epoch's one Iceberg commit of every decided participant together: one
  transaction that sets the epoch property (and the journal property: every participant of
  the sink journals itself, recovery.py) and fast-appends the epoch's files (snapshot
  summary `durable-sinks.job`, `.sink`, `.epoch`, `.participants`). If the table as last read
  shows the epoch in the property, nothing is done; the commit asserts that the table's main
  branch has not moved since that read, so any commit of another writer meanwhile fails it
  as a lost race, retried here after re-reading and re-checking, up to `commit_retries`
  (pyiceberg's own retries are off: they would rebase a replayed append onto a newer head
  without re-checking). Any other failure leaves the outcome unknown (InDoubtError).
- `delete_unless_committed`: a rollback deletes the participant's files only when the table
  proves they are not part of it.

Every path read from a handle is checked to be a data file of its own participant first
(`require_own`): a handle read back from a decision may be forged."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from durable_sinks.core.errors import (
    CorruptRecordError,
    ParticipantLostError,
)
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle, CommitOutcome
from durable_sinks.core.sink_base import SinkBase, Step

from . import _pyiceberg
from .config import Iceberg
from .errors import CommitConflictError
from .handles import IcebergHandleDetails, data_files_of
from .journal import JOURNAL
from .layout import (
    SNAPSHOT_SUMMARY,
    SUMMARY_EPOCH,
    SUMMARY_JOB,
    SUMMARY_PARTICIPANTS,
    SUMMARY_SINK,
    SUMMARY_VERSION,
)
from .table import IcebergTable

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

#: What settles a commit whose outcome a failure left unknown.
_SETTLED_BY = (
    "the next start's recovery (or the epoch's replay) reads the table's epoch property and "
    "commits or skips the epoch"
)


def commit(
    sink: SinkBase[Iceberg],
    tables: IcebergTable,
    epoch: int,
    handle: CommitHandle,
    *,
    check_files: bool = True,
) -> CommitOutcome:
    """COMMITTED for a participant whose data files are there (asked of the storage one by
    one with `check_files`; else taken from the handle), ALREADY_COMMITTED when one is gone
    and the table's property covers the epoch, else ParticipantLostError.

    Without `check_files` (the live path: a participant the coordinator's own generation
    prepared moments ago, SinkBase._of_this_generation) nothing is asked of the storage: the
    handle names only files of its own participant (`require_own`), each complete when the
    handle was made, and a check here would not close the window it guards (a file deleted by
    someone outside the job after the check and before the epoch's commit is just as gone).
    Such a deletion (orphan-file removal with a retention shorter than an epoch) leaves the
    epoch's snapshot naming a missing file: every scan that reads it fails naming the file,
    and `durable-sinks verify` reports it ("is in the table but missing"). Handles read back
    from storage after a restart are always checked: there time passes between the prepare
    and the commit."""
    files = IcebergHandleDetails.of(handle).files
    require_own(sink, tables, handle, [entry.path for entry in files], epoch)
    if not files or not check_files:
        return CommitOutcome.COMMITTED
    io = tables.io(epoch)
    for entry in files:
        with sink.translated("find a data file", epoch):
            there = io.new_input(entry.path).exists()
        if there:
            continue
        table = tables.existing(epoch)
        committed = None if table is None else tables.committed_epoch(table)
        if committed is not None and committed >= epoch:
            return CommitOutcome.ALREADY_COMMITTED
        raise ParticipantLostError(
            f"data loss: participant {handle.participant} is decided to commit, but its "
            f"data file {entry.path} is gone",
            **sink.where(epoch),
            fix="someone deleted it (orphan file removal while the job was down?): "
            "restore the epoch's rows from the source; keep the decision record",
        )
    return CommitOutcome.COMMITTED


def publish(
    sink: SinkBase[Iceberg],
    tables: IcebergTable,
    epoch: int,
    handles: Sequence[CommitHandle],
    count: Callable[[str], None],
) -> CommitOutcome:
    """The epoch's one Iceberg commit (see the module docs); idempotent by the table's
    epoch property. `count` is told of every commit that lost a race ("commit_conflicts")
    and of the one made ("epochs_committed")."""
    config = sink.config
    writes = any(IcebergHandleDetails.of(h).files for h in handles)
    names = sorted(h.participant for h in handles)
    for attempt in range(config.commit_retries + 1):
        if tables.current is None and not writes:  # no table, nothing written: nothing to do
            return CommitOutcome.COMMITTED
        # The table as last read (at the epoch's start, or as the last commit left it) is
        # enough for the first try: its epoch property only ever rises, and the commit
        # asserts that the main branch is still where this read saw it, so a commit of
        # anyone else since (an epoch's replay in another process included) makes it fail
        # as a lost race, retried below after a fresh read.
        first = attempt == 0 and tables.current is not None
        table = tables.current if first and tables.current else tables.reload(epoch)
        committed = tables.committed_epoch(table)
        if committed is not None and committed >= epoch:
            return CommitOutcome.ALREADY_COMMITTED
        try:
            files = [f for h in handles for f in data_files_of(h, table)]
        except CorruptRecordError:
            if attempt > 0:
                raise
            # Files written under a partition spec newer than this read (a task's own read
            # of the table): read it again before deciding they do not fit.
            table = tables.reload(epoch)
            committed = tables.committed_epoch(table)
            if committed is not None and committed >= epoch:
                return CommitOutcome.ALREADY_COMMITTED
            files = [f for h in handles for f in data_files_of(h, table)]
        try:
            with sink.translated(Step("commit the epoch", epoch, in_doubt=_SETTLED_BY)):
                _commit(sink, tables, table, epoch, files, names)
        except CommitConflictError:
            count("commit_conflicts")
            continue
        tables.committed(epoch)
        tables.fresh = True  # the catalog's answer: the table as of this commit
        count("epochs_committed")
        return CommitOutcome.COMMITTED
    raise CommitConflictError(
        f"the commit of epoch {epoch} to {config.where} lost the race with other "
        f"writers {config.commit_retries + 1} times",
        **sink.where(epoch),
        fix="nothing of the epoch is visible; it is retried. If other writers commit "
        "this often, raise commit_retries",
    )


def _commit(
    sink: SinkBase[Iceberg],
    tables: IcebergTable,
    table: Table,
    epoch: int,
    files: list[DataFile],
    participants: Sequence[str],
) -> None:
    summary = {
        SUMMARY_JOB: sink.context.job_id,
        SUMMARY_SINK: sink.name,
        SUMMARY_EPOCH: str(epoch),
        SUMMARY_PARTICIPANTS: json.dumps(list(participants)),
        SUMMARY_VERSION: str(SNAPSHOT_SUMMARY.current),
    }
    _pyiceberg.without_commit_retries(table)
    with table.transaction() as tx:
        tx.set_properties(
            {
                tables.layout.epoch_property: str(epoch),
                tables.layout.journal_property: str(JOURNAL.current),
            }
        )
        with tx.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)


def require_own(
    sink: SinkBase[Iceberg],
    tables: IcebergTable,
    handle: CommitHandle,
    paths: Sequence[str],
    epoch: int,
) -> None:
    """CorruptRecordError unless every path is a data file the handle's participant wrote
    (its name encodes the participant: Layout.parse) with no `..` in it: a handle read back
    from a decision may be forged, and its files are committed or deleted."""
    name = ParticipantName.parse(handle.participant)
    layout = tables.layout
    foreign = [p for p in paths if name is None or layout.parse(p) != name or ".." in p.split("/")]
    if not foreign:
        return
    raise CorruptRecordError(
        f"participant {handle.participant[:200]!r} lists {foreign[0][:300]!r}, not one of "
        "its own data files; nothing was committed or deleted for it",
        **sink.where(epoch),
        fix="the decision store holds a handle this job did not write: check who writes "
        "there, remove the record, then restart",
    )


def delete_unless_committed(
    sink: SinkBase[Iceberg], tables: IcebergTable, epoch: int, paths: list[str]
) -> None:
    """Delete `paths` unless the table holds them: when its property shows `epoch`
    committed, only files the epoch's snapshot does not list (a losing attempt's) go; if
    that snapshot is gone (expired), nothing is deleted."""
    if not paths:
        return
    table = tables.existing(epoch)
    if table is None:  # no table: nothing references the files, and none were written
        return
    committed = tables.committed_epoch(table)
    doomed = list(paths)
    location = table.location_provider().data_path.rstrip("/") + "/"
    outside = [p for p in doomed if not p.startswith(location)]
    if outside:
        raise CorruptRecordError(
            f"a data file to delete, {outside[0][:300]!r}, is not under the table's "
            f"data folder {location}; nothing was deleted",
            **sink.where(epoch),
            fix="a handle this job did not write is in the decision store: check who "
            "writes there, remove the record, then restart",
        )
    if committed is not None and committed >= epoch:
        added = tables.added_by(table, epoch)
        if added is None:
            sink.logger(epoch).warning(
                "epoch %d is committed and its snapshot is gone: its other files are kept",
                epoch,
            )
            return
        doomed = [p for p in paths if p not in added]
    with sink.translated("delete a data file", epoch):
        _pyiceberg.delete_files(table, doomed)


def expire_snapshots(sink: SinkBase[Iceberg], tables: IcebergTable, epoch: int) -> int:
    """`keep_snapshots`' house-keeping (config.py), after the sink's own commit of `epoch`
    (the table as that commit left it): once the table holds more than `keep_snapshots` and
    half as many again, every snapshot but the newest `keep_snapshots` and those a branch or
    tag points at is expired in one metadata commit, so that the cost is paid once per
    `keep_snapshots / 2` epochs. The number expired. A commit that loses a race with another
    writer is a CommitConflictError (transient): the epoch is committed, and the next
    epoch's commit tries again."""
    keep = sink.config.keep_snapshots
    table = tables.current
    if keep is None or table is None:
        return 0
    snapshots = sorted(table.snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
    if len(snapshots) <= keep + max(1, keep // 2):
        return 0
    pointed = {ref.snapshot_id for ref in table.metadata.refs.values()}
    doomed = [s.snapshot_id for s in snapshots[:-keep] if s.snapshot_id not in pointed]
    if not doomed:
        return 0
    with sink.translated("expire old snapshots", epoch):
        table.maintenance.expire_snapshots().by_ids(doomed).commit()
    sink.logger(epoch).info("expired %d snapshot(s), keeping the newest %d", len(doomed), keep)
    return len(doomed)
