"""Schema evolution of the files sink and the rules it shares with the S3 sink
(core/evolution.py): new and missing columns and safe widenings evolve the dataset, within an
epoch and across epochs and restarts, and readers see every file in the unified schema;
anything else is refused with the fix before anything is written, and without add_columns a
new schema is refused as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks.core import CommitHandle, OpenContext
from durable_sinks.core.bad_rows import SchemaEvolution, WritePolicy
from durable_sinks.core.errors import SchemaMismatchError
from durable_sinks.core.evolution import conform, evolve, schema_of_text, schema_text, unify
from durable_sinks.sinks.folder import (
    STAGING,
    Files,
    FolderSink,
    committed_dataset,
    committed_schema,
)

EVOLVING = WritePolicy(schema_evolution=SchemaEvolution.ADD_COLUMNS)


def opened(path: Path, generation: int = 1, policy: WritePolicy = EVOLVING) -> FolderSink:
    sink = FolderSink(Files(str(path), fsync=False))
    sink.open(OpenContext("job", "files", generation, policy=policy))
    return sink


def rows(**columns: Any) -> pa.RecordBatch:
    return pa.record_batch(columns)


def committed(sink: FolderSink, epoch: int, *batches: pa.RecordBatch) -> CommitHandle:
    sink.begin_epoch(epoch)
    for b in batches:
        sink.write_batch(b)
    handle = sink.pre_commit(epoch)
    sink.commit_epoch(epoch, handle)
    return handle


def test_the_rules_add_fill_widen_and_refuse_the_rest() -> None:
    base = pa.schema([pa.field("id", pa.int32(), nullable=False), ("f", pa.float32())])
    batch = pa.schema([("id", pa.int64()), ("extra", pa.string())])
    evolved = evolve(base, batch)
    assert evolved == pa.schema([("id", pa.int64()), ("f", pa.float32()), ("extra", pa.string())])
    assert evolve(evolved, base) == evolved  # narrower and missing: nothing changes
    assert unify([base, batch, pa.schema([("f", pa.float64())])]) == evolve(
        evolved, pa.schema([("f", pa.float64())])
    )
    assert unify([]) is None
    narrow = pa.record_batch({"f": pa.array([1.5], pa.float32())})
    assert conform(narrow, evolved).to_pylist() == [{"id": None, "f": 1.5, "extra": None}]
    assert schema_of_text(schema_text(evolved)) == evolved
    for old, new in [
        (pa.int32(), pa.float64()),
        (pa.int64(), pa.string()),
        (pa.uint64(), pa.int64()),
        (pa.list_(pa.int32()), pa.list_(pa.int64())),
    ]:
        with pytest.raises(SchemaMismatchError, match="not a safe widening") as raised:
            unify([pa.schema([("c", old)]), pa.schema([("c", new)])])
        assert "cast the column back" in str(raised.value)
    assert unify([pa.schema([("c", pa.uint32())]), pa.schema([("c", pa.int64())])]) == (
        pa.schema([("c", pa.int64())])
    )


def test_a_schema_growing_mid_epoch_starts_a_new_file_and_readers_unify(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    assert sink.capabilities().schema_evolution
    i32 = pa.array([0, 1], pa.int32())
    handle = committed(
        sink,
        0,
        rows(id=i32, body=["a", "b"]),
        rows(id=pa.array([2], pa.int64()), body=["c"], extra=["x"]),
        rows(id=pa.array([3], pa.int32())),  # body missing, narrower id
    )
    published = tmp_path / "epoch=0" / f"part={handle.participant.split(':')[4]}"
    assert sorted(f.name for f in published.glob("*.parquet")) == [
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    schemas = handle.details["schemas"]
    assert isinstance(schemas, list)
    recorded = [schema_of_text(str(s)) for s in schemas]
    assert [s.names for s in recorded] == [["id", "body"], ["id", "body", "extra"]]
    assert recorded[1].field("id").type == pa.int64()

    # Across epochs and a restart: the new instance starts from the last epoch's schema.
    restarted = opened(tmp_path, generation=2)
    assert restarted.schema() == recorded[1]
    committed(restarted, 1, rows(id=pa.array([4], pa.int32()), more=[1.5]))
    expected = pa.schema(
        [("id", pa.int64()), ("body", pa.string()), ("extra", pa.string()), ("more", pa.float64())]
    )
    assert committed_schema(tmp_path) == expected
    table = committed_dataset(tmp_path).to_table().sort_by("id")
    assert table.schema.names == [*expected.names, "epoch", "part"]
    assert table.select(expected.names).to_pylist() == [
        {"id": 0, "body": "a", "extra": None, "more": None},
        {"id": 1, "body": "b", "extra": None, "more": None},
        {"id": 2, "body": "c", "extra": "x", "more": None},
        {"id": 3, "body": None, "extra": None, "more": None},
        {"id": 4, "body": None, "extra": None, "more": 1.5},
    ]
    assert table.column("epoch").to_pylist() == [0, 0, 0, 0, 1]
    assert committed_dataset(tmp_path, epochs=range(1, 2)).count_rows() == 1


def test_a_change_that_is_no_evolution_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    sink = opened(tmp_path)
    committed(sink, 0, rows(id=pa.array([0], pa.int64())))
    sink.begin_epoch(1)
    with pytest.raises(SchemaMismatchError, match="'id' changes type from int64 to string") as e:
        sink.write_batch(rows(id=["zero"]))
    assert e.value.epoch == 1
    assert e.value.sink == "files"
    sink.rollback_epoch(1, None)
    assert list((tmp_path / STAGING).iterdir()) == []
    assert not (tmp_path / "epoch=1").exists()


def test_without_add_columns_a_new_column_is_refused_as_before(tmp_path: Path) -> None:
    sink = opened(tmp_path, policy=WritePolicy())
    sink.begin_epoch(0)
    sink.write_batch(rows(id=[0]))
    with pytest.raises(SchemaMismatchError, match="'extra' is not in the sink's schema") as e:
        sink.write_batch(rows(id=[1], extra=["x"]))
    assert "schema_evolution='add_columns'" in str(e.value)
