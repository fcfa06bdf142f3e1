"""One writer given to two streaming queries, or called from two threads at once: each batch
lands exactly once, or the second query is refused before it writes anything.

foreachBatch calls the function from each query's own thread. Before the writer serialised
its calls and bound itself to one query, two queries sharing one `durable_sink(...)` lost
committed batches, committed a failed query's rows and crashed the driver.

`DS_SHARED_WRITER_RUNS` repeats the two-queries case (`make test-crash` runs it 50 times);
each run uses its own tables, folders and job id, and the start order of the queries is left
to chance.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
from pyspark import InheritableThread

from durable_sinks.coordinator import EpochOutcome
from durable_sinks.core.errors import SchemaMismatchError
from durable_sinks.spark import durable_sink, sink
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint
from tests.support.tiers import SHARED_WRITER_RUNS

from .streams import (
    postgres_ids,
    prepared_transactions,
    run_available_now,
    source_stream,
    write_input,
)

RUNS = SHARED_WRITER_RUNS
BATCHES = 4
ROWS = 10
REFUSAL = "one writer (one coordinator) serves one query"


def _written_files(folder: Path) -> list[int]:
    if not folder.exists() or not any(folder.glob("epoch=*")):
        return []
    return sorted(pq.read_table(folder, columns=["id"]).column("id").to_pylist())


def _start(stream: Any, writer: Any, checkpoint: Path) -> Any:
    return (
        stream.writeStream.foreachBatch(writer)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def _outcome(query: Any, timeout: float = 180) -> BaseException | None:
    try:
        finished = query.awaitTermination(timeout)
    except Exception as exc:  # noqa: BLE001 - the refused query's error is the result
        return exc
    if not finished:
        query.stop()
        raise AssertionError(f"query {query.id} did not finish within {timeout} s")
    return None


@pytest.mark.parametrize("run", range(RUNS))
def test_two_queries_sharing_one_writer_land_one_exactly_once_and_refuse_the_other(
    spark: Any,
    postgres: PostgresEndpoint,
    pg_schema: str,
    unique: UniqueNames,
    tmp_path: Path,
    run: int,
) -> None:
    dsn, table, out = postgres.conninfo(), f"{pg_schema}.events_{run}", tmp_path / "out"
    job_id = unique.name(f"shared{run}")
    ids = {"a": range(0, BATCHES * ROWS), "b": range(10_000, 10_000 + BATCHES * ROWS)}
    for name, rows in ids.items():
        for n in range(BATCHES):
            write_input(tmp_path / name, f"part-{n}.json", rows[n * ROWS : (n + 1) * ROWS])
    writer = durable_sink(
        [
            sink("postgres", dsn=dsn, table=table, create_table=True),
            sink("files", path=str(out)),
        ],
        job_id=job_id,
    )
    queries = {
        name: _start(source_stream(spark, tmp_path / name), writer, tmp_path / f"cp-{name}")
        for name in ids
    }
    outcomes = {name: _outcome(query) for name, query in queries.items()}
    writer.close()

    finished = [name for name, error in outcomes.items() if error is None]
    refused = [name for name, error in outcomes.items() if error is not None]
    assert len(finished) == 1, outcomes
    winner, loser = finished[0], refused[0]
    assert writer._query_id == queries[winner].id
    error = str(outcomes[loser])
    assert REFUSAL in error, error
    assert "UsageError" in error
    assert "give each query its own durable_sink" in error
    # Exactly the winner's rows, once each, in both sinks; nothing of the refused query.
    assert postgres_ids(dsn, table) == list(ids[winner])
    assert _written_files(out) == list(ids[winner])
    assert prepared_transactions(dsn, job_id) == []
    assert not (out / "_staging").exists() or not list((out / "_staging").iterdir())


def test_calls_from_two_threads_run_one_after_the_other_and_land_each_batch_once(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    """Two threads replay the same epochs through one writer at once (outside a query, so no
    query id binds it): every epoch commits once, the other thread's call finds it done."""
    dsn, table, out = postgres.conninfo(), f"{pg_schema}.events", tmp_path / "out"
    writer = durable_sink(
        [
            sink("postgres", dsn=dsn, table=table, create_table=True),
            sink("files", path=str(out)),
        ],
        job_id=job_id,
    )
    frames = [
        spark.range(n * ROWS, (n + 1) * ROWS).selectExpr("id", "'x' AS body") for n in range(6)
    ]
    outcomes: list[tuple[int, EpochOutcome]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(2)

    def replay() -> None:
        start.wait()
        try:
            for epoch, frame in enumerate(frames):
                writer(frame, epoch)
                result = writer.last_result
                assert result is not None
                with lock:
                    outcomes.append((epoch, result.outcome))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    # pyspark's InheritableThread closes the thread's py4j connection when it ends; a plain
    # thread's connection stays in the JVM's pool, and a later foreachBatch callback sent on
    # it waits for ever (pinned-thread mode).
    threads = [InheritableThread(target=replay) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    writer.close()
    assert errors == []
    committed = sorted(e for e, outcome in outcomes if outcome is EpochOutcome.COMMITTED)
    assert committed == list(range(len(frames)))
    assert postgres_ids(dsn, table) == list(range(len(frames) * ROWS))
    assert _written_files(out) == list(range(len(frames) * ROWS))
    assert prepared_transactions(dsn, job_id) == []


def test_a_failed_batch_logs_our_error_once_before_spark_wraps_it(
    spark: Any,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Spark shows its own StreamingQueryException first; the writer logs our error's class,
    message and fix once at ERROR with the job and epoch, and keeps it as `last_error`."""
    dsn, table = postgres.conninfo(), f"{pg_schema}.events"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY)")
    write_input(tmp_path / "in", "part-0.json", range(3))
    writer = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id)
    caplog.set_level(logging.INFO, logger="durable_sinks")
    with pytest.raises(Exception, match="SchemaMismatchError") as caught:
        run_available_now(source_stream(spark, tmp_path / "in"), writer, tmp_path / "cp")
    writer.close()
    assert not isinstance(caught.value, SchemaMismatchError)  # Spark's wrapper reaches the user
    assert isinstance(writer.last_error, SchemaMismatchError)
    failures = [
        r for r in caplog.records if r.levelno == logging.ERROR and r.name.startswith("durable")
    ]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    line = failures[0].getMessage()
    assert line.startswith(f"job={job_id} sink=- epoch=0: batch failed: SchemaMismatchError: ")
    assert "column 'body' is not in the table" in line
    assert "Fix: " in line
    assert postgres_ids(dsn, table) == []
    assert prepared_transactions(dsn, job_id) == []
