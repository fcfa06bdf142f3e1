"""Every use of pyiceberg's private API, in one place (pyiceberg 0.11-0.12; pinned by the
`iceberg` extra). Nothing else in the sink touches a name with a leading underscore.

- `write_data_files`: phase 1, Parquet data files laid out for the table (its partition spec,
  its schema's field ids, its file naming `data/<partition>/00000-<task>-<write_uuid>.parquet`)
  by pyiceberg's own writer, without committing them.
- `without_commit_retries`: the table with pyiceberg's own commit retries off for the next
  commit (in memory only: the table's stored properties are unchanged). pyiceberg's retry
  rebases a stale append onto the new head without re-checking anything, so a replayed
  epoch would land twice; the sink retries itself, re-checking the epoch first.
- `list_files`: the files under a folder of the table's location (recovery of half-written
  participants; pyiceberg's FileIO has no listing).
- `reach`: one request to the table's storage with the FileIO's own settings (endpoint,
  keys), so that settings the storage refuses show at start.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

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
