"""What an Iceberg participant's handle holds: for each of its data files, what the epoch's
append needs to add it to the table, as typed JSON (core/handles.py).

Handles cross process boundaries (an executor's task hands its part to the driver) and are
kept in decision records, which recovery reads after the job, or pyiceberg, has been upgraded.
So a data file is held in the terms of the Iceberg spec, not as a pyiceberg object: its path,
format, spec id and counts, its column statistics by field id, and its partition tuple and
bounds in the spec's single-value binary serialisation (hex). Any pyiceberg that writes the
table reads them back (`data_files_of`); a pickled `DataFile` would bind the decision to the
layout of one pyiceberg version's classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import CorruptRecordError
from durable_sinks.core.handles import HandleDetails
from durable_sinks.core.protocol import CommitHandle

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table


@dataclass(frozen=True)
class DataFileEntry:
    """One data file of a participant. A handle that only rolls back (recovery's, for files
    found by listing) holds the path alone.

    `partition` is the partition tuple in the order of the fields of spec `spec_id`, each
    value in Iceberg's single-value binary serialisation (hex), None for null. The statistics
    map field ids (as strings) to counts, the bounds to serialised values (hex)."""

    path: str
    size: int = 0
    rows: int = 0
    format: str = "PARQUET"
    spec_id: int = 0
    partition: tuple[str | None, ...] = ()
    column_sizes: Mapping[str, Any] = field(default_factory=dict)
    value_counts: Mapping[str, Any] = field(default_factory=dict)
    null_value_counts: Mapping[str, Any] = field(default_factory=dict)
    nan_value_counts: Mapping[str, Any] = field(default_factory=dict)
    lower_bounds: Mapping[str, Any] = field(default_factory=dict)
    upper_bounds: Mapping[str, Any] = field(default_factory=dict)
    split_offsets: tuple[int, ...] | None = None
    #: False for an entry that names a file only (enough to delete it, not to append it).
    complete: bool = True


@dataclass(frozen=True)
class IcebergHandleDetails(HandleDetails):
    """The participant's data files and the job.

    Version 1 held each file's pyiceberg record pickled (`record`): such a handle reads as
    naming its files only, enough to roll it back; its commit is refused."""

    VERSION = 2

    files: tuple[DataFileEntry, ...]
    job_id: str = ""
    #: Whether the participant has an entry in its epoch's journal (a task's: journal.py),
    #: which the epoch's commit deletes.
    journaled: bool = False

    @classmethod
    def _upgrade(cls, version: int, data: dict[str, Any]) -> dict[str, Any]:
        if version == 1 and isinstance(data.get("files"), list):
            files = [
                {"path": f.get("path"), "complete": False} if isinstance(f, dict) else f
                for f in data["files"]
            ]
            return {**data, "files": files}
        return data


def file_entry(data_file: DataFile, table: Table) -> DataFileEntry:
    """`data_file` (written for `table`, under its current partition spec, by pyiceberg's
    writer) as a handle's entry."""
    from pyiceberg.conversions import to_bytes

    spec = table.spec()
    kinds = [f.field_type for f in spec.partition_type(table.schema()).fields]
    partition = tuple(
        None if value is None else to_bytes(kind, value).hex()  # type: ignore[arg-type]
        for kind, value in zip(kinds, _values(data_file.partition), strict=True)
    )

    def counts(values: Mapping[int, int] | None) -> dict[str, int]:
        return {str(k): int(v) for k, v in (values or {}).items()}

    def bounds(values: Mapping[int, bytes] | None) -> dict[str, str]:
        return {str(k): bytes(v).hex() for k, v in (values or {}).items()}

    offsets = data_file.split_offsets
    return DataFileEntry(
        path=str(data_file.file_path),
        size=int(data_file.file_size_in_bytes),
        rows=int(data_file.record_count),
        format=data_file.file_format.name,
        spec_id=spec.spec_id,
        partition=partition,
        column_sizes=counts(data_file.column_sizes),
        value_counts=counts(data_file.value_counts),
        null_value_counts=counts(data_file.null_value_counts),
        nan_value_counts=counts(data_file.nan_value_counts),
        lower_bounds=bounds(data_file.lower_bounds),
        upper_bounds=bounds(data_file.upper_bounds),
        split_offsets=None if offsets is None else tuple(int(o) for o in offsets),
    )


def _values(record: Any) -> list[Any]:
    return [record[i] for i in range(len(record))]


def path_entry(path: str) -> DataFileEntry:
    """An entry naming a file found by listing (enough to delete it)."""
    return DataFileEntry(path=path, complete=False)


def paths_of(handle: CommitHandle) -> list[str]:
    return [f.path for f in IcebergHandleDetails.of(handle).files]


def data_files_of(handle: CommitHandle, table: Table) -> list[DataFile]:
    """The handle's files as pyiceberg DataFiles for an append to `table`; CorruptRecordError
    if an entry does not read or names its file only, and when the table's partition spec is
    no longer the one the files were written for."""
    found = []
    for entry in IcebergHandleDetails.of(handle).files:
        try:
            found.append(_data_file(entry, table))
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptRecordError(
                f"participant {handle.participant}: data file {entry.path} cannot be appended "
                f"to {'.'.join(table.name())}: {type(exc).__name__}: {exc}",
                sink=handle.sink,
                epoch=handle.epoch,
                fix="the handle was not made by this sink's pre_commit for this table, or the "
                "table's partition spec changed between the epoch's prepare and its commit "
                "(set the spec back to finish the epoch)",
            ) from exc
    return found


def _data_file(entry: DataFileEntry, table: Table) -> DataFile:
    from pyiceberg.conversions import from_bytes
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    if not entry.complete:
        raise ValueError("the entry names the file only")
    if entry.spec_id != table.spec().spec_id:  # an append adds files under the current spec
        raise ValueError(
            f"written for partition spec {entry.spec_id}, the table's is {table.spec().spec_id}"
        )
    kinds = [f.field_type for f in table.spec().partition_type(table.schema()).fields]
    partition = Record(
        *(
            None if value is None else from_bytes(kind, bytes.fromhex(value))  # type: ignore[arg-type]
            for kind, value in zip(kinds, entry.partition, strict=True)
        )
    )

    def counts(values: Mapping[str, Any]) -> dict[int, int]:
        return {int(k): int(v) for k, v in values.items()}

    def bounds(values: Mapping[str, Any]) -> dict[int, bytes]:
        return {int(k): bytes.fromhex(str(v)) for k, v in values.items()}

    offsets = None if entry.split_offsets is None else list(entry.split_offsets)
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=entry.path,
        file_format=FileFormat[entry.format],
        partition=partition,
        record_count=entry.rows,
        file_size_in_bytes=entry.size,
        column_sizes=counts(entry.column_sizes),
        value_counts=counts(entry.value_counts),
        null_value_counts=counts(entry.null_value_counts),
        nan_value_counts=counts(entry.nan_value_counts),
        lower_bounds=bounds(entry.lower_bounds),
        upper_bounds=bounds(entry.upper_bounds),
        split_offsets=offsets,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
    )
