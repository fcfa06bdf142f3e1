"""A batch held up, seen while it is held: a Postgres lock another session holds keeps a real
streaming query's batch in its write; the metrics endpoint's in-flight gauges show the epoch,
its phase and the sink call it waits on, the log names them within 30 s (the default
`slow_phase_log_s`), and Spark's own job records describe the batch's jobs."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from durable_sinks.spark import durable_sink
from tests.services import PostgresEndpoint
from tests.support.ports import free_port

from .streams import postgres_ids, source_stream, write_input
from .test_metrics import scrape, value, wait_for


def job_descriptions(spark: Any) -> list[str]:
    """The description of every job Spark's status store knows (what its UI shows)."""
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    found = (jobs.apply(i).description() for i in range(jobs.size()))
    return [str(d.get()) for d in found if d.isDefined()]


def test_a_batch_held_by_a_postgres_lock_is_shown_while_it_is_held(
    spark: Any,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    port = free_port()
    job = {"job": job_id}
    writer = durable_sink(
        "postgres", dsn=dsn, table=table, job_id=job_id, create_table=True, metrics_port=port
    )
    caplog.set_level(logging.WARNING, logger="durable_sinks")
    write_input(source, "part-0.json", range(10))
    query = (
        source_stream(spark, source)
        .writeStream.foreachBatch(writer)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(
            lambda: value(scrape(port), "durable_sinks_epochs_committed_total", **job) == 1,
            "the first batch committed",
        )
        assert value(scrape(port), "durable_sinks_epoch_in_flight", **job) == -1
        with psycopg.connect(dsn) as holder:
            holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # held until rollback
            held_at = time.monotonic()
            write_input(source, "part-1.json", range(10, 25))
            call = {"job": job_id, "sink": "postgres", "call": "write_batch"}
            wait_for(
                lambda: (
                    value(scrape(port), "durable_sinks_sink_call_in_flight_seconds", **call) > 1
                ),
                "the write waiting on the lock, in the gauges",
            )
            seen = scrape(port)
            assert value(seen, "durable_sinks_epoch_in_flight", **job) == 1
            assert value(seen, "durable_sinks_epoch_in_flight_seconds", **job) > 1
            assert value(seen, "durable_sinks_phase_in_flight_seconds", **job, phase="write") > 1
            assert value(seen, "durable_sinks_phase_in_flight_seconds", **job, phase="commit") == 0

            def logged() -> bool:
                return any(
                    "slow: epoch 1 has been in write for" in r.getMessage()
                    and "waiting on: postgres write_batch (" in r.getMessage()
                    for r in caplog.records
                )

            wait_for(logged, "the slow write logged", timeout=30)
            assert time.monotonic() - held_at < 30
            assert writer.in_flight() is not None
            holder.rollback()  # the lock goes: the batch goes on
        wait_for(
            lambda: value(scrape(port), "durable_sinks_epochs_committed_total", **job) == 2,
            "the held batch committed once the lock went",
        )
    finally:
        query.stop()
    assert query.exception() is None
    assert postgres_ids(dsn, table) == list(range(25))
    after = scrape(port)
    assert value(after, "durable_sinks_epoch_in_flight", **job) == -1
    assert "durable_sinks_sink_call_in_flight_seconds{" not in after
    described = [d for d in job_descriptions(spark) if job_id in d]
    for epoch in (0, 1):
        assert any(
            d.startswith(f"durable-sinks: job {job_id}, epoch {epoch}, the driver reads the batch")
            for d in described
        ), described
