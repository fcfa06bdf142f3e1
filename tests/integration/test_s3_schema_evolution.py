"""Schema evolution of the S3 sink against the test bed's S3 server: new, missing and widened
columns within an epoch, across epochs and across a restart; each object's schema in the
epoch marker; the readers (committed_dataset, committed_schema) unify them; a change that is
no evolution is refused before anything is visible."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, prepare_part
from durable_sinks.core.bad_rows import SchemaEvolution, WritePolicy
from durable_sinks.core.errors import SchemaMismatchError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.s3 import (
    EpochMarker,
    S3Sink,
    committed_dataset,
    committed_markers,
    committed_schema,
)
from tests.services import S3Endpoint
from tests.support.s3_objects import incomplete_uploads, object_keys
from tests.support.s3_target import s3_sink_config

EVOLVING = WritePolicy(schema_evolution=SchemaEvolution.ADD_COLUMNS)


@pytest.fixture
def path(s3: S3Endpoint, s3_prefix: str) -> str:
    return f"s3://{s3.bucket}/{s3_prefix.rstrip('/')}"


def started(s3: S3Endpoint, path: str, tmp_path: Path) -> Coordinator:
    coordinator = Coordinator(
        "job",
        [S3Sink(s3_sink_config(s3, path))],
        LocalDirectoryStore(tmp_path / "store"),
        policy=EVOLVING,
    )
    coordinator.start()
    return coordinator


def reader(s3: S3Endpoint) -> dict[str, Any]:
    return {
        "endpoint_url": s3.endpoint_url,
        "region": s3.region,
        "access_key_id": s3.access_key_id,
        "secret_access_key": s3.secret_access_key,
        "addressing_style": "path",
    }


def test_new_missing_and_widened_columns_evolve_the_dataset_and_readers_unify_them(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    job = started(s3, path, tmp_path)
    epoch0 = [
        pa.record_batch({"id": pa.array([0, 1], pa.int32()), "body": ["a", "b"]}),
        pa.record_batch({"id": pa.array([2], pa.int64()), "body": ["c"], "extra": ["x"]}),
    ]
    assert job.run_epoch(0, epoch0).outcome is EpochOutcome.COMMITTED
    job.close()
    [marker] = committed_markers(path, s3_sink_config(s3, path).connection)
    assert len(marker.objects) == 2  # the schema grew: a second object
    first, second = (marker.object_schema(o) for o in marker.objects)
    assert first is not None
    assert second is not None
    assert first.names == ["id", "body"]
    assert second == pa.schema([("id", pa.int64()), ("body", pa.string()), ("extra", pa.string())])
    assert marker.schema() == second

    # A restart starts from the last epoch's schema: a narrower batch without `extra` is
    # written widened and with `extra` null (what Spark readers need).
    job = started(s3, path, tmp_path)
    epoch1 = [pa.record_batch({"id": pa.array([3], pa.int32()), "more": [1.5]})]
    assert job.run_epoch(1, epoch1).outcome is EpochOutcome.COMMITTED
    job.close()
    markers = committed_markers(path, s3_sink_config(s3, path).connection)
    [only] = markers[1].objects
    expected = second.append(pa.field("more", pa.float64()))
    assert markers[1].object_schema(only) == expected
    assert committed_schema(path, **reader(s3)) == expected
    table = committed_dataset(path, **reader(s3)).to_table().sort_by("id")
    assert table.schema.names == [*expected.names, "epoch"]
    assert table.to_pylist() == [
        {"id": 0, "body": "a", "extra": None, "more": None, "epoch": 0},
        {"id": 1, "body": "b", "extra": None, "more": None, "epoch": 0},
        {"id": 2, "body": "c", "extra": "x", "more": None, "epoch": 0},
        {"id": 3, "body": None, "extra": None, "more": 1.5, "epoch": 1},
    ]


def test_executor_parts_of_different_schemas_publish_one_marker_readers_unify(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    """Each task's part evolves on its own; the marker lists each distinct schema once."""
    job = Coordinator(
        "job",
        [S3Sink(s3_sink_config(s3, path))],
        LocalDirectoryStore(tmp_path / "store"),
        executor_mode=True,
        policy=EVOLVING,
    )
    job.start()
    parts = {
        "p0-t1": [pa.record_batch({"id": pa.array([0, 1], pa.int32())})],
        "p1-t2": [pa.record_batch({"id": pa.array([2], pa.int64()), "extra": ["x"]})],
        "p2-t3": [pa.record_batch({"id": pa.array([3], pa.int32())})],
    }

    def prepare(generation: int) -> list[Any]:
        return [
            handle
            for part, batches in parts.items()
            for handle in prepare_part(
                "job",
                generation,
                0,
                part,
                lambda: [S3Sink(s3_sink_config(s3, path))],
                batches,
                policy=EVOLVING,
            )
        ]

    assert job.run_distributed_epoch(0, prepare).outcome is EpochOutcome.COMMITTED
    job.close()
    [marker] = committed_markers(path, s3_sink_config(s3, path).connection)
    assert len(marker.objects) == 3
    assert len(marker.schemas) == 2
    assert marker.schema() == pa.schema([("id", pa.int64()), ("extra", pa.string())])
    table = committed_dataset(path, **reader(s3)).to_table().sort_by("id")
    assert table.select(["id", "extra"]).to_pylist() == [
        {"id": 0, "extra": None},
        {"id": 1, "extra": None},
        {"id": 2, "extra": "x"},
        {"id": 3, "extra": None},
    ]


def test_a_change_that_is_no_evolution_is_refused_and_leaves_nothing(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    job = started(s3, path, tmp_path)
    job.run_epoch(0, [pa.record_batch({"id": pa.array([0], pa.int64())})])
    with pytest.raises(SchemaMismatchError, match="'id' changes type from int64 to string") as e:
        job.run_epoch(1, [pa.record_batch({"id": [1]}), pa.record_batch({"id": ["one"]})])
    assert "cast the column back" in str(e.value)
    job.close()
    prefix = path.removeprefix(f"s3://{s3.bucket}/") + "/"
    assert incomplete_uploads(s3.client(), s3.bucket, prefix) == []
    assert [
        k for k in object_keys(s3.client(), s3.bucket, prefix) if "epoch=000000000001" in k
    ] == []
    assert committed_dataset(path, **reader(s3)).to_table().column("id").to_pylist() == [0]


def test_a_marker_written_before_schemas_were_recorded_still_reads() -> None:
    """Markers carry no schemas when their handles had none; their bytes and checksum are
    what they always were."""
    old = {
        "format": "durable-sinks/s3-epoch",
        "version": 1,
        "job_id": "job",
        "sink": "s3",
        "epoch": 4,
        "rows": 2,
        "bytes": 10,
        "objects": [
            {
                "key": "p/epoch=000000000004/part-driver_g1a0_00000.parquet",
                "size": 10,
                "etag": '"e"',
                "rows": 2,
                "participant": "ds:job:s3:4:driver:g1:a0",
                "sha256": "00",
            }
        ],
    }
    listing = json.dumps(old["objects"], sort_keys=True, separators=(",", ":"))
    old["checksum"] = hashlib.sha256(listing.encode()).hexdigest()
    data = json.dumps(old).encode()
    marker = EpochMarker.from_bytes(data, source="old")
    assert marker.schemas == ()
    assert marker.schema() is None
    assert json.loads(marker.to_bytes()) == old
