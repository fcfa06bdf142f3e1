"""The file sink on its own: bad input fails before anything is prepared and leaves nothing;
commit and rollback are idempotent and work from a fresh instance given only the handle."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_sinks.core import CommitHandle, CommitOutcome, OpenContext, SinkConnector
from durable_sinks.core.errors import (
    ConfigError,
    FencedError,
    ParticipantLostError,
    SchemaMismatchError,
    TransientError,
)
from durable_sinks.sinks import create, kinds
from durable_sinks.sinks.folder import STAGING, Files, FolderSink


def opened(path: Path, generation: int = 1, job: str = "job") -> FolderSink:
    sink = FolderSink(Files(str(path)))
    sink.open(OpenContext(job, "files", generation))
    return sink


def batch(n: int = 3) -> pa.RecordBatch:
    return pa.record_batch({"id": list(range(n)), "name": [f"r{i}" for i in range(n)]})


def prepare(sink: FolderSink, epoch: int, *batches: pa.RecordBatch) -> CommitHandle:
    sink.begin_epoch(epoch)
    for b in batches:
        sink.write_batch(b)
    return sink.pre_commit(epoch)


def test_protocol_and_registry(tmp_path: Path) -> None:
    assert "files" in kinds()
    sink = create("files", {"path": str(tmp_path), "name": "events"})
    assert isinstance(sink, SinkConnector)
    assert sink.name == "events"
    with pytest.raises(ConfigError, match="no sink kind 'nope'"):
        create("nope", {})
    with pytest.raises(ConfigError, match="unknown option 'colour'"):
        create("files", {"path": str(tmp_path), "colour": "red"})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"path": " "}, "`path` is empty"),
        ({"path": "x", "compression": "zip"}, "compression"),
        ({"path": "x", "name": "a/b"}, "invalid name"),
    ],
)
def test_bad_config_is_refused_when_built(config: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Files(**config)  # type: ignore[arg-type]


def test_wrong_schema_fails_before_prepare_and_leaves_nothing(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.begin_epoch(0)
    sink.write_batch(batch())
    wrong = pa.record_batch({"id": ["not", "an", "int"], "extra": [1, 2, 3]})
    with pytest.raises(SchemaMismatchError) as raised:
        sink.write_batch(wrong)
    message = str(raised.value)
    assert "'id' has type string" in message
    assert "'name' is missing" in message
    assert "'extra' is not in the sink's schema" in message
    sink.rollback_epoch(0, None)
    assert list((tmp_path / STAGING).iterdir()) == []
    assert list(tmp_path.glob("epoch=*")) == []


def test_commit_is_atomic_idempotent_and_works_from_another_instance(tmp_path: Path) -> None:
    writer = opened(tmp_path)
    handle = prepare(writer, 0, batch(2), batch(3))
    assert handle.rows == 5
    assert list(tmp_path.glob("epoch=*")) == []  # prepared: invisible to readers

    # Another process, given only the JSON of the handle, commits it.
    other = opened(tmp_path, generation=2)
    revived = CommitHandle.from_json(json.loads(handle.dumps()))
    assert other.commit_epoch(0, revived) is CommitOutcome.COMMITTED
    assert other.commit_epoch(0, revived) is CommitOutcome.ALREADY_COMMITTED
    assert writer.commit_epoch(0, handle) is CommitOutcome.ALREADY_COMMITTED
    table = pq.read_table(tmp_path / "epoch=0" / "part=0")
    assert table.num_rows == 5
    assert other.last_committed_epoch() == 0
    assert opened(tmp_path, generation=3).last_committed_epoch() == 0


def test_rollback_is_idempotent_and_never_publishes(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    handle = prepare(sink, 4, batch())
    sink.rollback_epoch(4, handle)
    sink.rollback_epoch(4, handle)
    assert list((tmp_path / STAGING).iterdir()) == []
    assert list(tmp_path.glob("epoch=*")) == []
    with pytest.raises(ParticipantLostError, match="neither prepared"):
        sink.commit_epoch(4, handle)


def test_recover_prepared_finds_older_generations_only_and_drops_half_written(
    tmp_path: Path,
) -> None:
    old = opened(tmp_path, generation=1)
    prepared = prepare(old, 7, batch())
    old.begin_epoch(8)
    old.write_batch(batch())  # half-written, never prepared
    new = opened(tmp_path, generation=2)
    mine = prepare(new, 9, batch())
    assert new.recover_prepared() == [prepared]
    leftovers = sorted(p.name for p in (tmp_path / STAGING).iterdir())
    assert leftovers == sorted([prepared.participant, mine.participant])


def test_empty_epoch_is_published_with_its_marker(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    handle = prepare(sink, 0)
    assert handle.rows == 0
    sink.commit_epoch(0, handle)
    assert sink.last_committed_epoch() == 0
    assert not list(tmp_path.glob("epoch=0/part=0/*.parquet"))


def test_another_jobs_folder_is_refused(tmp_path: Path) -> None:
    sink = opened(tmp_path, job="first")
    sink.commit_epoch(0, prepare(sink, 0, batch()))
    with pytest.raises(ConfigError, match="written by job 'first'"):
        opened(tmp_path, job="second")


def test_open_reads_the_newest_epochs_markers_only(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    for epoch in range(4):
        sink.commit_epoch(epoch, prepare(sink, epoch, batch()))
    # An older epoch's marker is never read at open (it would fail to parse), and an epoch
    # folder whose publish was cut short (no marker) is passed over.
    (tmp_path / "epoch=0" / "part=0" / "_EPOCH.json").write_text("not a handle")
    (tmp_path / "epoch=3" / "part=0" / "_EPOCH.json").unlink()
    (tmp_path / "epoch=7").mkdir()
    assert opened(tmp_path, generation=2).last_committed_epoch() == 2


def test_unwritable_folder_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot create"):
        opened(blocker / "data")


def test_a_start_killed_while_probing_leaves_names_the_next_generation_removes(
    tmp_path: Path,
) -> None:
    staging = tmp_path / STAGING
    opened(tmp_path, generation=1).health_check()
    assert list(staging.iterdir()) == []  # the probe removes its own files
    # What starts killed mid-probe leave: a probe or its link, of generations 2 and 4 of this
    # job's sink, and another job's.
    left = [".probe:job:files:2", ".probe:job:files:4.link", ".probe:other:files:2"]
    for name in left:
        (staging / name).write_bytes(b"probe")
    opened(tmp_path, generation=3).health_check()  # older ones only: 4 may be starting
    assert sorted(p.name for p in staging.iterdir()) == left[1:]
    opened(tmp_path, generation=5).health_check()
    assert [p.name for p in staging.iterdir()] == [".probe:other:files:2"]


def test_a_folder_the_job_cannot_write_in_fails_the_health_check(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    (tmp_path / STAGING).chmod(0o500)
    try:
        if os.access(tmp_path / STAGING, os.W_OK):  # root ignores permissions: make it a file
            (tmp_path / STAGING).chmod(0o700)
            (tmp_path / STAGING).rmdir()
            (tmp_path / STAGING).write_text("x")
        with pytest.raises(ConfigError, match="cannot write in"):
            sink.health_check()
    finally:
        if (tmp_path / STAGING).is_dir():
            (tmp_path / STAGING).chmod(0o700)


@pytest.mark.parametrize("folder_left", [True, False])
def test_an_attempt_whose_files_a_newer_recovery_removed_is_fenced(
    tmp_path: Path, folder_left: bool
) -> None:
    """A newer coordinator's recovery removes an older attempt's staging folder, its files
    first: the older attempt, still preparing, meets a missing file while the folder may
    still be there. Either way FencedError, never a raw FileNotFoundError."""
    sink = opened(tmp_path)
    sink.begin_epoch(0)
    sink.write_batch(batch())
    (staging,) = (tmp_path / STAGING).glob("ds:*")
    for file in staging.iterdir():
        file.unlink()
    if not folder_left:
        staging.rmdir()
    with pytest.raises(FencedError, match="removed by a newer coordinator"):
        sink.pre_commit(0)


def test_a_publication_whose_answer_was_lost_is_retried_into_already_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename that publishes a participant takes effect, then the disk reports EIO:
    TransientError (before: the raw OSError left the sink), and the retry finds the
    participant published."""
    from durable_sinks.core import durable_fs

    sink = opened(tmp_path)
    sink.begin_epoch(0)
    sink.write_batch(batch())
    handle = sink.pre_commit(0)

    def rename_then_fail(source: Path, target: Path) -> None:
        durable_fs.rename_noreplace(source, target)
        raise OSError(errno.EIO, "Input/output error", str(source))

    monkeypatch.setattr("durable_sinks.sinks.folder.committer.rename_noreplace", rename_then_fail)
    with pytest.raises(TransientError, match="EIO Input/output error") as hit:
        sink.commit_epoch(0, handle)
    assert hit.value.epoch == 0
    assert sink.commit_epoch(0, handle) is CommitOutcome.ALREADY_COMMITTED
    assert sink.last_committed_epoch() == 0
