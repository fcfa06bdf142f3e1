"""What a Delta sink's start reads of the table (sinks/delta/snapshot.py): the log's tail and
the checkpoint's few action columns give the same committed epoch, shape, protocol and
properties as loading the table, before and after a checkpoint, after a schema change, and
caught up with later commits; a log the tail cannot read is loaded instead; and a start of
the sink does not load the table."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from durable_sinks.core import OpenContext
from durable_sinks.core.joblog import JobLogger
from durable_sinks.sinks.delta import Delta, DeltaSink
from durable_sinks.sinks.delta.layout import app_id
from durable_sinks.sinks.delta.snapshot import CHECKPOINT_HINT, LogSnapshot, read_snapshot
from durable_sinks.sinks.delta.storage import TableStorage
from durable_sinks.sinks.delta.table import DeltaLog

APP = app_id("job", "delta")


def commit(path: Path, epoch: int, *, wide: bool = False, app: str = APP) -> None:
    columns: dict[str, list[object]] = {"id": [epoch], "part": ["a"]}
    if wide:
        columns["extra"] = [f"{epoch}"]
    write_deltalake(
        str(path),
        pa.table(columns),
        mode="append",
        partition_by=["part"],
        schema_mode="merge" if wide else None,
        configuration={"delta.appendOnly": "false"} if epoch == 0 else None,
        commit_properties=CommitProperties(app_transactions=[Transaction(app, epoch)]),
    )


def storage(path: Path) -> TableStorage:
    return TableStorage(Delta(path=str(path), name="delta", create_table=True))


def loaded(path: Path) -> LogSnapshot:
    return LogSnapshot.of(DeltaTable(str(path)), APP)


def test_the_tail_alone_answers_as_the_loaded_table(tmp_path: Path) -> None:
    for epoch in range(5):
        commit(tmp_path, epoch)
    found = read_snapshot(storage(tmp_path), APP)
    assert found == loaded(tmp_path)
    assert found is not None
    assert (found.version, found.committed_epoch) == (4, 4)
    assert found.shape.partition_by == ("part",)
    assert found.configuration == {"delta.appendOnly": "false"}


@pytest.mark.parametrize("wide_after", [False, True])
def test_a_checkpoint_and_the_commits_after_it(tmp_path: Path, wide_after: bool) -> None:
    for epoch in range(4):
        commit(tmp_path, epoch)
    commit(tmp_path, 4, app="another writer")  # the job's txn is in the checkpoint only
    DeltaTable(str(tmp_path)).create_checkpoint()
    assert read_snapshot(storage(tmp_path), APP) == loaded(tmp_path)
    commit(tmp_path, 5, app="another writer", wide=wide_after)  # metaData after it, or not
    found = read_snapshot(storage(tmp_path), APP)
    assert found == loaded(tmp_path)
    assert found is not None
    assert found.committed_epoch == 3
    assert ("extra" in found.shape.schema.names) is wide_after


def test_a_later_read_catches_up_from_the_earlier_one(tmp_path: Path) -> None:
    for epoch in range(3):
        commit(tmp_path, epoch)
    DeltaTable(str(tmp_path)).create_checkpoint()
    first = read_snapshot(storage(tmp_path), APP)
    assert read_snapshot(storage(tmp_path), APP, first) is first  # nothing new: no read
    commit(tmp_path, 3, wide=True)
    commit(tmp_path, 4, wide=True, app="another writer")
    again = read_snapshot(storage(tmp_path), APP, first)
    assert again == loaded(tmp_path)
    assert again is not None
    assert again.committed_epoch == 3


def test_a_log_the_tail_cannot_read_is_loaded(tmp_path: Path) -> None:
    for epoch in range(3):
        commit(tmp_path, epoch)
    DeltaTable(str(tmp_path)).create_checkpoint()
    hint = tmp_path / CHECKPOINT_HINT
    found = json.loads(hint.read_text())
    hint.write_text(json.dumps({**found, "parts": 2}))  # a multi-part checkpoint
    assert read_snapshot(storage(tmp_path), APP) is None
    log = DeltaLog(storage(tmp_path), APP, 3, JobLogger("job", "delta"))
    assert log.snapshot() == loaded(tmp_path)


def test_no_table_is_no_snapshot(tmp_path: Path) -> None:
    assert read_snapshot(storage(tmp_path), APP) is None
    assert DeltaLog(storage(tmp_path), APP, 3, JobLogger("job", "delta")).snapshot() is None


def test_a_start_does_not_load_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for epoch in range(3):
        commit(tmp_path, epoch)
    DeltaTable(str(tmp_path)).create_checkpoint()
    commit(tmp_path, 3)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the table was loaded")

    monkeypatch.setattr(DeltaTable, "__init__", refuse)
    sink = DeltaSink(Delta(path=str(tmp_path), name="delta"))
    sink.open(OpenContext("job", "delta", 1))
    sink.health_check()
    assert sink.recover_prepared() == []
    assert sink.last_committed_epoch() == 3
    schema = sink.schema()
    assert schema is not None
    assert schema.names == ["id", "part"]
    sink.close()


def test_a_reread_loads_the_table_past_a_lagging_hint(tmp_path: Path) -> None:
    """A checkpoint hint left behind a newer checkpoint whose earlier commits were cleaned
    up: the tail reads the old checkpoint as the newest version; the reread the lost-epoch
    check asks for loads the table and finds the epoch."""
    for epoch in range(3):
        commit(tmp_path, epoch)
    DeltaTable(str(tmp_path)).create_checkpoint()
    lagging = (tmp_path / CHECKPOINT_HINT).read_bytes()
    for epoch in range(3, 6):
        commit(tmp_path, epoch)
    DeltaTable(str(tmp_path)).create_checkpoint()
    (tmp_path / CHECKPOINT_HINT).write_bytes(lagging)
    for version in range(3, 6):
        (tmp_path / "_delta_log" / f"{version:020d}.json").unlink()
    sink = DeltaSink(Delta(path=str(tmp_path), name="delta"))
    sink.open(OpenContext("job", "delta", 1))
    assert sink.last_committed_epoch() == 2  # what the tail says
    assert sink.reread_last_committed_epoch() == 5
    sink.close()
