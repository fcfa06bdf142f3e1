"""The versions of stored formats (core/formats.py): the one rule every reader applies
(versions `oldest..current` read, newer or older refused with StoredFormatError naming both
and the fix), which releases run one job together, and each format read as the previous
release (0.1.0) wrote it. The previous release's records below are byte for byte what it
wrote; the upgrade test (tests/upgrade) reads them from a real run of that release."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from durable_sinks.core.errors import CorruptRecordError, StoredFormatError
from durable_sinks.core.formats import (
    STORED_FORMATS,
    StoredFormat,
    interoperate,
    release_line,
    stored_format,
)
from durable_sinks.core.protocol import CommitHandle
from durable_sinks.manifest import DecisionRecord, LocalDirectoryStore
from durable_sinks.manifest._file_store import LAYOUT_FILE
from durable_sinks.sinks.iceberg.layout import Layout as IcebergLayout
from durable_sinks.sinks.kafka.progress import ProgressRecord, decode_fence, encode_fence
from durable_sinks.sinks.postgres.handles import PostgresHandleDetails
from durable_sinks.sinks.s3.epochs import EpochMarker

FORMAT = StoredFormat("test record", current=3, oldest=2, where="nowhere")


# -- the rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [2, 3])
def test_versions_from_the_oldest_to_the_current_are_read(version: int) -> None:
    assert FORMAT.check(version, source="here") == version


def test_state_without_a_version_reads_as_version_1() -> None:
    assert StoredFormat("x", current=2, oldest=1, where="").check(None, source="here") == 1


def test_a_newer_version_is_refused_naming_both_versions_and_the_upgrade() -> None:
    with pytest.raises(StoredFormatError) as raised:
        FORMAT.check(4, source="store/7.json", job="orders", sink="pg", epoch=7)
    error = raised.value
    assert "store/7.json: test record version 4 was written by a newer release" in error.message
    assert "this release reads versions 2 to 3" in error.message
    assert (error.job, error.sink, error.epoch) == ("orders", "pg", 7)
    assert error.fix is not None
    assert error.fix.startswith("upgrade durable-sinks")
    assert isinstance(error, CorruptRecordError)  # unreadable state: never skipped


def test_a_version_older_than_the_previous_release_is_refused() -> None:
    with pytest.raises(StoredFormatError, match="version 1 was written by an older release") as e:
        FORMAT.check(1, source="here")
    assert e.value.fix is not None
    assert "one minor release at a time" in e.value.fix


@pytest.mark.parametrize("found", [0, -1, True, "1", 1.0, [1]])
def test_what_is_not_a_version_is_a_corrupt_record(found: object) -> None:
    with pytest.raises(CorruptRecordError, match="is not a version") as raised:
        FORMAT.check(found, source="here")
    assert not isinstance(raised.value, StoredFormatError)


def test_a_format_reads_at_least_its_own_version() -> None:
    with pytest.raises(ValueError, match=r"reads versions 3\.\.2"):
        StoredFormat("x", current=2, oldest=3, where="")


def test_a_format_is_declared_once() -> None:
    known = STORED_FORMATS["decision record"]
    again = stored_format(known.name, current=known.current, oldest=known.oldest, where=known.where)
    assert again == known
    with pytest.raises(ValueError, match="declared twice"):
        stored_format(known.name, current=9, oldest=1, where="elsewhere")


# -- releases that run together ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b", "together"),
    [
        ("0.2.0", "0.2.7", True),
        ("0.2.0", "0.2.0.dev0", True),
        ("1.4.2", "1.4.0rc1", True),
        ("0.2.0", "0.1.0", False),
        ("0.2.0", "1.2.0", False),
        ("0+unknown", "0.2.0", False),
        ("0+unknown", "0+unknown", True),
    ],
)
def test_releases_of_one_major_minor_run_together(a: str, b: str, together: bool) -> None:
    assert interoperate(a, b) is together
    assert interoperate(b, a) is together


def test_a_release_line_is_its_major_and_minor() -> None:
    assert release_line("0.2.1") == "0.2"
    assert release_line("10.20") == "10.20"
    assert release_line("0.2.1.post3") == "0.2"


# -- each format, as the previous release wrote it -----------------------------------------------
HANDLE_010 = {
    "version": 1,
    "sink": "postgres",
    "epoch": 2,
    "participant": "ds:orders:postgres:2:0:1-0",
    "rows": 50,
    "bytes": 1200,
    "checksum": "abc",
    "details": {"v": 1, "gid": "ds:orders:postgres:2:0:1-0"},
}


def _record_010() -> bytes:
    """A decision record's bytes as release 0.1.0 wrote them (its envelope and checksum)."""
    record = {
        "job_id": "orders",
        "epoch": 2,
        "generation": 1,
        "created_at": 1764380000.0,
        "handles": [HANDLE_010],
    }
    body = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    envelope = {
        "format": "durable-sinks/decision",
        "version": 1,
        "sha256": hashlib.sha256(body.encode()).hexdigest(),
        "record": record,
    }
    return (json.dumps(envelope, sort_keys=True, separators=(",", ":")) + "\n").encode()


def test_a_decision_record_of_the_previous_release_is_read() -> None:
    record = DecisionRecord.from_bytes(_record_010(), source="x")
    assert (record.job_id, record.epoch, record.generation) == ("orders", 2, 1)
    assert record.handles[0] == CommitHandle.from_json(HANDLE_010)


def test_a_newer_decision_record_is_refused() -> None:
    envelope = json.loads(_record_010())
    envelope["version"] = 2
    with pytest.raises(StoredFormatError, match="x: decision record version 2"):
        DecisionRecord.from_bytes(json.dumps(envelope).encode(), source="x")


def test_handle_details_of_the_previous_release_are_read() -> None:
    handle = CommitHandle.from_json(HANDLE_010)
    details = PostgresHandleDetails.of(handle)
    assert details.to_json()["v"] == 1
    newer = CommitHandle.from_json({**HANDLE_010, "details": {"v": 2, "gid": "g"}})
    with pytest.raises(StoredFormatError, match="PostgresHandleDetails"):
        PostgresHandleDetails.of(newer)


def test_a_kafka_progress_record_of_the_previous_release_is_read() -> None:
    written = (
        b'{"checksum":"abc","decision":null,"epoch":2,"generation":1,'
        b'"longest_open_s":0.2,"open_s":0.1,"participant":"ds:orders:kafka:2:0:1-0",'
        b'"ranges":{"t":{"0":[0,50]}},"rows":50,"version":1}'
    )
    record = ProgressRecord.decode(written, "t@0")
    assert (record.epoch, record.rows, record.ranges) == (2, 50, {"t": {0: (0, 50)}})
    assert ProgressRecord.decode(record.encode(), "t@1") == record
    newer = json.loads(written)
    newer["version"] = 2
    with pytest.raises(StoredFormatError, match="t@0: Kafka progress record version 2"):
        ProgressRecord.decode(json.dumps(newer).encode(), "t@0")


def test_a_kafka_fence_record_of_the_previous_release_is_read() -> None:
    assert decode_fence(b'{"version": 1, "generation": 4}', "t@3") == 4
    assert decode_fence(encode_fence(5), "t@4") == 5
    with pytest.raises(StoredFormatError, match="t@3: Kafka fence record version 2"):
        decode_fence(b'{"version": 2, "generation": 4}', "t@3")


def _marker_010(version: int = 1) -> bytes:
    objects = [
        {
            "etag": '"e"',
            "key": "p/epoch=2/part-0.parquet",
            "participant": "ds:orders:s3:2:0:1-0",
            "rows": 50,
            "sha256": "0" * 64,
            "size": 1000,
        }
    ]
    body = {
        "format": "durable-sinks/s3-epoch",
        "version": version,
        "job_id": "orders",
        "sink": "s3",
        "epoch": 2,
        "rows": 50,
        "bytes": 1000,
        "objects": objects,
        "checksum": hashlib.sha256(
            json.dumps(objects, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest(),
    }
    return (json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n").encode()


def test_an_s3_epoch_marker_of_the_previous_release_is_read() -> None:
    marker = EpochMarker.from_bytes(_marker_010(), source="m")
    assert (marker.epoch, marker.rows) == (2, 50)
    assert marker.to_bytes() == _marker_010()
    with pytest.raises(StoredFormatError, match="m: S3 epoch marker version 2"):
        EpochMarker.from_bytes(_marker_010(2), source="m")


def test_a_directory_store_of_the_previous_release_is_read_and_a_newer_refused(
    tmp_path: Path,
) -> None:
    # Release 0.1.0 wrote no layout file: its folders read as version 1 (and get one).
    (tmp_path / "orders" / "decisions").mkdir(parents=True)
    store = LocalDirectoryStore(tmp_path)
    assert store.open("orders") == 1
    store.close()
    layout = tmp_path / "orders" / LAYOUT_FILE
    assert json.loads(layout.read_text())["version"] == 1
    layout.write_text('{"format": "durable-sinks/directory-store", "version": 2}')
    with pytest.raises(StoredFormatError, match="directory decision store layout version 2"):
        LocalDirectoryStore(tmp_path).open("orders")


def test_an_iceberg_snapshot_of_the_previous_release_is_read() -> None:
    layout = IcebergLayout("orders", "iceberg")
    summary = {"durable-sinks.job": "orders", "durable-sinks.sink": "iceberg"}
    assert layout.epoch_of({**summary, "durable-sinks.epoch": "2"}) == 2
    assert layout.epoch_of({**summary, "durable-sinks.epoch": "2", "durable-sinks.version": "1"})
    with pytest.raises(StoredFormatError, match="Iceberg snapshot summary version 2"):
        layout.epoch_of({**summary, "durable-sinks.epoch": "2", "durable-sinks.version": "2"})
