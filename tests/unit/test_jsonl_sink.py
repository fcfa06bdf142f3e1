"""The reference JSON Lines sink on its own: what it writes and where, phase 2 from a fresh
instance given only the handle (idempotent both ways), recovery of what an older generation
left, handles of an unknown version refused, and the operator's views."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.core import CommitHandle, CommitOutcome, OpenContext
from durable_sinks.core.errors import (
    ConfigError,
    FencedError,
    ParticipantLostError,
    SchemaMismatchError,
    StoredFormatError,
)
from durable_sinks.core.operations import OperableSink
from durable_sinks.core.protocol import DistributedSink, SinkConnector
from durable_sinks.sinks import create
from durable_sinks.sinks.folder import MARKER, ROWS, STAGING, FolderSink, Jsonl


def opened(path: Path, generation: int = 1, job: str = "job") -> FolderSink:
    sink = FolderSink(Jsonl(str(path)))
    sink.open(OpenContext(job, "jsonl", generation))
    return sink


def batch(start: int = 0, n: int = 3) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": list(range(start, start + n)), "name": [f"r{i}" for i in range(start, start + n)]}
    )


def prepare(sink: FolderSink, epoch: int, *batches: pa.RecordBatch) -> CommitHandle:
    sink.begin_epoch(epoch)
    for b in batches:
        sink.write_batch(b)
    return sink.pre_commit(epoch)


def published(path: Path) -> list[dict[str, object]]:
    return [
        json.loads(line)
        for file in sorted(path.glob(f"epoch=*/part=*/{ROWS}"))
        for line in file.read_text().splitlines()
    ]


def test_built_by_kind_it_offers_the_protocols_it_claims(tmp_path: Path) -> None:
    sink = create("jsonl", {"path": tmp_path, "name": "events"})
    assert isinstance(sink, FolderSink)
    assert isinstance(sink, SinkConnector)
    assert isinstance(sink, DistributedSink)
    assert isinstance(sink, OperableSink)
    capabilities = sink.capabilities()
    assert capabilities.exactly_once
    assert capabilities.resumable_prepare
    assert capabilities.distributed_prepare


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"path": "relative/out"}, "path 'relative/out' is relative"),
        ({"path": " "}, "`path` is empty"),
        ({"path": "/x", "name": "a/b"}, "invalid name"),
        ({"path": "/x", "fsynk": False}, "unknown option 'fsynk'; did you mean 'fsync'"),
    ],
)
def test_bad_options_are_refused_before_anything_exists(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        create("jsonl", options)


def test_prepared_rows_are_invisible_until_committed_once(tmp_path: Path) -> None:
    writer = opened(tmp_path)
    handle = prepare(writer, 0, batch(0, 2), batch(2, 3))
    assert (handle.rows, handle.epoch) == (5, 0)
    assert published(tmp_path) == []
    assert (tmp_path / STAGING / handle.participant / MARKER).exists()

    # Phase 2 on a fresh instance that wrote nothing, given only the handle's JSON.
    committer = opened(tmp_path)
    again = CommitHandle.from_json(json.loads(handle.dumps()))
    assert committer.commit_epoch(0, again) is CommitOutcome.COMMITTED
    assert committer.commit_epoch(0, again) is CommitOutcome.ALREADY_COMMITTED
    assert [row["id"] for row in published(tmp_path)] == [0, 1, 2, 3, 4]
    assert list((tmp_path / STAGING).iterdir()) == []
    assert opened(tmp_path).last_committed_epoch() == 0
    committer.rollback_epoch(0, again)  # never touches what is published
    assert len(published(tmp_path)) == 5


def test_rollback_is_idempotent_and_a_rolled_back_participant_cannot_commit(
    tmp_path: Path,
) -> None:
    writer = opened(tmp_path)
    handle = prepare(writer, 0, batch())
    other = opened(tmp_path)
    other.rollback_epoch(0, handle)
    other.rollback_epoch(0, handle)
    assert list((tmp_path / STAGING).iterdir()) == []
    with pytest.raises(ParticipantLostError, match="neither prepared"):
        other.commit_epoch(0, handle)
    assert opened(tmp_path).last_committed_epoch() is None


def test_values_json_lacks_are_written_as_text(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    when = datetime.datetime(2026, 11, 26, 3, 0, tzinfo=datetime.timezone.utc)
    row = pa.record_batch(
        {
            "at": pa.array([when]),
            "day": pa.array([when.date()]),
            "amount": pa.array([Decimal("12.30")], pa.decimal128(10, 2)),
            "raw": pa.array([b"\x00\xff"]),
            "tags": pa.array([["a", "b"]]),
            "x": pa.array([float("inf")]),
        }
    )
    sink.commit_epoch(0, prepare(sink, 0, row))
    (line,) = published(tmp_path)
    assert line == {
        "at": "2026-11-26T03:00:00+00:00",
        "day": "2026-11-26",
        "amount": "12.30",
        "raw": "AP8=",
        "tags": ["a", "b"],
        "x": float("inf"),
    }


def test_a_value_without_json_form_fails_before_anything_is_written(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.begin_epoch(0)
    odd = pa.record_batch({"span": pa.array([datetime.timedelta(seconds=1)])})
    with pytest.raises(SchemaMismatchError, match="cannot be written as JSON"):
        sink.write_batch(odd)
    sink.rollback_epoch(0, None)
    assert list((tmp_path / STAGING).iterdir()) == []


def test_recovery_returns_prepared_leftovers_and_removes_unprepared_ones(tmp_path: Path) -> None:
    old = opened(tmp_path, generation=1)
    prepared = prepare(old, 0, batch())
    old.begin_epoch(1)
    old.write_batch(batch(3))  # never prepared: a crash here leaves a half-written folder
    foreign = opened(tmp_path, generation=1, job="another-job")
    prepare(foreign, 0, batch())

    newer = opened(tmp_path, generation=2)
    assert newer.recover_prepared() == [prepared]
    names = sorted(p.name for p in (tmp_path / STAGING).iterdir())
    assert prepared.participant in names
    assert len(names) == 2  # the prepared one and the other job's; the half-written is gone
    # The older generation's writer finds its folder gone: it was fenced.
    with pytest.raises(FencedError, match="removed by a newer coordinator"):
        old.write_batch(batch(6))
    with pytest.raises(FencedError, match="removed by a newer coordinator"):
        old.pre_commit(1)
    assert newer.commit_epoch(0, prepared) is CommitOutcome.COMMITTED
    assert newer.prepared_participants(0) == []


def test_a_folder_another_job_or_sink_published_into_is_refused_at_open(tmp_path: Path) -> None:
    sink = opened(tmp_path, job="first")
    sink.commit_epoch(0, prepare(sink, 0, batch()))
    with pytest.raises(ConfigError, match=r"written by job 'first' \(sink 'jsonl'\)"):
        opened(tmp_path, job="second")
    other = FolderSink(Jsonl(str(tmp_path), name="other"))
    with pytest.raises(ConfigError, match=r"not by job 'first' \(sink 'other'\)"):
        other.open(OpenContext("first", "other", 1))


def test_a_handle_of_an_unknown_version_is_refused_not_guessed(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    handle = prepare(sink, 0, batch())
    future = CommitHandle(**{**handle.__dict__, "details": {**handle.details, "v": 2}})
    with pytest.raises(StoredFormatError, match=r"details\) version 2 .* reads version 1"):
        sink.commit_epoch(0, future)
    assert published(tmp_path) == []


def test_operator_views_show_what_is_in_doubt_and_held(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.commit_epoch(0, prepare(sink, 0, batch(0, 4)))
    doubtful = prepare(sink, 1, batch())
    inspector = FolderSink(Jsonl(str(tmp_path)))
    inspector.open(OpenContext("job", "jsonl", 2, inspect=True))
    (prepared,) = inspector.in_doubt()
    assert prepared.handle == doubtful
    held = inspector.holdings(0, 5)
    assert list(held) == [0]
    assert held[0].marker
    assert (held[0].rows, held[0].counted, held[0].problems) == (4, True, ())
    part = next(tmp_path.glob("epoch=0/part=*"))
    (part / ROWS).write_text('{"id": 99}\n', encoding="utf-8")
    assert "holds 1 rows, its marker 4" in inspector.holdings(0, 0)[0].problems[0]


def test_rows_are_ascii_lines_that_any_line_splitter_keeps_whole(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    text = "a\x85b\u2028c\nd é"
    sink.commit_epoch(0, prepare(sink, 0, pa.record_batch({"text": [text, "plain"]})))
    (file,) = tmp_path.glob(f"epoch=0/part=*/{ROWS}")
    content = file.read_text(encoding="ascii")
    assert [json.loads(line)["text"] for line in content.splitlines()] == [text, "plain"]
