"""The epoch in flight, seen while it runs (coordinator/_watch.py): its phase, its age and the
sink calls it waits on, as the coordinator's snapshot, the watchdog's log lines and the
Prometheus gauges, with a real file sink held in one call by a wrapper."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from durable_sinks.coordinator import Coordinator, EpochOutcome, EpochResult, InFlight, Watch
from durable_sinks.core import CommitHandle, WriteResult
from durable_sinks.core.joblog import JobLogger
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.spark._prometheus import Families
from tests.support.faulty import Faulty
from tests.unit.test_metrics import samples


class Held(Faulty):
    """A real file sink whose `call` waits until `release` is set."""

    def __init__(self, inner: FolderSink, call: str) -> None:
        super().__init__(inner)
        self.call = call
        self.entered = threading.Event()
        self.release = threading.Event()

    def _hold(self, call: str) -> None:
        if call == self.call:
            self.entered.set()
            assert self.release.wait(30), "never released"

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        self._hold("write_batch")
        return super().write_batch(batch)

    def pre_commit(self, epoch: int) -> CommitHandle:
        self._hold("pre_commit")
        return super().pre_commit(epoch)


def until(check: Callable[[], Any], seconds: float = 10.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s: {check}")


def in_thread(coordinator: Coordinator, epoch: int) -> tuple[threading.Thread, list[EpochResult]]:
    results: list[EpochResult] = []
    rows = pa.record_batch({"id": [1, 2, 3]})
    thread = threading.Thread(target=lambda: results.append(coordinator.run_epoch(epoch, [rows])))
    thread.start()
    return thread, results


@pytest.mark.parametrize(
    ("call", "phase"), [("pre_commit", "pre_commit"), ("write_batch", "write")]
)
def test_a_held_sink_call_shows_in_the_snapshot_the_log_and_the_gauges(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, call: str, phase: str
) -> None:
    free = FolderSink(Files(str(tmp_path / "a"), name="a"))
    held = Held(FolderSink(Files(str(tmp_path / "b"), name="b")), call)
    coordinator = Coordinator(
        "orders",
        [free, held],
        LocalDirectoryStore(tmp_path / "store"),
        source="q",
        slow_phase_log_s=0.5,
    )
    coordinator.start()
    families = Families(CollectorRegistry())
    families.watching("orders", coordinator.watch.snapshot)
    caplog.set_level(logging.WARNING)
    thread, results = in_thread(coordinator, 7)
    try:
        assert held.entered.wait(10)
        # (the free sink's write of the same batch may still be running for a moment)
        seen: InFlight = until(
            lambda: (
                (s := coordinator.watch.snapshot()) is not None
                and s.phase == phase
                and [(c.sink, c.call) for c in s.calls] == [("b", call)]
                and s
            )
        )
        assert seen.epoch == 7
        assert [(c.sink, c.call) for c in seen.calls] == [("b", call)]
        line = until(lambda: [r.getMessage() for r in caplog.records if "slow:" in r.getMessage()])
        assert f"epoch 7 has been in {phase} for" in line[0]
        assert f"waiting on: b {call} (" in line[0]
        gauges = samples(families.registry)
        assert gauges[("durable_sinks_epoch_in_flight", (("job", "orders"),))] == 7
        assert gauges[("durable_sinks_epoch_in_flight_seconds", (("job", "orders"),))] > 0
        in_phase = gauges[
            ("durable_sinks_phase_in_flight_seconds", (("job", "orders"), ("phase", phase)))
        ]
        assert in_phase > 0
        assert (
            gauges[
                ("durable_sinks_phase_in_flight_seconds", (("job", "orders"), ("phase", "commit")))
            ]
            == 0
        )
        key = (
            "durable_sinks_sink_call_in_flight_seconds",
            (("call", call), ("job", "orders"), ("sink", "b")),
        )
        assert gauges[key] > 0
    finally:
        held.release.set()
        thread.join(30)
    assert results[0].outcome is EpochOutcome.COMMITTED
    assert coordinator.watch.snapshot() is None
    gauges = samples(families.registry)
    assert gauges[("durable_sinks_epoch_in_flight", (("job", "orders"),))] == -1
    assert not [k for k in gauges if k[0] == "durable_sinks_sink_call_in_flight_seconds"]
    coordinator.close()


def test_a_quick_epoch_logs_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = FolderSink(Files(str(tmp_path / "a"), name="a"))
    coordinator = Coordinator("orders", [sink], LocalDirectoryStore(tmp_path / "s"), source="q")
    coordinator.start()
    caplog.set_level(logging.WARNING)
    for epoch in range(3):
        coordinator.run_epoch(epoch, [pa.record_batch({"id": [epoch]})])
    coordinator.close()
    assert not [r for r in caplog.records if "slow:" in r.getMessage()]


def test_the_phase_age_runs_from_entering_a_new_phase() -> None:
    watch = Watch(JobLogger("orders"), slow_after_s=0)  # 0: no watchdog
    assert watch.snapshot() is None
    watch.begin(3)
    with watch.calling("pg", "begin_epoch"):
        watch.enter("begin")
        first = watch.snapshot()
        assert first is not None
        assert (first.epoch, first.phase) == (3, "begin")
        assert [(c.sink, c.call) for c in first.calls] == [("pg", "begin_epoch")]
    time.sleep(0.05)
    watch.enter("begin")  # the phase it is in: its age goes on
    again = watch.snapshot()
    assert again is not None
    assert again.phase_age_s >= 0.05
    assert again.calls == ()
    watch.enter("write")
    moved = watch.snapshot()
    assert moved is not None
    assert moved.phase_age_s < again.phase_age_s
    assert "no sink call" in moved.describe()
    watch.end()
    assert watch.snapshot() is None
    watch.close()
