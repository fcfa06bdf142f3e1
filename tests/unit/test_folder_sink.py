"""What the two folder kinds, `files` (Parquet) and `jsonl` (JSON Lines), share: one
implementation (sinks/folder) with two encoders, so every behaviour here holds for both. The
formats themselves are tested in test_file_sink.py, test_files_schema_evolution.py and
test_jsonl_sink.py."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.core import CommitHandle, CommitOutcome, OpenContext
from durable_sinks.core.errors import ConfigError, FencedError, TransientError
from durable_sinks.sinks import create
from durable_sinks.sinks.folder import STAGING, FolderSink

KINDS = ["files", "jsonl"]
DATA = {"files": "part-00000.parquet", "jsonl": "rows.jsonl"}


def opened(kind: str, path: Path, generation: int = 1, name: str | None = None) -> FolderSink:
    sink = create(kind, {"path": path, "name": name or kind})
    assert isinstance(sink, FolderSink)
    sink.open(OpenContext("job", sink.name, generation))
    return sink


def batch(n: int = 3) -> pa.RecordBatch:
    return pa.record_batch({"id": list(range(n)), "name": [f"r{i}" for i in range(n)]})


def prepare(sink: FolderSink, epoch: int, rows: int = 3) -> CommitHandle:
    sink.begin_epoch(epoch)
    sink.write_batch(batch(rows))
    return sink.pre_commit(epoch)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_publishes_its_encoders_files_in_one_layout(kind: str, tmp_path: Path) -> None:
    sink = opened(kind, tmp_path)
    handle = prepare(sink, 4)
    (staged,) = (tmp_path / STAGING).iterdir()
    assert sorted(p.name for p in staged.iterdir()) == sorted([DATA[kind], "_EPOCH.json"])
    assert sink.commit_epoch(4, handle) is CommitOutcome.COMMITTED
    part = tmp_path / "epoch=4" / "part=0"
    assert sorted(p.name for p in part.iterdir()) == sorted([DATA[kind], "_EPOCH.json"])
    assert list((tmp_path / STAGING).iterdir()) == []
    assert sink.holdings(0, 9)[4].rows == 3
    assert sink.holdings(0, 9)[4].problems == ()


@pytest.mark.parametrize("kind", KINDS)
def test_a_relative_path_is_refused_when_built(kind: str) -> None:
    with pytest.raises(ConfigError, match="is relative") as raised:
        create(kind, {"path": "data/out"})
    assert "give an absolute path" in (raised.value.fix or "")


@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_another_sink_of_the_job_published_into_is_refused(
    kind: str, tmp_path: Path
) -> None:
    """Published folders are named by epoch and part only: two sinks in one folder would
    take each other's epochs for their own."""
    first = opened(kind, tmp_path, name="first")
    first.commit_epoch(0, prepare(first, 0))
    with pytest.raises(ConfigError, match="sink 'first'") as raised:
        opened(kind, tmp_path, name="second")
    assert "open it as sink 'first' of job 'job'" in (raised.value.fix or "")


@pytest.mark.parametrize("kind", KINDS)
def test_a_writer_whose_staging_folder_vanished_is_fenced_at_its_next_write(
    kind: str, tmp_path: Path
) -> None:
    sink = opened(kind, tmp_path)
    sink.begin_epoch(0)
    sink.write_batch(batch())
    (staging,) = (tmp_path / STAGING).glob("ds:*")
    for file in staging.iterdir():
        file.unlink()
    staging.rmdir()
    with pytest.raises(FencedError, match="removed by a newer coordinator"):
        sink.write_batch(batch())
    assert not staging.exists()  # nothing recreated


@pytest.mark.parametrize("kind", KINDS)
def test_a_publication_whose_answer_was_lost_is_retried_into_already_committed(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_sinks.core import durable_fs

    sink = opened(kind, tmp_path)
    handle = prepare(sink, 0)

    def rename_then_fail(source: Path, target: Path) -> None:
        durable_fs.rename_noreplace(source, target)
        raise OSError(errno.EIO, "Input/output error", str(source))

    monkeypatch.setattr("durable_sinks.sinks.folder.committer.rename_noreplace", rename_then_fail)
    with pytest.raises(TransientError, match="EIO Input/output error"):
        sink.commit_epoch(0, handle)
    assert sink.commit_epoch(0, handle) is CommitOutcome.ALREADY_COMMITTED


@pytest.mark.parametrize("kind", KINDS)
def test_what_an_operator_needs_is_logged_under_the_kinds_logger(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=f"durable_sinks.sinks.{kind}")
    crashed = opened(kind, tmp_path, generation=1)
    prepared = prepare(crashed, 0)
    crashed.begin_epoch(1)  # never prepared: a half-written leftover
    crashed.write_batch(batch())

    restarted = opened(kind, tmp_path, generation=2)
    assert restarted.recover_prepared() == [prepared]
    restarted.rollback_epoch(0, prepared)
    again = prepare(restarted, 0)
    restarted.commit_epoch(0, again)
    restarted.commit_epoch(0, again)

    lines = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert all(name == f"durable_sinks.sinks.{kind}" for name, _, _ in lines), lines
    assert all(level == logging.INFO for _, level, _ in lines), lines
    messages = "\n".join(m for _, _, m in lines)
    assert "left unprepared by an older generation" in messages
    assert f"rolled back prepared participant {prepared.participant}" in messages
    assert f"participant {again.participant} was already published" in messages
    assert len(lines) == 3  # and nothing per row or per batch
