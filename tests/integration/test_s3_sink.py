"""The S3 sink against the test bed's S3 server (SeaweedFS): epochs read back through the
markers, large epochs in several parts and objects, executor-mode parts, and every bad input
and setting refused with its fix before anything becomes visible."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError

from durable_sinks.coordinator import Coordinator, EpochOutcome, prepare_part
from durable_sinks.core.errors import (
    ConfigError,
    FencedError,
    ParticipantLostError,
    SchemaMismatchError,
    StoredFormatError,
    UnreachableError,
)
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.s3 import S3Sink, committed_dataset, committed_markers
from durable_sinks.sinks.s3 import recovery as s3_recovery
from tests.services import S3Endpoint
from tests.support.s3_access import S3Access
from tests.support.s3_faults import without_conditional_writes
from tests.support.s3_objects import Upload, incomplete_uploads, object_keys, temporary_bucket
from tests.support.s3_target import s3_sink_config

MiB = 1024 * 1024


@pytest.fixture
def path(s3: S3Endpoint, s3_prefix: str) -> str:
    return f"s3://{s3.bucket}/{s3_prefix.rstrip('/')}"


def sink(s3: S3Endpoint, path: str, **options: Any) -> S3Sink:
    return S3Sink(s3_sink_config(s3, path, **options))


def started(s3: S3Endpoint, path: str, tmp_path: Path, **options: Any) -> Coordinator:
    coordinator = Coordinator(
        "job", [sink(s3, path, **options)], LocalDirectoryStore(tmp_path / "store"), source="q"
    )
    coordinator.start()
    return coordinator


def events(start: int, count: int) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(start, start + count), pa.int64()),
            "text": [f"row {i}" for i in range(start, start + count)],
        }
    )


def leftovers(s3: S3Endpoint, path: str) -> list[Upload]:
    prefix = path.removeprefix(f"s3://{s3.bucket}/") + "/"
    return incomplete_uploads(s3.client(), s3.bucket, prefix)


def data_keys(s3: S3Endpoint, path: str) -> list[str]:
    prefix = path.removeprefix(f"s3://{s3.bucket}/") + "/epoch="
    return object_keys(s3.client(), s3.bucket, prefix)


def reader_settings(s3: S3Endpoint) -> dict[str, Any]:
    return {
        "endpoint_url": s3.endpoint_url,
        "region": s3.region,
        "access_key_id": s3.access_key_id,
        "secret_access_key": s3.secret_access_key,
        "addressing_style": "path",
    }


def test_committed_epochs_read_back_through_the_markers(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    coordinator = started(s3, path, tmp_path)
    for epoch in range(3):
        batches = [events(epoch * 100, 60), events(epoch * 100 + 60, 40)]
        assert coordinator.run_epoch(epoch, batches).outcome is EpochOutcome.COMMITTED
    assert coordinator.run_epoch(3, []).outcome is EpochOutcome.COMMITTED  # empty epoch
    assert coordinator.run_epoch(2, [events(0, 5)]).outcome is EpochOutcome.ALREADY_COMMITTED
    coordinator.close()
    table = committed_dataset(path, **reader_settings(s3)).to_table()
    assert sorted(table.column("id").to_pylist()) == [
        e * 100 + i for e in range(3) for i in range(100)
    ]
    assert sorted(set(table.column("epoch").to_pylist())) == [0, 1, 2]
    markers = committed_markers(path, s3_sink_config(s3, path).connection)
    assert [m.epoch for m in markers] == [0, 1, 2, 3]
    assert [m.rows for m in markers] == [100, 100, 100, 0]
    assert leftovers(s3, path) == []
    again = Coordinator("job", [sink(s3, path)], LocalDirectoryStore(tmp_path / "store"))
    again.start()
    assert again.sinks[0].last_committed_epoch() == 3


def test_a_large_epoch_is_uploaded_in_parts_and_rolls_over_to_new_objects(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    """Incompressible rows: ~13 MiB of Parquet in 5 MiB parts and objects of at most
    6 MiB: several objects, the first ones of two parts each."""
    coordinator = started(s3, path, tmp_path, part_size_bytes=5 * MiB, max_file_bytes=6 * MiB)
    blobs = [os.urandom(64 * 1024) for _ in range(200)]
    batches = [
        pa.record_batch({"id": list(range(i, i + 10)), "blob": blobs[i : i + 10]})
        for i in range(0, 200, 10)
    ]
    result = coordinator.run_epoch(0, batches)
    coordinator.close()
    [handle] = result.decision.handles
    objects = handle.details["objects"]
    assert isinstance(objects, list)
    assert len(objects) >= 2
    parts = [
        len(o["etags"]) for o in objects if isinstance(o, dict) and isinstance(o["etags"], list)
    ]
    assert len(parts) == len(objects)
    assert all(n >= 2 for n in parts[:-1])
    assert handle.rows == 200
    table = committed_dataset(path, **reader_settings(s3)).to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(200))
    assert leftovers(s3, path) == []


@pytest.mark.parametrize(
    ("options", "row_groups"), [({}, [500]), ({"row_group_rows": 200}, [200, 200, 100])]
)
def test_batches_are_gathered_into_row_groups(
    s3: S3Endpoint, path: str, tmp_path: Path, options: dict[str, Any], row_groups: list[int]
) -> None:
    """Five batches of 100 rows: one row group by default (as pyarrow's own write_table of
    the epoch), or row groups of row_group_rows, in the batches' order."""
    coordinator = started(s3, path, tmp_path, **options)
    coordinator.run_epoch(0, [events(n * 100, 100) for n in range(5)])
    coordinator.close()
    [key] = data_keys(s3, path)
    body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    parquet = pq.ParquetFile(pa.BufferReader(body))
    counts = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
    assert counts == row_groups
    assert parquet.read().column("id").to_pylist() == list(range(500))


def test_an_upload_aborted_while_its_parts_are_sent_fences_the_epoch(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    """Someone aborts the upload while parts travel in the background: the next part (or
    the last) fails, the epoch is refused as fenced, and nothing is visible or left."""
    coordinator = started(s3, path, tmp_path, part_size_bytes=5 * MiB, row_group_rows=10)
    blobs = [os.urandom(64 * 1024) for _ in range(20)]

    def batches() -> Iterator[pa.RecordBatch]:
        for n in range(30):  # ~19 MiB of incompressible rows, a row group per batch
            if n == 12:  # a part is on its way or sent
                for upload in leftovers(s3, path):
                    s3.client().abort_multipart_upload(
                        Bucket=s3.bucket, Key=upload.key, UploadId=upload.upload_id
                    )
            yield pa.record_batch({"id": list(range(n * 10, n * 10 + 10)), "blob": blobs[:10]})

    with pytest.raises(FencedError, match="aborted by someone else") as caught:
        coordinator.run_epoch(0, batches())
    assert caught.value.fix
    coordinator.close()
    assert leftovers(s3, path) == []
    assert data_keys(s3, path) == []
    assert committed_markers(path, s3_sink_config(s3, path).connection) == []


def test_a_batch_of_another_schema_is_refused_and_nothing_is_left(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    coordinator = started(s3, path, tmp_path)
    other = pa.record_batch({"id": ["not", "an", "int"], "text": ["a", "b", "c"]})
    with pytest.raises(SchemaMismatchError, match="column 'id' has type string") as caught:
        coordinator.run_epoch(0, [events(0, 3), other])
    assert caught.value.fix
    assert committed_markers(path, s3_sink_config(s3, path).connection) == []
    assert leftovers(s3, path) == []
    assert data_keys(s3, path) == []


def test_a_missing_bucket_is_refused_at_start(s3: S3Endpoint, tmp_path: Path) -> None:
    missing = f"s3://ds-missing-{uuid.uuid4().hex[:12]}/events"
    coordinator = Coordinator("job", [sink(s3, missing)], LocalDirectoryStore(tmp_path / "store"))
    with pytest.raises(ConfigError, match="NoSuchBucket") as caught:
        coordinator.start()
    assert "create the bucket" in str(caught.value)


def test_a_wrong_secret_is_refused_without_showing_it(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    secret = "wrong-" + uuid.uuid4().hex
    config = s3_sink_config(s3, path)
    bad = S3Sink(type(config)(**{**config.__dict__, "secret_access_key": secret}))
    coordinator = Coordinator("job", [bad], LocalDirectoryStore(tmp_path / "store"))
    with pytest.raises(ConfigError, match="SignatureDoesNotMatch") as caught:
        coordinator.start()
    assert secret not in str(caught.value)
    assert secret not in repr(bad) + repr(bad.config)


def test_an_unreachable_server_is_retriable_and_named(s3: S3Endpoint, tmp_path: Path) -> None:
    config = s3_sink_config(s3, f"s3://{s3.bucket}/events")
    down = S3Sink(
        type(config)(
            **{**config.__dict__, "endpoint_url": "http://127.0.0.1:9", "connect_timeout_s": 1}
        )
    )
    coordinator = Coordinator("job", [down], LocalDirectoryStore(tmp_path / "store"))
    with pytest.raises(UnreachableError, match=r"127\.0\.0\.1:9"):
        coordinator.start()


def test_a_server_without_conditional_writes_is_refused(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    """A server that ignores If-None-Match, simulated by dropping the header from the sink's
    own (shared) client before it is signed."""
    config = s3_sink_config(s3, path, recovery_window_s=2 * 86_400)  # its own start-up check
    with without_conditional_writes(config.connection.client()):
        coordinator = Coordinator("job", [S3Sink(config)], LocalDirectoryStore(tmp_path / "s"))
        with pytest.raises(ConfigError, match="ignores If-None-Match") as caught:
            coordinator.start()
    assert "conditional writes" in str(caught.value)
    probes = path.removeprefix(f"s3://{s3.bucket}/") + "/_durable/"
    assert object_keys(s3.client(), s3.bucket, probes) == []


@pytest.fixture
def own_bucket(s3: S3Endpoint) -> Iterator[str]:
    """A bucket of this test's own (lifecycle rules are per bucket)."""
    with temporary_bucket(s3, "lifecycle") as endpoint:
        yield endpoint.bucket


def test_a_lifecycle_rule_shorter_than_the_recovery_window_is_refused(
    s3: S3Endpoint, own_bucket: str, tmp_path: Path
) -> None:
    s3.client().put_bucket_lifecycle_configuration(
        Bucket=own_bucket,
        LifecycleConfiguration={
            "Rules": [
                {
                    "ID": "abort-stale-uploads",
                    "Status": "Enabled",
                    "Filter": {"Prefix": "data/"},
                    "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2},
                }
            ]
        },
    )
    path = f"s3://{own_bucket}/data/events"
    coordinator = Coordinator("job", [sink(s3, path)], LocalDirectoryStore(tmp_path / "a"))
    with pytest.raises(ConfigError, match="'abort-stale-uploads' aborts") as caught:
        coordinator.start()
    assert "DaysAfterInitiation to >= 7" in str(caught.value)
    # A window the rule respects, or a prefix it does not cover, is fine.
    Coordinator(
        "job", [sink(s3, path, recovery_window_s=2 * 86_400)], LocalDirectoryStore(tmp_path / "b")
    ).start()
    elsewhere = f"s3://{own_bucket}/other/events"
    Coordinator("job2", [sink(s3, elsewhere)], LocalDirectoryStore(tmp_path / "c")).start()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"part_size_bytes": 1 * MiB}, "outside S3's limits for a part"),
        ({"part_size_bytes": 6 * 1024 * MiB}, "outside S3's limits for a part"),
        ({"part_size_bytes": 5 * MiB, "max_file_bytes": 60 * 1024 * MiB}, "10000 parts"),
        ({"max_file_bytes": 6 * 1024**4}, "5 TiB"),
        ({"compression": "lzo"}, "compression 'lzo'"),
        ({"recovery_window_s": 3600}, "recovery_window_s"),
        ({"row_group_rows": 0}, "row_group_rows must be a positive whole number"),
        ({"row_group_bytes": 1.5}, "row_group_bytes must be a positive whole number"),
    ],
)
def test_settings_beyond_s3s_limits_are_refused_when_built(
    s3: S3Endpoint, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        s3_sink_config(s3, f"s3://{s3.bucket}/events", **options)
    assert caught.value.fix


@pytest.mark.parametrize(
    "bad_path", ["events", "s3://", "s3://Bad_Bucket/x", "s3://bucket", "s3://b/a//c", "gs://b/x"]
)
def test_paths_that_are_not_a_bucket_and_prefix_are_refused(s3: S3Endpoint, bad_path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        s3_sink_config(s3, bad_path)
    assert caught.value.fix


def test_a_prefix_owned_by_another_job_is_refused(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    started(s3, path, tmp_path).close()
    other = Coordinator("other-job", [sink(s3, path)], LocalDirectoryStore(tmp_path / "x"))
    with pytest.raises(ConfigError, match="belongs to") as caught:
        other.start()
    assert "its own path" in str(caught.value)


def test_a_job_file_of_the_previous_release_is_read_and_a_newer_one_refused(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    """`_job.json` carries its version; the previous release wrote none (version 1)."""
    client = s3.client()
    key = f"{path.split('/', 3)[3]}/_job.json"
    started(s3, path, tmp_path).close()
    written = json.loads(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    assert written == {"job_id": "job", "sink": "s3", "version": 1}
    client.put_object(Bucket=s3.bucket, Key=key, Body=b'{"job_id": "job", "sink": "s3"}')
    started(s3, path, tmp_path).close()
    newer = {"job_id": "job", "sink": "s3", "version": 2}
    client.put_object(Bucket=s3.bucket, Key=key, Body=json.dumps(newer).encode())
    with pytest.raises(StoredFormatError, match=r"_job\.json: S3 job file version 2 was written"):
        started(s3, path, tmp_path)


def test_a_decided_epoch_whose_upload_was_aborted_is_data_loss(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    coordinator = started(s3, path, tmp_path)
    steps = coordinator.epoch_steps(0, [events(0, 10)])
    while next(steps) != "after-decision":
        pass  # the driver dies right after the decision
    [upload] = leftovers(s3, path)
    s3.client().abort_multipart_upload(Bucket=s3.bucket, Key=upload.key, UploadId=upload.upload_id)
    successor = Coordinator("job", [sink(s3, path)], LocalDirectoryStore(tmp_path / "store"))
    # Recovery sees nothing left to do (the upload is gone); the replay of the epoch tries to
    # finish the decided commit and must say the data is lost.
    successor.start()
    with pytest.raises(ParticipantLostError, match="data loss"):
        successor.run_epoch(0, [events(0, 10)])
    assert committed_markers(path, s3_sink_config(s3, path).connection) == []


def test_executor_parts_commit_once_and_losing_attempts_are_aborted(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    coordinator = Coordinator(
        "job", [sink(s3, path)], LocalDirectoryStore(tmp_path / "store"), executor_mode=True
    )
    coordinator.start()

    def prepare(generation: int) -> list[Any]:
        def build() -> list[Any]:
            return [sink(s3, path)]

        winners = []
        for part, start in (("p0-t1", 0), ("p1-t2", 10)):
            winners += prepare_part("job", generation, 0, part, build, [events(start, 10)])
        prepare_part("job", generation, 0, "p1-t3", build, [events(10, 10)])  # a speculative twin
        return winners

    result = coordinator.run_distributed_epoch(0, prepare)
    assert result.outcome is EpochOutcome.COMMITTED
    assert leftovers(s3, path) == []
    table = committed_dataset(path, **reader_settings(s3)).to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(20))
    assert len(data_keys(s3, path)) == 2


def test_a_completed_object_is_never_overwritten(s3: S3Endpoint, path: str, tmp_path: Path) -> None:
    coordinator = started(s3, path, tmp_path)
    result = coordinator.run_epoch(0, [events(0, 5)])
    [handle] = result.decision.handles
    objects = handle.details["objects"]
    assert isinstance(objects, list)
    key = str(objects[0]["key"])  # type: ignore[index, call-overload]
    with pytest.raises(ClientError, match="PreconditionFailed"):
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b"x", IfNoneMatch="*")
    assert coordinator.sinks[0].commit_epoch(0, handle).value == "already_committed"


@pytest.mark.parametrize(
    ("denied", "named"),
    [
        ("s3:ListBucket", "s3:ListBucket"),
        ("s3:PutObject", "_job.json"),
        ("s3:GetObject", "s3:GetObject"),
        ("s3:DeleteObject", "s3:DeleteObject"),
        ("s3:ListBucketMultipartUploads", "s3:ListBucketMultipartUploads"),
        ("s3:AbortMultipartUpload", "s3:AbortMultipartUpload"),
    ],
)
def test_a_missing_permission_is_refused_at_start_naming_it(
    s3_access: S3Access, denied: str, named: str, tmp_path: Path
) -> None:
    """On moto, which evaluates S3's fine-grained actions: credentials without one action the
    sink uses are refused when the job starts, naming what was refused; no data object, no
    marker and no upload of the dataset is left."""
    limited = s3_access.endpoint("moto", deny=[denied])
    path = f"s3://{limited.bucket}/perm-{uuid.uuid4().hex[:10]}"
    coordinator = Coordinator("job", [sink(limited, path)], LocalDirectoryStore(tmp_path / "s"))
    with pytest.raises(ConfigError, match="AccessDenied") as caught:
        coordinator.start()
    assert named in str(caught.value)
    assert "retrying cannot help" in str(caught.value)
    admin = s3_access.admin("moto")
    prefix = path.removeprefix(f"s3://{limited.bucket}/")
    assert object_keys(admin.client(), limited.bucket, f"{prefix}/epoch=") == []
    assert object_keys(admin.client(), limited.bucket, f"{prefix}/_epochs/") == []
    assert incomplete_uploads(admin.client(), limited.bucket, f"{prefix}/epoch=") == []


def test_unreadable_lifecycle_rules_only_warn(
    s3_access: S3Access, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    limited = s3_access.endpoint("moto", deny=["s3:GetLifecycleConfiguration"])
    path = f"s3://{limited.bucket}/perm-{uuid.uuid4().hex[:10]}"
    coordinator = Coordinator("job", [sink(limited, path)], LocalDirectoryStore(tmp_path / "s"))
    coordinator.start()
    assert coordinator.run_epoch(0, [events(0, 3)]).outcome is EpochOutcome.COMMITTED
    assert "cannot read the lifecycle rules" in caplog.text


class CountedListings:
    """A real S3 client that counts its ListObjectsV2 requests."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.listings = 0

    def list_objects_v2(self, **request: Any) -> Any:
        self.listings += 1
        return self.client.list_objects_v2(**request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_the_newest_epoch_is_found_from_the_hint_the_last_open_left(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    coordinator = started(s3, path, tmp_path)
    for epoch in range(3):
        coordinator.run_epoch(epoch, [events(epoch, 1)])
    coordinator.close()
    again = started(s3, path, tmp_path)  # its open leaves the hint: epoch 2
    opened = again.sinks[0]
    assert isinstance(opened, S3Sink)
    layout, client = opened.layout, s3.client()
    body = client.get_object(Bucket=s3.bucket, Key=layout.newest_key)["Body"].read()
    assert json.loads(body) == {"epoch": 2, "version": 1}
    counted = CountedListings(client)
    assert s3_recovery.last_committed(opened, counted, layout) == 2  # type: ignore[arg-type]
    assert counted.listings == 2  # whatever the number of epochs

    def found_with_hint(hint: bytes) -> int | None:
        client.put_object(Bucket=s3.bucket, Key=layout.newest_key, Body=hint)
        return s3_recovery.last_committed(opened, client, layout)

    # A hint is a starting point only: older (newer epochs since), newer than every marker
    # (markers deleted), or not a hint at all, the listings give the answer.
    for stale in (
        b'{"epoch": 0, "version": 1}',
        b'{"epoch": 40, "version": 1}',
        b'{"epoch": 2, "version": 2}',
        b"not json",
        b'{"epoch": -3, "version": 1}',
    ):
        assert found_with_hint(stale) == 2, stale
    for epoch in (1, 2):
        client.delete_object(Bucket=s3.bucket, Key=layout.marker_key(epoch))
    assert found_with_hint(b'{"epoch": 2, "version": 1}') == 0
    client.delete_object(Bucket=s3.bucket, Key=layout.newest_key)
    assert s3_recovery.last_committed(opened, client, layout) == 0
    again.close()
