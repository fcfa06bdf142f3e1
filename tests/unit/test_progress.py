"""The progress listener's join, without a JVM: real epochs of a coordinator over file sinks
recorded by the writer's observer, joined with progress events built by pyspark's own
`QueryProgressEvent.fromJson` (the shape Spark Connect's listener events take)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.streaming.listener import QueryProgressEvent, StreamingQueryListener

from durable_sinks import BatchProgress, ConfigError, progress_listener
from durable_sinks.coordinator import Coordinator, EpochResult
from durable_sinks.core.errors import OutageError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.spark._observe import RECENT, BatchObserver, RecentEpochs
from durable_sinks.spark._progress import PROGRESS_LOGGER, RECORD_KEY, ProgressJoin

SECRET = "s3cr3t-pw"


def progress_json(query: str, batch: int, rows: int = 4) -> str:
    """A StreamingQueryProgress as Spark writes it for a foreachBatch sink."""
    return json.dumps(
        {
            "id": query,
            "runId": str(uuid.uuid4()),
            "name": None,
            "timestamp": "2026-11-29T01:00:00.000Z",
            "batchId": batch,
            "batchDuration": 120,
            "numInputRows": rows,
            "inputRowsPerSecond": 0.0,
            "processedRowsPerSecond": 33.3,
            "durationMs": {"addBatch": 100, "triggerExecution": 120},
            "stateOperators": [],
            "sources": [
                {
                    "description": "FileStreamSource[file:/in]",
                    "startOffset": None,
                    "endOffset": {"logOffset": batch},
                    "latestOffset": None,
                    "numInputRows": rows,
                    "inputRowsPerSecond": 0.0,
                    "processedRowsPerSecond": 33.3,
                }
            ],
            "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
            "observedMetrics": {"input": {"rows": rows}},
        }
    )


def epochs(tmp_path: Path, n: int) -> tuple[Coordinator, list[EpochResult]]:
    """`n` epochs of 4 rows each through two file sinks, then epoch 0 replayed."""
    sinks = [FolderSink(Files(str(tmp_path / name), name=name)) for name in ("a", "b")]
    coordinator = Coordinator("orders", list(sinks), LocalDirectoryStore(tmp_path / "store"))
    coordinator.start()
    rows = pa.record_batch({"id": [1, 2, 3, 4]})
    results = [coordinator.run_epoch(epoch, [rows]) for epoch in range(n)]
    results.append(coordinator.run_epoch(0, [rows]))
    return coordinator, results


def record(observer: BatchObserver, result: EpochResult | None, query: str, batch: int) -> None:
    observer.batch(
        batch,
        result,
        seconds=0.1,
        attempts=1,
        failed_attempts=0,
        generation=1,
        current=None,
        recovery=None,
        error=None if result else OutageError(f"postgres://u:{SECRET}@db down", job="orders"),
        query=query,
        batch=batch,
    )


def test_recent_epochs_keep_the_newest_record_of_a_batch_and_drop_the_oldest() -> None:
    recent = RecentEpochs(limit=2)
    recent.put("q", 0, {"outcome": "failed"})
    recent.put("q", 0, {"outcome": "committed"})  # the replay's record replaces it
    recent.put("q", 1, {"outcome": "committed"})
    recent.put("other", 0, {"outcome": "committed"})
    assert len(recent) == 2
    assert recent.get("q", 0) is None  # the oldest, dropped
    assert recent.get("q", 1) == {"outcome": "committed"}
    assert recent.get("q", 1) == {"outcome": "committed"}  # read, not removed
    assert recent.get("other", 0) == {"outcome": "committed"}


def test_a_progress_event_is_joined_with_the_record_of_its_query_and_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, results = epochs(tmp_path, 2)
    query, other = str(uuid.uuid4()), str(uuid.uuid4())
    observer = BatchObserver("orders", "driver")
    for batch, result in enumerate(results[:2]):
        record(observer, result, query, batch)
    published: list[BatchProgress] = []
    join = ProgressJoin(published.append, records=RECENT)
    caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)

    assert join.progress(progress_json(other, 0)) is None  # a query no writer here serves
    assert join.progress(progress_json(query, 5)) is None  # a batch no writer here wrote
    first = join.progress(progress_json(query, 0))
    second = join.progress(progress_json(query, 1))

    assert published == [first, second]
    assert first is not None
    assert second is not None
    assert (first.query_id, first.batch_id, first.outcome) == (query, 0, "committed")
    assert first.rows == {"a": 4, "b": 4}
    assert first.record["epoch"] == 0
    assert first.record["execution"] == "driver"
    assert first.progress["sink"]["numOutputRows"] == -1
    joined = json.loads(second.json())
    assert joined["batchId"] == 1
    assert joined["observedMetrics"] == {"input": {"rows": 4}}
    assert joined[RECORD_KEY]["rows"] == {"a": 4, "b": 4}
    assert join.last(query) == second
    assert join.recent(query) == [first, second]
    assert join.last(other) is None
    assert join.recent(other) == []
    logged = [r for r in caplog.records if r.name == PROGRESS_LOGGER]
    assert [json.loads(r.ds_progress_json) for r in logged] == [  # type: ignore[attr-defined]
        first.as_dict(),
        second.as_dict(),
    ]


def test_every_listener_sees_each_batch_once_per_run(tmp_path: Path) -> None:
    _, results = epochs(tmp_path, 1)
    query = str(uuid.uuid4())
    record(BatchObserver("orders", "driver"), results[0], query, 0)
    first, second = ProgressJoin(), ProgressJoin()
    event = progress_json(query, 0)
    assert first.progress(event) is not None
    assert second.progress(event) is not None
    # The same batch of the same run again: published once.
    assert first.progress(event) is None
    assert len(first.recent(query)) == 1
    # The query restarted (a new run) and its batch replayed: published again.
    restarted = json.loads(event) | {"runId": str(uuid.uuid4())}
    assert first.progress(json.dumps(restarted)) is not None
    assert len(first.recent(query)) == 2


def test_a_replayed_batch_is_published_as_already_committed_and_writes_no_rows(
    tmp_path: Path,
) -> None:
    _, results = epochs(tmp_path, 1)
    query = str(uuid.uuid4())
    record(BatchObserver("orders", "driver"), results[-1], query, 0)
    joined = ProgressJoin().progress(progress_json(query, 0))
    assert joined is not None
    assert (joined.outcome, joined.rows) == ("already_committed", {})


def test_a_failed_batch_carries_its_error_class_and_never_its_message() -> None:
    query = str(uuid.uuid4())
    record(BatchObserver("orders", "driver"), None, query, 3)
    joined = ProgressJoin().progress(progress_json(query, 3))
    assert joined is not None
    assert (joined.outcome, joined.record["error"]) == ("failed", "OutageError")
    assert SECRET not in joined.json()
    assert "postgres://" not in joined.json()


def test_keep_bounds_what_recent_holds_and_a_raising_callback_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recent = RecentEpochs()
    query = str(uuid.uuid4())

    def broken(progress: BatchProgress) -> None:
        raise ValueError(SECRET)

    join = ProgressJoin(broken, keep=2, records=recent)
    caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)
    for batch in range(3):
        recent.put(query, batch, {"outcome": "committed", "rows": {"a": batch}})
        assert join.progress(progress_json(query, batch)) is not None
    assert [p.batch_id for p in join.recent(query)] == [1, 2]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    expected = [f"on_progress raised ValueError for query {query} batch {b}" for b in range(3)]
    assert warnings == expected
    with pytest.raises(ConfigError, match="keep must be at least 1"):
        ProgressJoin(keep=0)


def test_the_listener_is_spark_s_listener_and_joins_spark_s_progress_event(tmp_path: Path) -> None:
    _, results = epochs(tmp_path, 1)
    query = str(uuid.uuid4())
    record(BatchObserver("orders", "executor"), results[0], query, 0)
    seen: list[BatchProgress] = []
    listener = progress_listener(on_progress=seen.append)
    assert StreamingQueryListener in type(listener).__mro__
    event = QueryProgressEvent.fromJson({"progress": json.loads(progress_json(query, 0))})
    listener.onQueryProgress(event)
    assert [(p.query_id, p.batch_id, p.record["execution"]) for p in seen] == [
        (query, 0, "executor")
    ]
    assert listener.last(query) == seen[0]


class _ConnectSession:
    """Stands for a Spark Connect session where only its class's module is read."""


_ConnectSession.__module__ = "pyspark.sql.connect.session"


def test_a_spark_connect_session_is_refused_with_where_to_read_the_numbers() -> None:
    with pytest.raises(ConfigError) as refused:
        progress_listener(_ConnectSession())
    assert "Spark Connect" in str(refused.value)
    assert refused.value.fix is not None
    assert "observe" in refused.value.fix


def test_importing_the_listener_module_loads_no_spark() -> None:
    probe = (
        "import sys\n"
        "import durable_sinks.spark._progress\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr
