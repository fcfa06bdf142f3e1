"""What a restart of the Iceberg sink finds: the last committed epoch (the table's epoch
property, table.py) and the participants left prepared. Every participant writes its entry in
the epoch journal (journal.py) before its first data file, so once the table's journal
property says so (every commit of this release sets it) the participants left prepared are
the entries of older generations in the sink's journal: one listing of what the commits and
rollbacks left there, whatever the table's history. A table without the property (its
commits all made by a release that journaled only tasks) is recovered by listing its data
folder (each file's name encodes its participant: layout.py). Every participant found whose
files the table does not hold is handed to the coordinator, which commits it (if its
epoch's decision names it) or rolls it back; a participant that never prepared is in no
decision. After a distributed epoch, `prepared_of_epoch` reads the epoch's journal, so the
coordinator rolls back the losing task attempts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle
from durable_sinks.core.sink_base import SinkBase

from . import journal
from .config import Iceberg
from .handles import IcebergHandleDetails, path_entry, paths_of
from .table import IcebergTable

if TYPE_CHECKING:
    from pyiceberg.table import Table


def leftover(sink: SinkBase[Iceberg], name: ParticipantName, paths: list[str]) -> CommitHandle:
    """A handle naming a participant's files (enough to roll it back)."""
    entries = tuple(path_entry(p) for p in sorted(paths))
    details = IcebergHandleDetails(entries, sink.context.job_id).to_json()
    return CommitHandle.leftover(sink.name, name.epoch, str(name), details)


def leftovers(sink: SinkBase[Iceberg], tables: IcebergTable) -> list[CommitHandle]:
    """Every participant of an older generation left prepared, as a handle naming its files
    (the coordinator commits the decision's own handle): from the journal once the table's
    journal property is set, else from the table's data folder."""
    current = tables.current
    if current is None:
        return []
    if tables.journaled(current):
        return _journaled(sink, tables, current)
    return _listed(sink, tables)


def _journaled(sink: SinkBase[Iceberg], tables: IcebergTable, current: Table) -> list[CommitHandle]:
    """The entries of older generations in the sink's journal, with their files (from the
    entry's handle, else found by name in the data folder: listed only for such an entry).
    An entry of a participant its epoch's snapshot names (the commit stopped before it
    deleted the entry) is deleted here; one of a committed epoch whose snapshot says nothing
    is handed back too: its rollback keeps every file the table holds."""
    found = [
        (name, handle)
        for name, handle in journal.all_entries(sink, current)
        if name.generation < sink.context.generation
    ]
    if not found:
        return []
    table = tables.reload()
    paths = _files_of(tables, table, found)
    committed = tables.committed_epoch(table)
    if committed is not None and any(name.epoch <= committed for name in paths):
        appended = tables.appended(table)
        held = [n for n in paths if str(n) in appended.get(n.epoch, frozenset())]
        for epoch in sorted({n.epoch for n in held}):
            journal.delete(sink, table, epoch, [n for n in held if n.epoch == epoch])
        paths = {k: v for k, v in paths.items() if k not in held}
    return [leftover(sink, name, p) for name, p in sorted(paths.items())]


def _files_of(
    tables: IcebergTable, table: Table, found: list[tuple[ParticipantName, CommitHandle | None]]
) -> dict[ParticipantName, list[str]]:
    """The files of each journaled participant: its handle's, or, for an entry without one,
    those named for it in the data folder (listed only when there is such an entry)."""
    listed = tables.listed(table) if any(h is None for _, h in found) else {}
    return {
        name: paths_of(handle) if handle is not None else listed.get(name, [])
        for name, handle in found
    }


def _listed(sink: SinkBase[Iceberg], tables: IcebergTable) -> list[CommitHandle]:
    """Every participant of an older generation with files in the table's data folder."""
    table = tables.reload()
    found = {
        name: paths
        for name, paths in tables.listed(table).items()
        if name.generation < sink.context.generation
    }
    committed = tables.committed_epoch(table)
    if committed is None or all(name.epoch > committed for name in found):
        return [leftover(sink, name, paths) for name, paths in sorted(found.items())]
    # The files of committed participants are in the folder too; they are not leftovers
    # (else every start would hand back every committed participant). Which participants
    # an epoch committed, its snapshot's summary says (from the metadata, whatever the
    # number of epochs); only for epochs whose snapshot expired, or whose summary names
    # none, are the table's files read (every manifest). What the table does not hold of
    # a committed epoch is a losing attempt's, whose rollback re-checks against the
    # epoch's snapshot.
    appended = tables.appended(table)
    found = {
        name: paths
        for name, paths in found.items()
        if name.epoch > committed or str(name) not in appended.get(name.epoch, frozenset())
    }
    if any(name.epoch <= committed and name.epoch not in appended for name in found):
        held = tables.referenced(table)
        found = {k: v for k, v in found.items() if not set(v) & held}
    return [leftover(sink, name, paths) for name, paths in sorted(found.items())]


def prepared_of_epoch(
    sink: SinkBase[Iceberg], tables: IcebergTable, epoch: int
) -> list[CommitHandle]:
    """Every task participant of `epoch` (any generation) in the epoch's journal whose files
    the table does not hold: after a distributed epoch, its losing task attempts. One listing
    of the epoch's journal folder; the table is read again only when it has entries, and its
    data folder listed only for an entry of a task that stopped before it prepared (its files
    are found by their names). An entry of a participant the epoch's snapshot holds (its
    commit stopped before it deleted the entry) is deleted here."""
    table = tables.current if tables.current is not None else tables.existing(epoch)
    if table is None:
        return []
    found = journal.entries(sink, table, epoch)
    if not found:
        return []
    table = tables.existing(epoch)
    if table is None:
        return []
    paths = _files_of(tables, table, found)
    committed = tables.committed_epoch(table)
    if committed is not None and committed >= epoch:
        added = tables.added_by(table, epoch)
        if added is not None:
            held = [name for name, p in paths.items() if set(p) & added]
            journal.delete(sink, table, epoch, held)
            paths = {k: v for k, v in paths.items() if k not in held}
    return [leftover(sink, name, p) for name, p in sorted(paths.items())]
