"""What a coordinator's start reads of a job's history: the newest decided epoch once (for
recovery of publishing sinks, the lost-epoch check and the first epoch's stream check), and
every check still sees what it must (local folders and stores, no server)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks import CommittedEpochLostError
from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core import SinkConnector
from durable_sinks.core.errors import EpochOrderError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.delta import Delta, DeltaSink
from durable_sinks.sinks.folder import Files, FolderSink


class CountingStore(LocalDirectoryStore):
    """A directory store that counts its reads of the newest decided epoch."""

    latest_reads = 0

    def latest_epoch(self) -> int | None:
        CountingStore.latest_reads += 1
        return super().latest_epoch()


def rows(epoch: int) -> list[pa.RecordBatch]:
    return [pa.record_batch({"key": [f"{epoch}"], "v": [epoch]})]


def coordinator(tmp_path: Path, *, source: str = "stream", first_epoch: int = 0) -> Coordinator:
    """Two publishing sinks (local Delta tables) and a files sink over a counting store."""
    sinks: list[SinkConnector] = [
        DeltaSink(Delta(path=str(tmp_path / "d1"), name="d1", create_table=True)),
        DeltaSink(Delta(path=str(tmp_path / "d2"), name="d2", create_table=True)),
        FolderSink(Files(str(tmp_path / "files"), name="files")),
    ]
    store = CountingStore(tmp_path / "store")
    return Coordinator("job", sinks, store, source=source, first_epoch=first_epoch)


def test_a_start_and_its_first_epoch_read_the_newest_decision_once(tmp_path: Path) -> None:
    first = coordinator(tmp_path)
    first.start()
    assert first.run_epoch(0, rows(0)).outcome is EpochOutcome.COMMITTED
    first.close()

    second = coordinator(tmp_path)
    CountingStore.latest_reads = 0
    second.start()
    assert CountingStore.latest_reads == 1  # recovery of d1 and d2, the lost-epoch check
    assert second.lost_epochs.newest == 0
    assert second.run_epoch(1, rows(1)).outcome is EpochOutcome.COMMITTED
    # The stream check shares the start's read; only the lookup's order check reads again.
    assert CountingStore.latest_reads == 2
    second.close()


def test_the_shared_read_still_refuses_a_new_stream_and_a_lost_epoch(tmp_path: Path) -> None:
    first = coordinator(tmp_path)
    first.start()
    for epoch in range(2):
        first.run_epoch(epoch, rows(epoch))
    first.close()

    other = coordinator(tmp_path, source="another stream")
    other.start()
    with pytest.raises(EpochOrderError, match="first_epoch=2"):
        other.run_epoch(0, rows(0))
    other.close()

    # The files sink loses its newest epoch: the next start stops, before writing anything.
    for part in (tmp_path / "files" / "epoch=1").iterdir():
        (part / "_EPOCH.json").unlink()
    lost = coordinator(tmp_path)
    with pytest.raises(CommittedEpochLostError, match="files"):
        lost.start()
    lost.close()
