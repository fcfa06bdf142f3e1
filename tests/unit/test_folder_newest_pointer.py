"""The folder sink's newest-epoch pointer (sinks/folder/layout.py): an open finds the newest
published epoch without listing the folder's epochs, and finds it right when the pointer is
missing, names epochs whose publish was cut short, or lags a publisher that wrote none; a
coordinator that crashed between a publish's pointer entry and its rename, or between the
rename and the removal of older entries, starts and goes on exactly once."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core import CommitHandle, OpenContext
from durable_sinks.core.durable_fs import rename_noreplace
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import STAGING, Files, FolderSink
from durable_sinks.sinks.folder import committer as folder_committer
from durable_sinks.sinks.folder.layout import NEWEST, Layout


def batch(epoch: int) -> pa.RecordBatch:
    return pa.record_batch({"key": [f"{epoch}"], "v": [epoch]})


def opened(path: Path, generation: int = 1, *, inspect: bool = False) -> FolderSink:
    sink = FolderSink(Files(str(path), name="files"))
    sink.open(OpenContext("job", "files", generation, inspect=inspect))
    return sink


def prepare(sink: FolderSink, epoch: int) -> CommitHandle:
    sink.begin_epoch(epoch)
    sink.write_batch(batch(epoch))
    return sink.pre_commit(epoch)


def publish(path: Path, *epochs: int) -> None:
    sink = opened(path)
    for epoch in epochs:
        sink.commit_epoch(epoch, prepare(sink, epoch))
    sink.close()


def entries(path: Path) -> list[str]:
    return sorted(p.name for p in (path / NEWEST).iterdir())


def unlisted(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, any listing of a folder's epochs fails the test."""

    def refuse(self: Layout) -> Iterator[tuple[int, Path]]:
        raise AssertionError(f"{self.root}'s epochs were listed")

    monkeypatch.setattr(Layout, "epochs", refuse)
    monkeypatch.setattr(Layout, "epochs_newest_first", refuse)


def test_a_publish_keeps_only_the_newest_entry(tmp_path: Path) -> None:
    publish(tmp_path, 0, 1, 2, 5)
    assert entries(tmp_path) == ["5"]


def test_an_open_reads_the_pointer_and_no_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(tmp_path, *range(30))
    unlisted(monkeypatch)
    sink = opened(tmp_path, 2)
    assert sink.last_committed_epoch() == 29


def test_a_missing_pointer_is_found_by_a_listing_and_written_again(tmp_path: Path) -> None:
    publish(tmp_path, 0, 1, 2)
    shutil.rmtree(tmp_path / NEWEST)  # as a folder an older release published into
    assert opened(tmp_path, 2, inspect=True).last_committed_epoch() == 2
    assert not (tmp_path / NEWEST).exists()  # an inspecting open writes nothing
    assert opened(tmp_path, 2).last_committed_epoch() == 2
    assert entries(tmp_path) == ["2"]


def test_entries_of_publishes_cut_short_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(tmp_path, 0, 1, 2)
    unlisted(monkeypatch)
    layout = Layout(tmp_path)
    layout.announce(3, fsync=False)  # the publishes of 3 and 4 died before their renames
    layout.announce(4, fsync=False)
    assert opened(tmp_path, 2).last_committed_epoch() == 2


def test_only_entries_of_publishes_cut_short_fall_back_to_a_listing(tmp_path: Path) -> None:
    publish(tmp_path, 0, 1, 2)
    (tmp_path / NEWEST / "2").unlink()
    Layout(tmp_path).announce(3, fsync=False)
    assert opened(tmp_path, 2).last_committed_epoch() == 2
    assert entries(tmp_path) == ["2", "3"]


def test_a_lost_newest_epoch_is_still_found_lost(tmp_path: Path) -> None:
    publish(tmp_path, 0, 1, 2)
    shutil.rmtree(tmp_path / "epoch=2")  # its entry stays, its folder is gone
    assert opened(tmp_path, 2).last_committed_epoch() == 1
    shutil.rmtree(tmp_path / "epoch=1")
    shutil.rmtree(tmp_path / "epoch=0")
    assert opened(tmp_path, 3).last_committed_epoch() is None


def test_a_reread_lists_past_a_publisher_that_wrote_no_entry(tmp_path: Path) -> None:
    publish(tmp_path, 0, 1)
    sink = opened(tmp_path, 2)
    handle = prepare(sink, 2)
    # An older release publishes epoch 2: the rename alone, no entry.
    (tmp_path / "epoch=2").mkdir()
    rename_noreplace(tmp_path / STAGING / handle.participant, tmp_path / "epoch=2" / "part=0")
    again = opened(tmp_path, 3)
    assert again.last_committed_epoch() == 1  # what the pointer says
    assert again.reread_last_committed_epoch() == 2  # what the lost-epoch check asks


class Crash(BaseException):
    """The driver process dies here."""


def coordinator(tmp_path: Path) -> Coordinator:
    made = Coordinator(
        "job",
        [FolderSink(Files(str(tmp_path / "files"), name="files"))],
        LocalDirectoryStore(tmp_path / "store"),
    )
    made.start()
    return made


def committed(tmp_path: Path) -> list[int]:
    markers = (tmp_path / "files").glob("epoch=*/part=*/_EPOCH.json")
    return sorted(int(m.parent.parent.name.removeprefix("epoch=")) for m in markers)


@pytest.mark.parametrize("where", ["after-entry", "after-rename"])
def test_a_crash_amid_a_publish_restarts_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    first = coordinator(tmp_path)
    for epoch in range(3):
        assert first.run_epoch(epoch, [batch(epoch)]).outcome is EpochOutcome.COMMITTED
    first.close()

    crashing = coordinator(tmp_path)
    with monkeypatch.context() as patched:
        if where == "after-entry":  # the entry is made, the rename never happens

            def die(source: Path, target: Path) -> None:
                raise Crash

            patched.setattr(folder_committer, "rename_noreplace", die)
        else:  # published, the older entries not yet removed

            def dead(self: Layout, epoch: int) -> None:
                raise Crash

            patched.setattr(Layout, "retire_below", dead)
        with pytest.raises(Crash):
            crashing.run_epoch(3, [batch(3)])
    folder = tmp_path / "files"
    assert entries(folder) == ["2", "3"]
    assert (folder / "epoch=3" / "part=0").exists() is (where == "after-rename")

    restarted = coordinator(tmp_path)  # recovery publishes epoch 3 by its decision
    assert restarted.run_epoch(3, [batch(3)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert restarted.run_epoch(4, [batch(4)]).outcome is EpochOutcome.COMMITTED
    restarted.close()
    assert entries(folder) == ["4"]
    assert committed(tmp_path) == [0, 1, 2, 3, 4]
    assert opened(folder, 9).last_committed_epoch() == 4
