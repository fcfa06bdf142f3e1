"""Phase 1 of one participant: its rows as Parquet data files laid out for the table, written
but not committed (nothing is visible until the epoch's snapshot adds them).

An unpartitioned table gets one open data file that record batches are appended to, finished
once it holds the table's target file size; a partitioned one gets pyiceberg's own writer
per batch (a file per partition). Every finished file is listed in the participant's handle;
a file the participant began but did not finish is one of its `leftovers`, deleted by the
rollback (or by a later start's recovery, which finds it by its name)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.sink_base import OpenParticipant

from . import _pyiceberg
from .handles import DataFileEntry, file_entry
from .layout import Layout

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table


class IcebergParticipant(OpenParticipant):
    """The participant being written: its finished data files and the one open."""

    def __init__(self, epoch: int, name: ParticipantName, layout: Layout) -> None:
        super().__init__(epoch, name)
        self.files: list[DataFileEntry] = []
        #: Whether its entry in the epoch's journal is written (a task's participant).
        self.journaled = False
        self._open_file: _pyiceberg.OpenDataFile | None = None
        self._write_uuid = layout.write_uuid(name)
        self._counter = layout.task_numbers(name)

    def write(self, table: Table, rows: pa.Table) -> int:
        """Write `rows` (already fitted to the table's schema); the bytes written."""
        if table.spec().is_unpartitioned():
            return self._append(table, rows)
        written = _pyiceberg.write_data_files(table, rows, self._write_uuid, self._counter)
        self.files += [file_entry(f, table) for f in written]
        return sum(int(f.file_size_in_bytes) for f in written)

    def _append(self, table: Table, rows: pa.Table) -> int:
        """Append `rows` to the open data file (begun if none is open), which is finished
        once it holds the table's target file size (in Arrow bytes, as pyiceberg counts
        it); the bytes written."""
        current = self._open_file
        if current is None:
            current = _pyiceberg.OpenDataFile(table, self._write_uuid, next(self._counter))
            self._open_file = current
        grown = current.write(rows)
        if current.arrow_bytes >= _pyiceberg.target_file_bytes(table):
            grown += self.finish()
        return grown

    def finish(self) -> int:
        """Finish the open data file, if any (complete on storage from now on); the bytes its
        footer added."""
        current = self._open_file
        if current is None:
            return 0
        data_file, grown = current.finish()
        self._open_file = None
        self.files.append(file_entry(data_file, current.table))
        return grown

    def leftovers(self) -> list[str]:
        """The paths of every data file the participant began, the open one closed as it is
        (and no longer written)."""
        paths = [f.path for f in self.files]
        if self._open_file is not None:
            self._open_file.abandon()
            paths.append(self._open_file.path)
            self._open_file = None
        return paths
