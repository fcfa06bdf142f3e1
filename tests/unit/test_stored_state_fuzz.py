"""Every decoder of stored state, fed corrupt and hostile content by hypothesis: commit handles
(and each sink's handle details), decision records, S3 epoch markers, Kafka progress and fence
records. Each either reads a record or raises CorruptRecordError (ManifestCorruptError for
decisions and progress records) naming what it read; never another exception, which would
leave a sink or the coordinator as a raw error or a crash."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_sinks.core import CommitHandle
from durable_sinks.core.errors import CorruptRecordError
from durable_sinks.core.protocol import HANDLE_VERSION
from durable_sinks.manifest import DecisionRecord
from durable_sinks.sinks.delta.handles import DeltaHandleDetails
from durable_sinks.sinks.folder.handles import FolderHandleDetails
from durable_sinks.sinks.iceberg.handles import IcebergHandleDetails
from durable_sinks.sinks.kafka.handles import KafkaHandleDetails
from durable_sinks.sinks.kafka.progress import ProgressRecord, decode_fence
from durable_sinks.sinks.postgres.handles import PostgresHandleDetails
from durable_sinks.sinks.s3.epochs import EpochMarker
from durable_sinks.sinks.s3.handles import S3HandleDetails

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: The field names the decoders look for: hostile content names them with wrong values.
KEYS = (
    "version",
    "v",
    "sink",
    "epoch",
    "participant",
    "rows",
    "bytes",
    "checksum",
    "details",
    "job_id",
    "generation",
    "created_at",
    "handles",
    "source",
    "content",
    "dead_letters",
    "decision",
    "ranges",
    "objects",
    "schemas",
    "format",
    "sha256",
    "record",
    "part",
    "key",
    "path",
    "paths",
    "files",
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["../../etc", "/abs/path", "s3://other/key", "ds:a:b:0:p:1-0"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=6),
    ),
    max_leaves=25,
)


def near_handle() -> st.SearchStrategy[dict[str, Any]]:
    """A commit handle's JSON with some fields replaced by anything."""
    base: dict[str, Any] = {
        "version": HANDLE_VERSION,
        "sink": "s",
        "epoch": 1,
        "participant": "ds:job:s:1:p0:1-0",
        "rows": 2,
        "bytes": 3,
        "checksum": "c",
        "details": {},
    }
    return st.dictionaries(st.sampled_from(sorted(base)), values, max_size=4).map(
        lambda changes: {**base, **changes}
    )


def to_bytes(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def reads_or_refuses(decode: Callable[[], object]) -> None:
    with contextlib.suppress(CorruptRecordError):
        decode()


@FUZZ
@given(st.one_of(values, near_handle()))
def test_a_commit_handle_is_read_or_refused(data: Any) -> None:
    reads_or_refuses(lambda: CommitHandle.from_json(data))


DETAILS = [
    DeltaHandleDetails,
    IcebergHandleDetails,
    FolderHandleDetails,
    KafkaHandleDetails,
    PostgresHandleDetails,
    S3HandleDetails,
]


@pytest.mark.parametrize("details", DETAILS, ids=lambda d: d.__name__)
@FUZZ
@given(data=st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), values))
def test_each_sinks_handle_details_are_read_or_refused(details: Any, data: Any) -> None:
    handle = CommitHandle("s", 1, "ds:job:s:1:p0:1-0", 2, 3, "c", data)
    reads_or_refuses(lambda: details.of(handle))


def near_record() -> st.SearchStrategy[dict[str, Any]]:
    handle = CommitHandle("s", 1, "ds:job:s:1:p0:1-0", 2, 3, "c", {}).to_json()
    base = DecisionRecord("job", 1, 1, (CommitHandle.from_json(handle),)).to_json()
    return st.dictionaries(st.sampled_from(sorted(base)), values, max_size=3).map(
        lambda changes: {**base, **changes}
    )


@FUZZ
@given(st.one_of(values, near_record()))
def test_a_decision_record_is_read_or_refused(data: Any) -> None:
    reads_or_refuses(lambda: DecisionRecord.from_json(data, source="fuzz"))
    record = {"format": "durable-sinks/decision", "version": 1, "sha256": "x", "record": data}
    for raw in (to_bytes(data), to_bytes(record)):
        reads_or_refuses(partial(DecisionRecord.from_bytes, raw, source="fuzz"))


@FUZZ
@given(st.binary(max_size=64))
def test_bytes_of_any_kind_are_read_or_refused(raw: bytes) -> None:
    reads_or_refuses(lambda: DecisionRecord.from_bytes(raw, source="fuzz"))
    reads_or_refuses(lambda: EpochMarker.from_bytes(raw, source="fuzz"))
    reads_or_refuses(lambda: ProgressRecord.decode(raw, "fuzz"))
    reads_or_refuses(lambda: decode_fence(raw, "fuzz"))


@FUZZ
@given(values)
def test_markers_and_progress_records_are_read_or_refused(data: Any) -> None:
    raw = to_bytes(data)
    reads_or_refuses(lambda: EpochMarker.from_bytes(raw, source="fuzz"))
    reads_or_refuses(lambda: ProgressRecord.decode(raw, "fuzz"))
    reads_or_refuses(lambda: decode_fence(raw, "fuzz"))


def test_deeply_nested_content_is_refused_not_a_recursion_error() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    for decode in (
        lambda: DecisionRecord.from_bytes(deep, source="fuzz"),
        lambda: EpochMarker.from_bytes(deep, source="fuzz"),
        lambda: ProgressRecord.decode(deep, "fuzz"),
        lambda: decode_fence(deep, "fuzz"),
    ):
        with pytest.raises(CorruptRecordError):
            decode()


def test_infinite_numbers_are_refused_not_an_overflow() -> None:
    handle = CommitHandle("s", 1, "ds:job:s:1:p0:1-0", 2, 3, "c", {}).to_json()
    with pytest.raises(CorruptRecordError):
        CommitHandle.from_json({**handle, "epoch": math.inf})
    with pytest.raises(CorruptRecordError):
        decode_fence(b'{"generation": Infinity}', "fuzz")
