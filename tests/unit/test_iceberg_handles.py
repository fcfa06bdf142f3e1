"""An Iceberg handle's details read back as typed data files; an older handle (pickled
pyiceberg records) reads as naming its files only, and a newer one is refused by name."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from durable_sinks.core.errors import CorruptRecordError
from durable_sinks.core.protocol import JSON, CommitHandle
from durable_sinks.sinks.iceberg.handles import DataFileEntry, IcebergHandleDetails, paths_of


def handle(details: Mapping[str, JSON]) -> CommitHandle:
    return CommitHandle("iceberg", 3, "ds:j:iceberg:3:p0-t1:1-0", 2, 10, "", details)


def test_details_read_back_as_written() -> None:
    entry = DataFileEntry(
        path="s3://b/t/data/00000-1-u.parquet",
        size=10,
        rows=2,
        spec_id=1,
        partition=("0a000000", None),
        lower_bounds={"1": "0100000000000000"},
        split_offsets=(4,),
    )
    details = IcebergHandleDetails((entry,), "j")
    assert IcebergHandleDetails.of(handle(details.to_json())) == details


def test_a_version_1_handle_names_its_files_only() -> None:
    old: dict[str, JSON] = {
        "files": [{"path": "file:///w/a.parquet", "size": 5, "rows": 1, "record": "gASV"}]
    }
    read = IcebergHandleDetails.of(handle(old))
    assert [f.complete for f in read.files] == [False]
    assert paths_of(handle(old)) == ["file:///w/a.parquet"]


def test_a_newer_handle_is_refused_naming_the_participant() -> None:
    with pytest.raises(CorruptRecordError, match="ds:j:iceberg:3:p0-t1:1-0"):
        IcebergHandleDetails.of(handle({"v": 99, "files": []}))
