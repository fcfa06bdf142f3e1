"""Phase 2 in the background (`background_commits`): the batch returns at its decision, the
epoch becomes visible when phase 2 ends, the next decision waits for it, a failed phase 2 is
finished by the next epoch, and a job with a sink that cannot commit beside its writes
commits each epoch before it returns."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, RetryPolicy
from durable_sinks.core import CommitHandle, CommitOutcome, SinkCapabilities, SinkConnector
from durable_sinks.core.errors import CommitIncompleteError, TransientError
from durable_sinks.manifest import DecisionRecord, LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from tests.support.faulty import Faulty

FAST = RetryPolicy(attempts=2, first_wait_s=0.001, max_wait_s=0.01)


def batch(epoch: int) -> pa.RecordBatch:
    return pa.record_batch({"key": [f"{epoch}:{i}" for i in range(3)]})


class Gated(Faulty):
    """A real files sink whose commits wait for `gate`."""

    def __init__(self, inner: SinkConnector, **faults: list[BaseException]) -> None:
        super().__init__(inner, **faults)
        self.gate = threading.Event()
        self.gate.set()
        self.committing = threading.Event()

    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        self.committing.set()
        assert self.gate.wait(timeout=30)
        return super().commit_epoch(epoch, handle)


class Unable(Faulty):
    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(exactly_once=True, two_phase_commit=True, resumable_prepare=True)


def files(tmp_path: Path, name: str = "files") -> FolderSink:
    return FolderSink(Files(str(tmp_path / name), name=name))


def started(tmp_path: Path, *sinks: SinkConnector) -> Coordinator:
    coordinator = Coordinator(
        "job",
        list(sinks),
        LocalDirectoryStore(tmp_path / "store"),
        commit_retry=FAST,
        source="q",
        background_commits=True,
    )
    coordinator.start()
    return coordinator


def published(tmp_path: Path, name: str = "files") -> list[int]:
    found = (tmp_path / name).glob("epoch=*/part=*/_EPOCH.json")
    return sorted(int(p.parent.parent.name.removeprefix("epoch=")) for p in found)


def test_the_batch_returns_at_its_decision_and_the_epoch_lands_when_phase_2_ends(
    tmp_path: Path,
) -> None:
    sink = Gated(files(tmp_path))
    coordinator = started(tmp_path, sink)
    sink.gate.clear()
    result = coordinator.run_epoch(0, [batch(0)])
    assert result.outcome is EpochOutcome.COMMITTED
    assert sink.committing.wait(timeout=10)  # phase 2 runs, waiting at the gate
    assert published(tmp_path) == []  # decided, not yet visible
    assert coordinator.decision(0) is not None
    sink.gate.set()
    coordinator.close()  # waits for phase 2
    assert published(tmp_path) == [0]
    assert coordinator.store.is_finished(0)


def test_the_next_decision_waits_for_phase_2_of_the_epoch_before(tmp_path: Path) -> None:
    sink = Gated(files(tmp_path))
    coordinator = started(tmp_path, sink)
    order: list[str] = []
    coordinator.on_step = order.append
    for epoch in range(5):
        coordinator.run_epoch(epoch, [batch(epoch)])
        # every earlier epoch's phase 2 ended before this one's decision; this one's may have
        assert published(tmp_path) in (list(range(epoch)), list(range(epoch + 1)))
    coordinator.close()
    assert published(tmp_path) == list(range(5))
    assert "after-commit:files" not in order  # phase 2's steps ran in the background


def test_a_failed_phase_2_is_finished_by_the_next_epoch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    transient: list[BaseException] = [TransientError("server busy") for _ in range(FAST.attempts)]
    sink = Faulty(files(tmp_path), commit_epoch=transient)
    coordinator = started(tmp_path, sink)
    coordinator.run_epoch(0, [batch(0)])  # returns; its phase 2 fails every retry
    with caplog.at_level(logging.WARNING):
        coordinator.run_epoch(1, [batch(1)])
    assert "phase 2 in the background failed" in caplog.text
    coordinator.close()
    assert published(tmp_path) == [0, 1]


def test_a_phase_2_that_fails_again_fails_the_next_epoch_before_its_decision(
    tmp_path: Path,
) -> None:
    transient: list[BaseException] = [
        TransientError("server busy") for _ in range(2 * FAST.attempts)
    ]
    sink = Faulty(files(tmp_path), commit_epoch=transient)
    coordinator = started(tmp_path, sink)
    coordinator.run_epoch(0, [batch(0)])
    with pytest.raises(CommitIncompleteError, match="server busy") as raised:
        coordinator.run_epoch(1, [batch(1)])
    assert raised.value.epoch == 0
    assert coordinator.decision(1) is None  # epoch 1 was rolled back before its decision
    assert coordinator.run_epoch(1, [batch(1)]).outcome is EpochOutcome.COMMITTED
    coordinator.close()
    assert published(tmp_path) == [0, 1]


def test_a_replay_of_the_epoch_in_the_background_waits_for_it(tmp_path: Path) -> None:
    sink = Gated(files(tmp_path))
    coordinator = started(tmp_path, sink)
    sink.gate.clear()
    coordinator.run_epoch(0, [batch(0)])
    threading.Timer(0.2, sink.gate.set).start()
    again = coordinator.run_epoch(0, [batch(0)])
    assert again.outcome is EpochOutcome.ALREADY_COMMITTED
    assert published(tmp_path) == [0]
    coordinator.close()


def test_a_driver_gone_with_phase_2_pending_is_finished_by_the_next_start(
    tmp_path: Path,
) -> None:
    sink = Gated(files(tmp_path))
    gone = started(tmp_path, sink)
    sink.gate.clear()
    gone.run_epoch(0, [batch(0)])
    assert sink.committing.wait(timeout=10)  # the driver dies here: never closed
    successor = started(tmp_path, files(tmp_path))
    assert published(tmp_path) == [0]  # recovery rolled the decided epoch forward
    assert successor.run_epoch(1, [batch(1)]).outcome is EpochOutcome.COMMITTED
    successor.close()
    sink.gate.set()  # the zombie's phase 2 then finds its participant published
    gone.close()
    assert published(tmp_path) == [0, 1]


def test_a_job_with_a_sink_that_cannot_commit_beside_its_writes_commits_before_returning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        coordinator = started(tmp_path, files(tmp_path), Unable(files(tmp_path, "other")))
    assert "background_commits is off for this job: sink(s) other" in caplog.text
    coordinator.run_epoch(0, [batch(0)])
    assert published(tmp_path) == [0]
    assert published(tmp_path, "other") == [0]
    coordinator.close()


class Reads(LocalDirectoryStore):
    """A directory store that records the epochs its `get` read, in order."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.read: list[int] = []

    def get(self, epoch: int) -> DecisionRecord | None:
        self.read.append(epoch)
        return super().get(epoch)


def test_the_next_epoch_is_looked_up_before_phase_2_and_its_batch_reads_no_decision(
    tmp_path: Path,
) -> None:
    sink = Gated(files(tmp_path))
    store = Reads(tmp_path / "store")
    coordinator = Coordinator("job", [sink], store, source="q", background_commits=True)
    coordinator.start()
    sink.gate.clear()
    coordinator.run_epoch(0, [batch(0)])
    assert sink.committing.wait(timeout=10)
    assert store.read[-1] == 1  # read at epoch 0's end, before its phase 2 began
    store.read.clear()
    threading.Timer(0.2, sink.gate.set).start()
    coordinator.run_epoch(1, [batch(1)])
    # epoch 1's lookup read nothing: its one read is its decision's put (first wins), then
    # epoch 2 is looked up ahead
    assert store.read == [1, 2]
    coordinator.run_epoch(1, [batch(1)])  # a replay reads its decision again
    assert store.read[-1] == 1
    coordinator.close()
    assert published(tmp_path) == [0, 1]


def test_an_epoch_found_undecided_ahead_and_decided_by_a_successor_lands_once(
    tmp_path: Path,
) -> None:
    zombie = started(tmp_path, files(tmp_path))
    zombie.run_epoch(0, [batch(0)])  # epoch 1 is looked up ahead: undecided
    successor = started(tmp_path, files(tmp_path))
    successor.run_epoch(1, [batch(1)])
    successor.close()
    # Its lookup of epoch 1 is not read again; its put finds the successor's decision and
    # the epoch yields to it, as it would to a decision its lookup found.
    late = zombie.run_epoch(1, [pa.record_batch({"key": ["zombie"]})])
    assert late.outcome is EpochOutcome.ALREADY_COMMITTED
    assert late.decision is not None
    assert late.decision.generation == 2
    zombie.close()
    assert published(tmp_path) == [0, 1]
    landed = pq.read_table(tmp_path / "files" / "epoch=1").column("key").to_pylist()
    assert sorted(landed) == ["1:0", "1:1", "1:2"]
