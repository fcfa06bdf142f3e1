"""Misuse of the API says whose fault it is: calls out of order raise UsageError (a bug of the
calling code), never ConfigError (a setting to fix) or a raw error."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks import ConfigError, DurableSinkError, UsageError
from durable_sinks.coordinator import Coordinator
from durable_sinks.core import OpenContext, SinkConnector
from durable_sinks.manifest import LocalDirectoryStore, MemoryDecisionStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.postgres import Postgres, PostgresSink


def unopened(tmp_path: Path) -> list[SinkConnector]:
    return [
        FolderSink(Files(str(tmp_path / "files"))),
        PostgresSink(Postgres("host=127.0.0.1 port=1 dbname=x", "t")),
        KafkaSink(Kafka("127.0.0.1:1", "events")),
    ]


def test_usage_error_is_its_own_kind() -> None:
    assert issubclass(UsageError, DurableSinkError)
    assert not issubclass(UsageError, ConfigError)
    assert not UsageError.retriable


@pytest.mark.parametrize("index", range(3), ids=["files", "postgres", "kafka"])
def test_a_sink_used_before_open_raises_usage_error(tmp_path: Path, index: int) -> None:
    sink = unopened(tmp_path)[index]
    with pytest.raises(UsageError, match="is not open"):
        sink.begin_epoch(0)
    with pytest.raises(UsageError, match="is not open"):
        sink.recover_prepared()


def test_a_write_with_no_epoch_begun_raises_usage_error(tmp_path: Path) -> None:
    sink = FolderSink(Files(str(tmp_path / "files")))
    sink.open(OpenContext("job", sink.name, 1))
    with pytest.raises(UsageError, match="begin_epoch"):
        sink.write_batch(pa.record_batch({"x": [1]}))
    with pytest.raises(UsageError, match="begin_epoch"):
        sink.pre_commit(0)


def test_stores_used_before_open_raise_usage_error(tmp_path: Path) -> None:
    for store in (LocalDirectoryStore(tmp_path), MemoryDecisionStore()):
        with pytest.raises(UsageError, match="not open"):
            store.get(0)
        with pytest.raises(UsageError, match="not open"):
            store.latest_epoch()


def test_a_coordinator_used_out_of_order_raises_usage_error(tmp_path: Path) -> None:
    coordinator = Coordinator(
        "job", [FolderSink(Files(str(tmp_path / "files")))], LocalDirectoryStore(tmp_path)
    )
    with pytest.raises(UsageError, match="call start"):
        coordinator.run_epoch(0, [])
    coordinator.start()
    with pytest.raises(UsageError, match="executor_mode=True"):
        coordinator.run_distributed_epoch(0, lambda generation: [])
    with pytest.raises(UsageError, match="already started"):
        coordinator.start()
    coordinator.close()


def test_a_coordinator_entered_from_a_second_thread_refuses_and_does_nothing(
    tmp_path: Path,
) -> None:
    """Two threads in one coordinator would interleave its sinks' epochs (one writer given to
    two queries would lose batches): the second call is refused while the first runs."""
    sink = FolderSink(Files(str(tmp_path / "files")))
    coordinator = Coordinator("job", [sink], LocalDirectoryStore(tmp_path / "store"))
    coordinator.start()
    inside, release = threading.Event(), threading.Event()
    results = []

    def slow_batches() -> Iterator[pa.RecordBatch]:
        yield pa.record_batch({"x": [1, 2]})
        inside.set()
        release.wait(30)

    worker = threading.Thread(
        target=lambda: results.append(coordinator.run_epoch(0, slow_batches()))
    )
    worker.start()
    assert inside.wait(30)
    with pytest.raises(UsageError, match="already running a call in another thread"):
        coordinator.run_epoch(1, [pa.record_batch({"x": [3]})])
    release.set()
    worker.join(30)
    assert [r.epoch for r in results] == [0]
    assert coordinator.decision(1) is None  # the refused call wrote and decided nothing
    assert coordinator.run_epoch(1, [pa.record_batch({"x": [3]})]).epoch == 1
    coordinator.close()
