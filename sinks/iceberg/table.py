"""The sink's view of its Iceberg table through the catalog: the table as last read (at the
epoch's start, or as the catalog answered the sink's own last commit), read again on demand,
and what the phases ask of it: the epoch property (`durable-sinks.<job>.<sink>.epoch`, the
last committed epoch) and the journal property, the data files a committed epoch's snapshot
added, the sink's own files in the table's data folder, the files the current snapshot
references."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.sink_base import SinkBase

from . import _pyiceberg, operations
from .config import Iceberg
from .layout import SUMMARY_PARTICIPANTS, Layout

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


#: A REST catalog property: `all` snapshots of a table in a load's answer, or those `refs`
#: (branches, tags) point at.
SNAPSHOT_LOADING_MODE = "snapshot-loading-mode"


class IcebergTable:
    """One sink's table. `on_committed(epoch)` is told the committed epoch of every read.
    The catalog is loaded by `load_catalog` on first use: a task given the table by its task
    brief (task_brief.py) loads none unless it must read the table again (a rollback)."""

    def __init__(
        self,
        sink: SinkBase[Iceberg],
        load_catalog: Callable[[], Catalog],
        layout: Layout,
        on_committed: Callable[[int], None],
    ) -> None:
        self._sink, self._load_catalog, self.layout = sink, load_catalog, layout
        self._catalog: Catalog | None = None
        self._on_committed = on_committed
        #: The table as last read or committed; None while it does not exist.
        self.current: Table | None = None
        #: Whether `current` is the catalog's latest answer (a worker's own read at open, or
        #: the sink's own commit): the next epoch need not read it again.
        self.fresh = False

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = self._load_catalog()
        return self._catalog

    def committed(self, epoch: int) -> None:
        """The sink committed `epoch` to the table."""
        self._on_committed(epoch)

    def load_referenced(self) -> Table:
        """The table with only the snapshots a branch or tag points at, where the catalog
        can answer so (a REST catalog's `snapshot-loading-mode=refs`, for this one load):
        what an open needs (the epoch property, the schema, the current snapshot) without
        parsing every snapshot the table keeps. Other catalogs ignore the setting and load
        every snapshot. The next `reload` reads the whole table again."""
        properties = self.catalog.properties
        before = properties.get(SNAPSHOT_LOADING_MODE)
        properties[SNAPSHOT_LOADING_MODE] = "refs"
        try:
            return self.catalog.load_table(self._sink.config.identifier)
        finally:
            if before is None:
                properties.pop(SNAPSHOT_LOADING_MODE, None)
            else:
                properties[SNAPSHOT_LOADING_MODE] = before

    def committed_epoch(self, table: Table) -> int | None:
        value = table.metadata.properties.get(self.layout.epoch_property)
        return int(value) if value is not None else None

    def journaled(self, table: Table) -> bool:
        """Whether a commit set the journal property: every participant of the sink since
        writes its journal entry before its first data file."""
        return self.layout.journal_property in table.metadata.properties

    def reload(self, epoch: int | None = None) -> Table:
        """The table read again through the catalog."""
        with self._sink.translated("load the table", epoch):
            table = self.catalog.load_table(self._sink.config.identifier)
        self.current = table
        committed = self.committed_epoch(table)
        if committed is not None:
            self._on_committed(committed)
        return table

    def existing(self, epoch: int) -> Table | None:
        """The table read again, or None if it does not exist."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.reload(epoch)
        except ConfigError as exc:
            if isinstance(exc.__cause__, NoSuchTableError):
                return None
            raise

    def io(self, epoch: int) -> Any:
        """The table's FileIO (as last read; before the first epoch it may not be loaded)."""
        if self.current is not None:
            return self.current.io
        table = self.existing(epoch)
        if table is None:
            raise ConfigError(
                f"no Iceberg table {self._sink.config.where}, yet a participant of epoch "
                f"{epoch} wrote data files into it",
                **self._sink.where(epoch),
                fix="the table was dropped while the job ran: restore it or start a new job",
            )
        return table.io

    def added_by(self, table: Table, epoch: int) -> set[str] | None:
        """The data files the snapshot that committed `epoch` for this job's sink added;
        None if no such snapshot is left."""
        with self._sink.translated("read the epoch's snapshot", epoch):
            for snapshot in table.snapshots():
                if self.layout.epoch_of(snapshot.summary) == epoch:
                    added = operations.added_data_files(table, snapshot)
                    return {str(f.file_path) for f in added}
        return None

    def listed(self, table: Table) -> dict[ParticipantName, list[str]]:
        """The data files of this job's sink in the table's data folder, by participant."""
        found: dict[ParticipantName, list[str]] = {}
        with self._sink.translated("list the data files"):
            paths = list(self._data_files(table))
        for path in paths:
            name = self.layout.parse(path)
            if name is not None:
                found.setdefault(name, []).append(path)
        return found

    def appended(self, table: Table) -> dict[int, frozenset[str]]:
        """Per epoch that a kept snapshot committed for this job's sink, the participants its
        summary names (read from the table's metadata: no manifest is opened)."""
        found: dict[int, frozenset[str]] = {}
        for snapshot in table.snapshots():
            epoch = self.layout.epoch_of(snapshot.summary)
            listed = snapshot.summary.get(SUMMARY_PARTICIPANTS) if snapshot.summary else None
            if epoch is None or listed is None:
                continue
            try:
                named = json.loads(listed)
            except ValueError:
                continue  # unreadable: this epoch is checked against the table's files
            if isinstance(named, list):
                found[epoch] = found.get(epoch, frozenset()) | {str(n) for n in named}
        return found

    def referenced(self, table: Table) -> set[str]:
        """The data files of the table's current snapshot."""
        with self._sink.translated("read the table's files"):
            return {str(task.file.file_path) for task in table.scan().plan_files()}

    @staticmethod
    def _data_files(table: Table) -> Iterator[str]:
        """The files under the folder the table's data files are written to: `<location>/data`,
        or the table's `write.data.path`."""
        return _pyiceberg.list_files(table, table.location_provider().data_path)
