"""The running coordinator's expiry of its sinks' per-epoch bookkeeping (coordinator/_expiry.py):
which sinks it asks, from which epoch on, how often, and that a failure is logged, never
raised for a committed batch. The sinks are folder sinks that also answer `expire_markers`
(recording what they were asked); the real sinks' expiry is tested on the servers
(tests/integration/test_running_expiry.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, RetryPolicy, prepare_part
from durable_sinks.coordinator._expiry import expiry_interval
from durable_sinks.core import CommitHandle, DeliveryGuarantee, SinkConnector
from durable_sinks.core.errors import DurableSinkError, FencedError, TransientError
from durable_sinks.core.operations import ExpiringSink
from durable_sinks.manifest import DecisionStore, LocalDirectoryStore, MemoryDecisionStore
from durable_sinks.sinks.folder import Files, FolderSink

FAST = RetryPolicy(attempts=3, first_wait_s=0.001, max_wait_s=0.01)


class ExpiringFiles(FolderSink):
    """A files sink that records each `expire_markers` call and raises the queued failures."""

    def __init__(self, path: Path, name: str, failures: list[DurableSinkError] | None = None):
        super().__init__(Files(str(path / name), name=name))
        self.asked: list[int] = []
        self.failures = list(failures or [])

    def expire_markers(self, before_epoch: int) -> int:
        self.asked.append(before_epoch)
        if self.failures:
            raise self.failures.pop(0)
        return 0


def batch(epoch: int) -> pa.RecordBatch:
    return pa.record_batch({"key": [f"{epoch}:{i}" for i in range(2)], "v": [1, 2]})


def coordinator(
    sinks: list[SinkConnector],
    store: DecisionStore,
    retain: int,
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
) -> Coordinator:
    made = Coordinator(
        "job",
        sinks,
        store,
        guarantee=guarantee,
        commit_retry=FAST,
        retain_epochs=retain,
        source="query-1",
    )
    made.start()
    return made


def test_the_interval_is_a_tenth_of_the_window_and_at_least_one_epoch() -> None:
    assert [expiry_interval(r) for r in (1, 3, 9, 10, 100, 10_000)] == [1, 1, 1, 1, 10, 1_000]


def test_expiring_sinks_are_asked_beyond_the_window_every_tenth_of_it(tmp_path: Path) -> None:
    expiring = ExpiringFiles(tmp_path, "a")
    plain = FolderSink(Files(str(tmp_path / "b"), name="b"))
    assert isinstance(expiring, ExpiringSink)
    assert not isinstance(plain, ExpiringSink)
    job = coordinator([expiring, plain], LocalDirectoryStore(tmp_path / "store"), retain=20)
    for epoch in range(100, 107):  # a stream's epochs need not start at 0
        assert job.run_epoch(epoch, [batch(epoch)]).outcome is EpochOutcome.COMMITTED
    # Asked at the run's first epoch and every 2 epochs after, below epoch - 20 + 1.
    assert expiring.asked == [81, 83, 85, 87]
    job.close()


def test_a_restarted_coordinator_asks_at_its_first_epoch(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = ExpiringFiles(tmp_path, "a")
    job = coordinator([first], LocalDirectoryStore(store), retain=5)
    for epoch in range(8):
        job.run_epoch(epoch, [batch(epoch)])
    job.close()
    assert first.asked == [1, 2, 3]  # retain 5: every epoch from epoch 5 on
    again = ExpiringFiles(tmp_path, "a")
    job = coordinator([again], LocalDirectoryStore(store), retain=50)
    job.run_epoch(8, [batch(8)])
    job.run_epoch(9, [batch(9)])
    assert again.asked == []  # nothing below 9 - 50 + 1
    job.close()


def test_a_failed_expiry_is_logged_not_raised_and_tried_again_next_epoch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    failing = ExpiringFiles(tmp_path, "a", [TransientError("connection reset")])
    other = ExpiringFiles(tmp_path, "b")
    job = coordinator([failing, other], LocalDirectoryStore(tmp_path / "store"), retain=10)
    for epoch in range(10):
        job.run_epoch(epoch, [batch(epoch)])
    caplog.set_level(logging.WARNING, logger="durable_sinks")
    result = job.run_epoch(10, [batch(10)])  # due (interval 1): a, failing, then b
    assert result.outcome is EpochOutcome.COMMITTED
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "expiring sink a's records of epochs below 1 failed" in m and "connection reset" in m
        for m in warned
    ), warned
    assert other.asked == [1]  # one sink's failure does not spare the others
    job.run_epoch(11, [batch(11)])
    assert failing.asked == [1, 2]
    assert other.asked == [1, 2]
    job.close()


def test_a_fenced_coordinator_expires_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    zombie_sink = ExpiringFiles(tmp_path, "a")
    zombie = coordinator([zombie_sink], LocalDirectoryStore(store), retain=1)
    zombie.run_epoch(0, [batch(0)])
    newer = coordinator([ExpiringFiles(tmp_path, "a")], LocalDirectoryStore(store), retain=1)
    asked = list(zombie_sink.asked)
    with pytest.raises(FencedError):
        zombie.run_epoch(1, [batch(1)])
    assert zombie_sink.asked == asked
    zombie.close()
    newer.close()


def test_at_least_once_jobs_expire_too(tmp_path: Path) -> None:
    expiring = ExpiringFiles(tmp_path, "a")
    job = coordinator(
        [expiring], MemoryDecisionStore(), retain=2, guarantee=DeliveryGuarantee.AT_LEAST_ONCE
    )
    for epoch in range(4):
        job.run_epoch(epoch, [batch(epoch)])
    assert expiring.asked == [1, 2]
    job.close()


def test_executor_mode_epochs_expire_too(tmp_path: Path) -> None:
    expiring = ExpiringFiles(tmp_path, "a")
    job = Coordinator(
        "job",
        [expiring],
        LocalDirectoryStore(tmp_path / "store"),
        executor_mode=True,
        retain_epochs=2,
        source="query-1",
    )
    job.start()
    generation = job.generation
    assert generation is not None

    def prepare(epoch: int) -> Callable[[int], list[CommitHandle]]:
        def worker(generation: int) -> list[CommitHandle]:
            return prepare_part(
                "job",
                generation,
                epoch,
                "p0-t1",
                lambda: [FolderSink(Files(str(tmp_path / "a"), name="a"))],
                [batch(epoch)],
            )

        return worker

    for epoch in range(4):
        assert job.run_distributed_epoch(epoch, prepare(epoch)).outcome is EpochOutcome.COMMITTED
    assert expiring.asked == [1, 2]
    job.close()
