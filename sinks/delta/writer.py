"""One participant's Parquet files: written under the table's folder (append) or its staging
folder (merge), one open file per partition, rolled over at `max_file_bytes`.

Before a file is created, `announce(paths)` is called with every path the participant has
created or is about to create (the sink writes them to the participant's journal), so a
crash at any moment leaves no file that recovery cannot find.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from durable_sinks.core.sink_base import OpenParticipant

from .layout import Layout
from .shape import Shape
from .stats import FileStats
from .storage import TableStorage

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from durable_sinks.core.naming import ParticipantName

#: A column's dictionary falls back to plain encoding past this size (Arrow's default, 1 MiB,
#: spends most of an epoch's encoding time on columns of unique strings before it gives up;
#: docs/benchmarks.md, "How fast is the Delta sink against `deltalake.write_deltalake`?").
DICTIONARY_PAGE_BYTES = 256 * 1024


class Abandoned(Exception):  # noqa: N818 - a signal to the file's context, never raised
    """Ends an open file's writing context without keeping the file."""


PartitionKey = tuple[tuple[str, str | None], ...]


@dataclass
class _OpenFile:
    path: str
    partition: PartitionKey
    exits: ExitStack
    stream: Any
    writer: pq.ParquetWriter
    stats: FileStats = field(default_factory=FileStats)


class DeltaParticipant(OpenParticipant):
    """The participant being written: its files; `finish` closes them and describes each
    (the `add` action's fields), `abandon` closes them without caring for their content."""

    def __init__(
        self,
        storage: TableStorage,
        layout: Layout,
        name: ParticipantName,
        shape: Shape,
        *,
        staged: bool,
        compression: str,
        max_file_bytes: int,
        announce: Callable[[list[str]], None],
    ) -> None:
        super().__init__(name.epoch, name)
        self.storage = storage
        self.layout = layout
        self.shape = shape
        self.staged = staged
        self.compression = compression
        self.max_file_bytes = max_file_bytes
        self.announce = announce
        self.paths: list[str] = []
        self.finished: list[dict[str, Any]] = []
        self._open: dict[PartitionKey, _OpenFile] = {}

    @property
    def rows(self) -> int:
        done = sum(int(f["rows"]) for f in self.finished)
        return done + sum(o.stats.rows for o in self._open.values())

    def write(self, batch: pa.RecordBatch) -> int:
        """Write a batch that fits the table's shape; the bytes the files grew by."""
        before = self._written()
        if self.staged or not self.shape.partition_by:
            self._write_to((), batch if self.staged else self._data_columns(batch))
        else:
            for key, rows in _by_partition(batch, self.shape.partition_by):
                self._write_to(key, self._data_columns(rows))
        return self._written() - before

    def _data_columns(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if not self.shape.partition_by:
            return batch
        return batch.select([f.name for f in self.shape.file_schema])

    def _written(self) -> int:
        done = sum(int(f["size"]) for f in self.finished)
        return done + sum(int(o.stream.tell()) for o in self._open.values())

    def _write_to(self, key: PartitionKey, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        current = self._open.get(key) or self._start(key, batch.schema)
        current.writer.write_batch(batch)
        current.stats.add(batch)
        if current.stream.tell() >= self.max_file_bytes:
            self._finish(key)

    def _start(self, key: PartitionKey, schema: pa.Schema) -> _OpenFile:
        import pyarrow.parquet as pq

        number = len(self.paths)
        if self.staged:
            path = self.layout.staged(self.name, number)
        else:
            codec = self.compression if self.compression != "none" else "uncompressed"
            path = self.layout.data_file(self.name, number, dict(key), codec)
        self.announce([*self.paths, path])
        self.paths.append(path)
        exits = ExitStack()
        stream = exits.enter_context(self.storage.writing(path))
        writer = pq.ParquetWriter(
            stream,
            schema,
            compression=self.compression,
            dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES,
        )
        opened = _OpenFile(path, key, exits, stream, writer)
        self._open[key] = opened
        return opened

    def _finish(self, key: PartitionKey) -> None:
        current = self._open.pop(key)
        current.writer.close()
        size = int(current.stream.tell())
        current.exits.close()  # the file is complete and durable now
        self.finished.append(
            {
                "path": current.path,
                "size": size,
                "rows": current.stats.rows,
                "partition_values": dict(current.partition),
                "stats": current.stats.to_json(),
                "modification_time": int(time.time() * 1000),
            }
        )

    def reshape(self, shape: Shape) -> None:
        """Write the next batches in `shape` (the table's with columns added): the files
        begun in the older shape are finished first (a file has one schema)."""
        for key in list(self._open):
            self._finish(key)
        self.shape = shape

    def finish(self) -> list[dict[str, Any]]:
        for key in list(self._open):
            self._finish(key)
        return list(self.finished)

    def abandon(self) -> list[str]:
        """Close every open file (their content no longer matters); every path made."""
        for current in self._open.values():
            # A newer coordinator's recovery may have deleted the file already (this is then
            # a zombie's attempt): whatever closing finds, the caller deletes every path.
            with contextlib.suppress(OSError):
                try:
                    current.writer.close()
                finally:
                    # Ended as by an error: the file is dropped (on S3 never uploaded).
                    current.exits.__exit__(Abandoned, Abandoned(), None)
        self._open.clear()
        return list(self.paths)


def _by_partition(
    batch: pa.RecordBatch, columns: tuple[str, ...]
) -> Iterator[tuple[PartitionKey, pa.RecordBatch]]:
    """The batch's rows grouped by the partition columns' values (Delta's string forms)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = pa.Table.from_batches([batch])
    groups = table.select(list(columns)).group_by(list(columns), use_threads=False).aggregate([])
    for values in groups.to_pylist():
        mask = None
        for column in columns:
            value = values[column]
            test = (
                pc.is_null(table[column])
                if value is None
                else pc.fill_null(pc.equal(table[column], value), False)
            )
            mask = test if mask is None else pc.and_(mask, test)
        key = tuple((c, partition_value(values[c])) for c in columns)
        for rows in table.filter(mask).to_batches():
            yield key, rows


def partition_value(value: object) -> str | None:
    """A partition value in Delta's string form (`partitionValues`)."""
    import datetime

    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def checksum(files: list[dict[str, Any]]) -> str:
    """A digest of the participant's files (path, size, rows), for audits."""
    text = "\n".join(f"{f['path']}:{f['size']}:{f['rows']}" for f in files)
    return hashlib.sha256(text.encode()).hexdigest()
