"""What an Iceberg participant's handle holds: its data files (path, size, rows) and each
file's record for the epoch's append (pyiceberg's DataFile: partition, counts, column stats,
pickled and base64-encoded, since phase 2 may run in another process)."""

from __future__ import annotations

import base64
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import CorruptRecordError
from durable_sinks.core.handles import HandleDetails
from durable_sinks.core.protocol import CommitHandle

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile


@dataclass(frozen=True)
class IcebergHandleDetails(HandleDetails):
    """The participant's files, each `{"path", "size", "rows", "record"}`, and the job."""

    files: tuple[Mapping[str, Any], ...]
    job_id: str = ""


def file_entry(data_file: DataFile) -> dict[str, Any]:
    return {
        "path": str(data_file.file_path),
        "size": int(data_file.file_size_in_bytes),
        "rows": int(data_file.record_count),
        "record": base64.b64encode(pickle.dumps(data_file)).decode("ascii"),
    }


def paths_of(handle: CommitHandle) -> list[str]:
    return [str(f["path"]) for f in IcebergHandleDetails.of(handle).files]


def data_files_of(handle: CommitHandle) -> list[DataFile]:
    """The DataFile records the handle carries (CorruptRecordError if one does not read)."""
    found = []
    for entry in IcebergHandleDetails.of(handle).files:
        try:
            # Written by this sink's own pre_commit into the job's decision record.
            found.append(pickle.loads(base64.b64decode(str(entry["record"]))))  # noqa: S301
        except Exception as exc:
            raise CorruptRecordError(
                f"participant {handle.participant}: the record of data file {entry.get('path')} "
                f"does not read ({type(exc).__name__}: {exc})",
                sink=handle.sink,
                epoch=handle.epoch,
                fix="pyiceberg changed between the prepare and the commit: commit with the "
                "pyiceberg version that prepared the epoch",
            ) from exc
    return found
