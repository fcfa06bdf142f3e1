"""The write pass's fan-out (coordinator/_fanout.py): sinks write at the same time, each from
one thread in the batches' order, while the next batch is read; a failure stops the pass only
once every write in progress has finished, and nothing is rolled back while a sink writes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.coordinator._fanout import IN_FLIGHT
from durable_sinks.core import SinkConnector, WriteResult
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from tests.support.faulty import Faulty
from tests.unit.test_coordinator import FAST, batch, published, staged

SLOW_S = 0.2


class Slow(Faulty):
    """Each write_batch sleeps SLOW_S (releasing the GIL, as a sink waiting on its server
    does) and records its thread, its batch's first key and when it ran; rollback_epoch
    records when it ran."""

    def __init__(
        self, inner: SinkConnector, *, delay: float = SLOW_S, **faults: list[BaseException]
    ):
        super().__init__(inner, **faults)
        self.delay = delay
        self.writes: list[tuple[str, str, float, float]] = []
        self.rollbacks: list[float] = []
        self.active = 0
        self.overlapped = False

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        self.active += 1
        self.overlapped |= self.active > 1
        started = time.monotonic()
        try:
            time.sleep(self.delay)
            result = super().write_batch(batch)
        finally:
            self.active -= 1
        key = str(batch.column("key")[0])
        self.writes.append((threading.current_thread().name, key, started, time.monotonic()))
        return result

    def rollback_epoch(self, epoch: int, handle: object) -> None:
        self.rollbacks.append(time.monotonic())
        super().rollback_epoch(epoch, handle)  # type: ignore[arg-type]


def files(tmp_path: Path, name: str) -> FolderSink:
    return FolderSink(Files(str(tmp_path / name), name=name))


def coordinator(tmp_path: Path, *sinks: SinkConnector, concurrent: bool = True) -> Coordinator:
    made = Coordinator(
        "job",
        list(sinks),
        LocalDirectoryStore(tmp_path / "store"),
        commit_retry=FAST,
        concurrent_writes=concurrent,
    )
    made.start()
    return made


def batches(epoch: int, count: int) -> list[pa.RecordBatch]:
    return [
        pa.record_batch({"key": [f"{epoch}:{b}:{i}" for i in range(3)], "v": [1, 2, 3]})
        for b in range(count)
    ]


def test_sinks_write_at_the_same_time_each_in_order_from_one_thread(tmp_path: Path) -> None:
    a, b = Slow(files(tmp_path, "a")), Slow(files(tmp_path, "b"))
    steps: list[str] = []
    made = coordinator(tmp_path, a, b)
    made.on_step = steps.append
    started = time.monotonic()
    result = made.run_epoch(0, batches(0, 4))
    elapsed = time.monotonic() - started
    assert result.outcome is EpochOutcome.COMMITTED
    assert result.metrics.rows == {"a": 12, "b": 12}
    # 2 sinks x 4 batches x SLOW_S one after the other would take 1.6 s
    assert elapsed < 4 * SLOW_S * 1.5, elapsed
    for sink in (a, b):
        assert [w[1] for w in sink.writes] == [f"0:{n}:0" for n in range(4)]
        assert len({w[0] for w in sink.writes}) == 1  # one thread per sink
        assert not sink.overlapped  # never two writes of one sink at once
        assert result.metrics.sink_seconds[sink.name] >= 4 * SLOW_S
    assert a.writes[0][0] != b.writes[0][0]
    assert a.writes[0][2] < b.writes[0][3]
    assert b.writes[0][2] < a.writes[0][3]
    writes = [s for s in steps if s.startswith("after-write:")]
    assert writes == [f"after-write:{n}:{s}" for n in range(4) for s in ("a", "b")]
    assert published(tmp_path, "a") == published(tmp_path, "b") == 1


def test_without_concurrent_writes_the_reading_thread_writes_in_turn(tmp_path: Path) -> None:
    a, b = Slow(files(tmp_path, "a"), delay=0.01), Slow(files(tmp_path, "b"), delay=0.01)
    made = coordinator(tmp_path, a, b, concurrent=False)
    assert made.run_epoch(0, batches(0, 3)).outcome is EpochOutcome.COMMITTED
    here = threading.current_thread().name
    assert {w[0] for w in a.writes + b.writes} == {here}
    assert all(x[3] <= y[2] for x, y in zip(a.writes, b.writes, strict=True))


def test_reading_is_bounded_by_the_writes_in_flight(tmp_path: Path) -> None:
    a = Slow(files(tmp_path, "a"), delay=0.05)
    read: list[int] = []

    def source() -> Iterator[pa.RecordBatch]:
        for n, item in enumerate(batches(0, 8)):
            # the batch n may be read only when batch n - IN_FLIGHT - 1 is written
            assert len(a.writes) >= n - IN_FLIGHT - 1, (n, len(a.writes))
            read.append(n)
            yield item

    made = coordinator(tmp_path, a)
    assert made.run_epoch(0, source()).metrics.rows == {"a": 24}
    assert read == list(range(8))


def test_a_failed_write_stops_the_pass_and_waits_for_the_other_sinks_write(
    tmp_path: Path,
) -> None:
    bad = Slow(files(tmp_path, "bad"), delay=0.01, write_batch=[OSError("disk full")])
    slow = Slow(files(tmp_path, "slow"), delay=0.3)
    read: list[int] = []

    def source() -> Iterator[pa.RecordBatch]:
        for n, item in enumerate(batches(0, 50)):
            read.append(n)
            yield item

    made = coordinator(tmp_path, bad, slow)
    with pytest.raises(OSError, match="disk full"):
        made.run_epoch(0, source())
    # the pass stopped reading: not all 50 batches were handed over
    assert len(read) <= 2 * (IN_FLIGHT + 1) + 1
    # the slow sink's write in progress finished before it was rolled back
    assert slow.rollbacks
    assert slow.writes
    assert slow.writes[0][3] <= slow.rollbacks[0]
    assert (staged(tmp_path, "bad"), staged(tmp_path, "slow")) == (0, 0)
    assert made.store.get(0) is None
    # and Spark's replay of the batch writes it afresh
    assert made.run_epoch(0, batches(0, 2)).outcome is EpochOutcome.COMMITTED


def test_an_error_reading_the_batches_waits_for_the_writes_then_rolls_back(
    tmp_path: Path,
) -> None:
    a = Slow(files(tmp_path, "a"), delay=0.2)

    def source() -> Iterator[pa.RecordBatch]:
        yield batch(0)
        raise RuntimeError("Spark's job failed")

    made = coordinator(tmp_path, a)
    with pytest.raises(RuntimeError, match="Spark's job failed"):
        made.run_epoch(0, source())
    assert a.writes
    assert a.rollbacks
    assert a.writes[0][3] <= a.rollbacks[0]
    assert staged(tmp_path, "a") == 0


def test_an_abandoned_write_pass_stops_its_threads(tmp_path: Path) -> None:
    a = Slow(files(tmp_path, "a"), delay=0.05)
    made = coordinator(tmp_path, a)
    steps = made.epoch_steps(0, batches(0, 10))
    for step in steps:
        if step == "after-write:1:a":
            break
    steps.close()  # a crash test abandoning the epoch (GeneratorExit at the step)
    time.sleep(0.1)
    names = {t.name for t in threading.enumerate()}
    assert not any(name.startswith("ds-job-0") for name in names), names
    assert len(a.writes) <= 2 + IN_FLIGHT + 1
