"""A batch's numbers in and beside Spark's query progress, on a real local Spark writing into
the test bed's Postgres: what Spark itself shows for a foreachBatch sink and for
`format("durable")`, a user's `observe` before the sink, and `progress_listener` publishing
each batch's epoch record joined with Spark's progress (docs/operations.md, "In Spark's query
progress")."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions

from durable_sinks import BatchProgress, progress_listener
from durable_sinks.spark import durable_sink, register_data_source
from tests.services import PostgresEndpoint

from .streams import postgres_ids, run_available_now, source_stream, write_input


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Spark's listener bus delivers progress events on its own thread, after the batch."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


@pytest.mark.parametrize(
    "execution",
    # The default suite's: driver mode. Executor mode's coordinator runs on the driver too.
    ["driver", pytest.param("executor", marks=pytest.mark.fault_tier)],
)
def test_the_listener_publishes_each_batch_s_record_joined_with_spark_s_progress(
    spark: Any,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    execution: str,
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(2):
        write_input(source, f"part-{n}.json", range(n * 10, n * 10 + 7))
    published: list[BatchProgress] = []
    listener = progress_listener(spark, on_progress=published.append)
    writer = durable_sink(
        "postgres", dsn=dsn, table=table, job_id=job_id, create_table=True, execution=execution
    )
    # The documented way to numbers inside Spark's own progress: observe before the sink.
    rows = functions.count(functions.lit(1)).alias("rows")
    stream = source_stream(spark, source).observe("input", rows)
    try:
        run_available_now(stream, writer, checkpoint)
        wait_for(lambda: len(published) == 2, "two batches published")
    finally:
        spark.streams.removeListener(listener)

    assert postgres_ids(dsn, table) == [*range(7), *range(10, 17)]
    query_id = published[0].query_id
    assert [(p.query_id, p.batch_id, p.outcome) for p in published] == [
        (query_id, 0, "committed"),
        (query_id, 1, "committed"),
    ]
    assert listener.recent(query_id) == published
    for batch in published:
        spark_side = batch.as_dict()
        assert batch.rows == {"postgres": 7}
        assert batch.record["execution"] == execution
        assert batch.record["epoch"] == batch.batch_id
        # Spark's own numbers beside ours: its input count, the user's observation (the
        # writer runs one Spark action per batch, so it counts each row once), and no
        # output count for a foreachBatch sink.
        assert spark_side["numInputRows"] == 7
        assert spark_side["observedMetrics"] == {"input": {"rows": 7}}
        assert spark_side["sink"]["description"] == "ForeachBatchSink"
        assert spark_side["sink"]["numOutputRows"] == -1
        assert postgres.password not in batch.json()
        assert dsn not in batch.json()


@pytest.mark.fault_tier  # Spark's own count; the default suite's data source tests write it
def test_the_data_source_s_rows_are_counted_by_spark_in_the_sink_s_progress(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    register_data_source(spark)
    source, table = tmp_path / "in", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    write_input(source, "part-0.json", range(12))
    query = (
        source_stream(spark, source)
        .writeStream.format("durable")
        .option("kind", "postgres")
        .option("job_id", job_id)
        .option("dsn", dsn)
        .option("table", table)
        .option("create_table", "true")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240), "the query did not finish in 240 s"
    assert query.exception() is None
    assert postgres_ids(dsn, table) == list(range(12))
    # Spark counts the rows its writer was given (WriteToDataSourceV2Exec); a Python writer
    # reports no sink metrics (its table does not implement ReportsSinkMetrics).
    (progress,) = [json.loads(p.json) for p in query.recentProgress if p.numInputRows]
    assert progress["sink"]["numOutputRows"] == 12
    assert progress["sink"].get("metrics", {}) == {}


def observed_through_connect(
    spark: Any, source: str, checkpoint: str, dsn: str, table: str, job_id: str
) -> dict[str, Any]:
    """In a Connect client: the listener's refusal, then a query that observes its input
    before a durable_sink; each batch's observedMetrics and sink from Spark's progress."""
    from durable_sinks import ConfigError

    refusal = ""
    try:
        progress_listener(spark)
    except ConfigError as refused:
        refusal = str(refused)
    writer = durable_sink(
        "postgres",
        dsn=dsn,
        table=table,
        job_id=job_id,
        create_table=True,
        checkpoint_location=checkpoint,  # pyspark 4.3's Connect hides the query from a batch
    )
    rows = functions.count(functions.lit(1)).alias("rows")
    query = (
        source_stream(spark, Path(source))
        .observe("input", rows)
        .writeStream.foreachBatch(writer)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    # pyspark 3.5's Connect client gives each progress as a dict, 4.x as StreamingQueryProgress
    progress = [p if isinstance(p, dict) else json.loads(p.json) for p in query.recentProgress]
    return {
        "refusal": refusal,
        "error": None if query.exception() is None else str(query.exception()),
        "batches": [(p["batchId"], p["observedMetrics"], p["sink"]) for p in progress],
    }


@pytest.mark.fault_tier  # a Connect client of its own; classic Spark's observe is the default's
def test_through_spark_connect_an_observation_before_the_sink_reaches_the_progress(
    connect_client: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    source, table = tmp_path / "in", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(2):
        write_input(source, f"part-{n}.json", range(n * 10, n * 10 + 6))
    seen = connect_client.run(
        observed_through_connect,
        str(source),
        str(tmp_path / "checkpoint"),
        dsn,
        table,
        job_id,
    )
    assert "Spark Connect" in seen["refusal"]
    assert seen["error"] is None
    assert postgres_ids(dsn, table) == [*range(6), *range(10, 16)]
    assert [batch for batch, _, _ in seen["batches"]] == [0, 1]
    for _, observed, sink in seen["batches"]:
        # Connect's progress JSON carries an observation as the row's values and its schema
        # (classic: {"input": {"rows": 6}}).
        assert observed["input"]["values"] == [6]
        assert [f["name"] for f in observed["input"]["schema"]["fields"]] == ["rows"]
        assert (sink["description"], sink["numOutputRows"]) == ("ForeachBatchSink", -1)
