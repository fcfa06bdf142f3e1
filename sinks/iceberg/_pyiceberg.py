"""Every use of pyiceberg's private API, in one place (pyiceberg 0.12; pinned by the
`iceberg` extra). Nothing else in the sink touches a name with a leading underscore.

- `write_data_files`: phase 1, Parquet data files laid out for the table (its partition spec,
  its schema's field ids, its file naming `data/<partition>/00000-<task>-<write_uuid>.parquet`)
  by pyiceberg's own writer, without committing them.
- `OpenDataFile`: phase 1 of an unpartitioned table, the same data file written record batch
  by record batch (pyiceberg's writer settings, field ids and statistics functions, its
  location provider), so an epoch of many record batches is one file, not one per batch.
- `without_commit_retries`: the table with pyiceberg's own commit retries off for the next
  commit (in memory only: the table's stored properties are unchanged). pyiceberg's retry
  rebases a stale append onto the new head without re-checking anything, so a replayed
  epoch would land twice; the sink retries itself, re-checking the epoch first.
- `list_files`: the files under a folder of the table's location (recovery of half-written
  participants; pyiceberg's FileIO has no listing).
- `delete_folder`: a folder of the table's location and every file under it, in batched
  requests (an epoch's journal once its commit is made; pyiceberg's FileIO deletes one file
  at a time).
- `reach`: one request to the table's storage with the FileIO's own settings (endpoint,
  keys), so that settings the storage refuses show at start.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table


def write_data_files(
    table: Table, rows: pa.Table, write_uuid: uuid.UUID, counter: itertools.count[int]
) -> list[DataFile]:
    """Write `rows` as data files of `table` named by `write_uuid` and the next task numbers
    of `counter`; no snapshot references them. Their DataFile records (path, format,
    partition, counts, column statistics) are what the epoch's commit appends."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    return list(
        _dataframe_to_data_files(
            table_metadata=table.metadata,
            df=rows,
            io=table.io,
            write_uuid=write_uuid,
            counter=counter,
        )
    )


def without_commit_retries(table: Table) -> Table:
    """`table` (the same object) whose next transaction commits once: a lost race raises
    CommitFailedException instead of being rebased blindly."""
    from pyiceberg.table import TableProperties

    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    table.metadata = table.metadata.model_copy(update={"properties": properties})
    return table


def list_files(table: Table, folder: str) -> Iterator[str]:
    """The full locations of the files under `folder` (a location below the table's), or
    nothing when it does not exist."""
    from pyarrow.fs import FileSelector, FileType
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = table.io
    if not isinstance(io, PyArrowFileIO):
        return
    scheme, netloc, path = PyArrowFileIO.parse_location(folder, io.properties)
    fs = io.fs_by_scheme(scheme, netloc)
    prefix = "" if scheme == "file" else f"{scheme}://"
    for info in fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True)):
        if info.type == FileType.File:
            yield f"{prefix}{info.path}" if prefix else f"file://{info.path}"


class OpenDataFile:
    """One data file of `table` being written, record batch after record batch, with
    pyiceberg's own Parquet writer settings (the table's codec and level, page and dictionary
    sizes), column field ids and statistics: what `write_data_files` writes for the same rows
    as one table. Rows are held until they fill a row group (the table's
    `write.parquet.row-group-limit` rows or `write.parquet.row-group-size-bytes` Arrow bytes,
    pyiceberg's defaults 1,048,576 and 128 MiB), then encoded as one: a row group per record
    batch would restart every column's dictionary each time (1M rows of benchmarks/
    iceberg_sink.py's shape as 10 row groups: 0.97 s and 11.6 MB, as one: 0.56 s and 6.9 MB). Named
    `00000-<task>-<write_uuid>.parquet` under the table's data location; it exists from its
    first row group and is complete only after `finish`, which returns its DataFile record."""

    def __init__(self, table: Table, write_uuid: uuid.UUID, task: int) -> None:
        from pyiceberg.io.fileformat import FileFormatFactory
        from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs
        from pyiceberg.manifest import FileFormat
        from pyiceberg.schema import sanitize_column_names
        from pyiceberg.table import TableProperties
        from pyiceberg.table.locations import load_location_provider
        from pyiceberg.utils.properties import property_as_int

        #: The table as the file is written for (its schema, spec and properties).
        self.table = table
        metadata = table.metadata
        self._metadata = metadata
        self._format = FileFormatFactory.get(FileFormat.PARQUET)
        schema = metadata.schema()
        self._table_schema = schema
        self._file_schema = sanitize_column_names(schema)
        provider = load_location_provider(
            table_location=metadata.location, table_properties=metadata.properties
        )
        self.path: str = provider.new_data_location(
            data_file_name=f"00000-{task}-{write_uuid}.{self._format.file_extension()}"
        )
        self._output = table.io.new_output(self.path)
        self._kwargs = _get_parquet_writer_kwargs(metadata.properties)
        self._row_group_rows = (
            property_as_int(
                metadata.properties,
                TableProperties.PARQUET_ROW_GROUP_LIMIT,
                TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT,
            )
            or TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT
        )
        self._row_group_bytes = (
            property_as_int(
                metadata.properties,
                TableProperties.PARQUET_ROW_GROUP_SIZE_BYTES,
                TableProperties.PARQUET_ROW_GROUP_SIZE_BYTES_DEFAULT,
            )
            or TableProperties.PARQUET_ROW_GROUP_SIZE_BYTES_DEFAULT
        )
        self._held: list[pa.Table] = []
        self._held_rows = 0
        self._held_bytes = 0
        self._stream: Any = None
        self._writer: Any = None
        #: The Arrow bytes written so far (pyiceberg's measure of a file's target size).
        self.arrow_bytes = 0
        self.rows = 0

    def write(self, rows: pa.Table) -> int:
        """Append `rows` (in the table's Arrow schema); the bytes the file grew by (none
        while the rows are held for the row group)."""
        self._held.append(rows)
        self._held_rows += rows.num_rows
        self._held_bytes += rows.nbytes
        self.arrow_bytes += rows.nbytes
        self.rows += rows.num_rows
        if self._held_rows >= self._row_group_rows or self._held_bytes >= self._row_group_bytes:
            return self._flush()
        return 0

    def _flush(self) -> int:
        """Encode the held rows as a row group; the bytes the file grew by."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyiceberg.io.pyarrow import _to_requested_schema

        if not self._held:
            return 0
        shaped = pa.Table.from_batches(
            [
                _to_requested_schema(
                    requested_schema=self._file_schema,
                    file_schema=self._table_schema,
                    batch=batch,
                    include_field_ids=True,
                    format_model=self._format,
                )
                for rows in self._held
                for batch in rows.to_batches()
            ]
        )
        self._held, self._held_rows, self._held_bytes = [], 0, 0
        if self._writer is None:
            self._stream = self._output.create(overwrite=True)
            self._writer = pq.ParquetWriter(
                self._stream, schema=shaped.schema, store_decimal_as_integer=True, **self._kwargs
            )
        before = int(self._stream.tell())
        self._writer.write(shaped, row_group_size=self._row_group_rows)
        return int(self._stream.tell()) - before

    def finish(self) -> tuple[DataFile, int]:
        """Close the file (complete on storage now); its DataFile record and the bytes its
        last row group and footer added."""
        from pyiceberg.io.pyarrow import (
            compute_statistics_plan,
            data_file_statistics_from_parquet_metadata,
            parquet_path_to_id_mapping,
        )
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        grown = self._flush()
        if self._writer is None:
            raise ValueError(f"no rows were written to {self.path}")
        before = int(self._stream.tell())
        with self._stream:
            self._writer.close()
        size = len(self._output)
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=self._writer.writer.metadata,
            stats_columns=compute_statistics_plan(self._file_schema, self._metadata.properties),
            parquet_column_mapping=parquet_path_to_id_mapping(self._file_schema),
        )
        record = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=self.path,
            file_format=FileFormat.PARQUET,
            partition=Record(),
            file_size_in_bytes=size,
            sort_order_id=None,
            spec_id=self._metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **statistics.to_serialized_dict(),
        )
        return record, grown + size - before

    def abandon(self) -> None:
        """Close the file without caring for its content (its path is deleted by the caller)."""
        self._held = []
        if self._writer is None:
            return
        with contextlib.suppress(Exception):  # the file is being given up
            self._writer.close()
        with contextlib.suppress(Exception):
            self._stream.close()


def target_file_bytes(table: Table) -> int:
    """The table's `write.target-file-size-bytes`, in Arrow bytes as pyiceberg measures it."""
    from pyiceberg.table import TableProperties
    from pyiceberg.utils.properties import property_as_int

    found = property_as_int(
        table.metadata.properties,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
    )
    return int(found) if found is not None else 512 * 2**20


def delete_files(table: Table, paths: Iterable[str]) -> None:
    """Delete each of `paths` through the table's FileIO, one request each; a file already
    gone is skipped."""
    for path in paths:
        try:
            table.io.delete(path)
        except FileNotFoundError:
            continue


def delete_folder(table: Table, folder: str) -> bool:
    """Delete `folder` (a location below the table's) and every file under it in batched
    requests (S3: one listing and one DeleteObjects per 1,000 keys, then the folder's own
    marker where the storage keeps one); a folder already gone is no error. False, deleting
    nothing, when the table's FileIO is not pyarrow's (the caller deletes file by file)."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = table.io
    if not isinstance(io, PyArrowFileIO):
        return False
    scheme, netloc, path = PyArrowFileIO.parse_location(folder, io.properties)
    with contextlib.suppress(FileNotFoundError):
        io.fs_by_scheme(scheme, netloc).delete_dir(path)
    return True


def reach(table: Table) -> None:
    """Ask the storage once for the table's current metadata file (an object that exists: an
    S3 table bucket answers 403, not 404, for a key that does not): an OSError when it
    refuses the FileIO's settings or does not answer."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = table.io
    if not isinstance(io, PyArrowFileIO):
        return
    scheme, netloc, path = PyArrowFileIO.parse_location(table.metadata_location, io.properties)
    io.fs_by_scheme(scheme, netloc).get_file_info(path)
