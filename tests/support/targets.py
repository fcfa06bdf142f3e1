"""Conformance-suite targets for the local sinks (files, and the journal last resource)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from sinks import FileSink, FileSinkConfig, SinkConnector
from sinks.files import STAGING
from sinks.testing import COLUMNS, Row

from .journal_sink import JournalSink


class FileTarget:
    """A FileSink's folder, read as its readers would: published Parquet files only."""

    def __init__(self, path: Path, name: str = "files", sink_class: type[FileSink] = FileSink):
        self.path = path
        self.name = name
        self.sink_class = sink_class
        self._cache: dict[tuple[str, int, int, int], list[Row]] = {}

    def connector(self) -> SinkConnector:
        return self.sink_class(FileSinkConfig(str(self.path), name=self.name))

    def committed_rows(self) -> list[Row]:
        rows: list[Row] = []
        for file in sorted(self.path.glob("epoch=*/part=*/*.parquet")):
            stat = file.stat()
            key = (str(file), stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if key not in self._cache:  # published files never change: read each once
                table = pq.read_table(file).select(list(COLUMNS))
                self._cache[key] = [tuple(r[c] for c in COLUMNS) for r in table.to_pylist()]
            rows.extend(self._cache[key])
        return rows

    def leftovers(self) -> list[str]:
        staging = self.path / STAGING
        return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


class JournalTarget:
    """A JournalSink's folder: committed segments only (its prepared state is in memory)."""

    def __init__(self, path: Path, name: str = "journal") -> None:
        self.path = path
        self.name = name

    def connector(self) -> SinkConnector:
        return JournalSink(self.path, name=self.name)

    def committed_rows(self) -> list[Row]:
        return JournalSink.read_rows(self.path)

    def leftovers(self) -> list[str]:
        return []  # nothing of a journal epoch exists outside memory before its commit
