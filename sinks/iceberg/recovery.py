"""What a restart of the Iceberg sink finds: the last committed epoch (the table's epoch
property, table.py) and the participants left prepared, found by listing the table's data
folder (each file's name encodes its participant: layout.py). Every participant of an older
generation whose files are there and not in the table is handed to the coordinator, which
commits it (if its epoch's decision names it) or rolls it back; a participant that never
prepared is in no decision. After a distributed epoch, `prepared_of_epoch` reads the epoch's
journal (journal.py), so the coordinator rolls back the losing task attempts."""

from __future__ import annotations

from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle
from durable_sinks.core.sink_base import SinkBase

from . import journal
from .config import Iceberg
from .handles import IcebergHandleDetails, path_entry, paths_of
from .table import IcebergTable


def leftover(sink: SinkBase[Iceberg], name: ParticipantName, paths: list[str]) -> CommitHandle:
    """A handle naming a participant's files (enough to roll it back)."""
    entries = tuple(path_entry(p) for p in sorted(paths))
    details = IcebergHandleDetails(entries, sink.context.job_id).to_json()
    return CommitHandle.leftover(sink.name, name.epoch, str(name), details)


def leftovers(sink: SinkBase[Iceberg], tables: IcebergTable) -> list[CommitHandle]:
    """Every participant of an older generation with files in the table's data folder, as a
    handle naming its files (the coordinator commits the decision's own handle)."""
    if tables.current is None:
        return []
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
    listed = tables.listed(table) if any(h is None for _, h in found) else {}
    paths = {
        name: paths_of(handle) if handle is not None else listed.get(name, [])
        for name, handle in found
    }
    committed = tables.committed_epoch(table)
    if committed is not None and committed >= epoch:
        added = tables.added_by(table, epoch)
        if added is not None:
            held = [name for name, p in paths.items() if set(p) & added]
            journal.delete(sink, table, epoch, held)
            paths = {k: v for k, v in paths.items() if k not in held}
    return [leftover(sink, name, p) for name, p in sorted(paths.items())]
