"""What a restart of the Delta sink finds, from the journals only: a prepared participant of
an older generation is handed to the coordinator; a half-written one (no handle yet) is
deleted here; leftovers of an epoch the table records (committed, or a losing attempt of it)
are cleaned up. The last committed epoch is the table's transaction version for the job's
sink (table.py)."""

from __future__ import annotations

from durable_sinks.core.protocol import CommitHandle
from durable_sinks.core.sink_base import SinkBase

from .committer import Committer
from .config import Delta
from .handles import journal_handle, paths_of
from .journal import Journals
from .table import DeltaLog


def leftovers(
    sink: SinkBase[Delta], log: DeltaLog, journals: Journals, committer: Committer
) -> list[CommitHandle]:
    """The prepared participants of older generations; the rest of their leftovers deleted,
    and the emptied journal folders of epochs the table records (a local table's)."""
    with sink.translated("read the table's log"):
        snapshot = log.snapshot()
    committed = None if snapshot is None else snapshot.committed_epoch
    found = []
    for name, journal in journals.under(journals.layout.folder):
        if name.generation >= sink.context.generation:
            continue
        handle = journal_handle(journal)
        recorded = committed is not None and name.epoch <= committed
        if handle is None or recorded:
            # Half-written (nothing can commit it), or of an epoch the table records
            # (committed, or a losing attempt of it): clean up.
            committer.delete_participant(name, paths_of(handle) if handle else [])
            continue
        found.append(handle)
    if committed is not None:
        with sink.translated("remove emptied journal folders"):
            journals.remove_emptied(committed)
    return found


def prepared_of_epoch(journals: Journals, epoch: int) -> list[CommitHandle]:
    """Every participant of `epoch` whose journal holds its handle, of any generation."""
    found = []
    for _, journal in journals.under(journals.layout.epoch_folder(epoch)):
        handle = journal_handle(journal)
        if handle is not None:
            found.append(handle)
    return found
