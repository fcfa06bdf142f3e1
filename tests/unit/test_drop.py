"""`drop`'s logic without servers: the folder sink's bookkeeping (staging leftovers, probe
files, epoch markers) found and removed only where it is the job's own, never a data file,
never through a symbolic link; the directory store's job folder; the plan's split into what
is removed and what stays."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from durable_sinks.cli._operator import Dropping, DropPlan
from durable_sinks.core import OpenContext
from durable_sinks.core.naming import ParticipantName, component
from durable_sinks.core.operations import Bookkeeping, DroppableSink
from durable_sinks.manifest import DecisionRecord, DroppableStore, LocalDirectoryStore
from durable_sinks.spark import sink


def _committed_folder(tmp_path: Path, job: str) -> Path:
    folder = tmp_path / "out"
    files = sink("files", path=str(folder)).build()
    files.open(OpenContext(job, "files", 1))
    files.begin_epoch(0)
    files.write_batch(pa.record_batch({"id": pa.array([1, 2, 3], pa.int64())}))
    handle = files.pre_commit(0)
    files.commit_epoch(0, handle)
    files.close()
    return folder


def _inspecting(folder: Path, job: str) -> DroppableSink:
    files = sink("files", path=str(folder)).build()
    files.open(OpenContext(job, "files", 1, inspect=True))
    assert isinstance(files, DroppableSink)
    return files


def test_the_folder_sink_removes_its_leftovers_and_markers_only(tmp_path: Path) -> None:
    folder = _committed_folder(tmp_path, "orders")
    staging = folder / "_staging"
    unprepared = staging / str(ParticipantName.build("orders", "files", 1, "0", 2, 0))
    unprepared.mkdir()
    (unprepared / "part-00000.parquet").write_bytes(b"half")
    (staging / ".probe:orders:files:2").write_bytes(b"")
    foreign = staging / str(ParticipantName.build("other", "files", 1, "0", 1, 0))
    foreign.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "_EPOCH.json").write_bytes(b"{}")
    (folder / "epoch=9").symlink_to(outside, target_is_directory=True)
    data = sorted(folder.glob("epoch=*/part=*/*.parquet"))

    files = _inspecting(folder, "orders")
    listed = files.drop_job(apply=False)
    assert [(b.what, b.count, b.removable) for b in listed] == [
        ("staging leftovers", 2, True),
        ("epoch markers _EPOCH.json", 1, False),
        ("newest-epoch pointer _newest/", 1, False),
    ]
    assert unprepared.exists()

    files.drop_job(apply=True)
    assert not unprepared.exists()
    assert not (staging / ".probe:orders:files:2").exists()
    assert foreign.exists()  # another job's: not ours to remove
    assert list(folder.glob("epoch=0/part=*/_EPOCH.json"))  # kept without epoch_markers

    files.drop_job(apply=True, epoch_markers=True)
    assert not list(folder.glob("epoch=0/part=*/_EPOCH.json"))
    assert not (folder / "_newest").exists()
    assert (outside / "_EPOCH.json").exists()  # behind a symbolic link: never followed
    assert sorted(folder.glob("epoch=0/part=*/*.parquet")) == [
        p for p in data if "epoch=0" in str(p)
    ]
    assert files.drop_job(apply=False) == []


def test_the_directory_store_removes_the_jobs_folder_only(tmp_path: Path) -> None:
    store = LocalDirectoryStore(tmp_path / "decisions")
    assert isinstance(store, DroppableStore)
    for job in ("orders", "payments"):
        opened = LocalDirectoryStore(tmp_path / "decisions")
        generation = opened.open(job)
        opened.put(DecisionRecord(job, 0, generation, ()))
        opened.close()
    (found,) = store.drop_job("orders", apply=False)
    assert "1 decisions" in found.what
    assert (tmp_path / "decisions" / component("orders")).is_dir()
    store.drop_job("orders", apply=True)
    assert not (tmp_path / "decisions" / "orders").exists()
    assert (tmp_path / "decisions" / "payments" / "decisions").is_dir()
    assert store.drop_job("orders", apply=True) == []


def test_the_plan_tells_what_is_removed_from_what_stays() -> None:
    removed = Dropping("pg", Bookkeeping("marker rows", "s.durable_sinks_epochs", 3))
    kept = Dropping("kafka", Bookkeeping("transactional.id", "ds:j:k", 1, kept="cannot"))
    plan = DropPlan([removed, kept])
    assert plan.removable == [removed]
    assert plan.kept == [kept]
