"""`metrics_port`: the Prometheus endpoint scraped over HTTP while a real streaming query
writes into the test bed's Postgres, and the record per epoch it logs."""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from durable_sinks.spark import durable_sink
from tests.services import PostgresEndpoint
from tests.support.ports import free_port

from .streams import postgres_ids, source_stream, write_input


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def value(text: str, name: str, **labels: str) -> float:
    """The sample `name{labels}` of a scrape (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def wait_for(check: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


def test_the_metrics_endpoint_shows_the_counters_moving_during_a_running_query(
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
    caplog.set_level(logging.INFO, logger="durable_sinks.epochs")
    writer = durable_sink(
        "postgres", dsn=dsn, table=table, job_id=job_id, create_table=True, metrics_port=port
    )
    assert writer.metrics_port == port
    job = {"job": job_id}
    before = scrape(port)  # served from construction on, every counter of the job at 0
    assert value(before, "durable_sinks_epochs_committed_total", **job) == 0

    write_input(source, "part-0.json", range(10))
    query = (
        source_stream(spark, source)
        .writeStream.foreachBatch(writer)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        scrapes: list[str] = []

        def committed(n: int) -> Callable[[], bool]:
            def check() -> bool:
                scrapes.append(scrape(port))
                return value(scrapes[-1], "durable_sinks_epochs_committed_total", **job) >= n

            return check

        wait_for(committed(1), "the first batch counted")
        first = scrapes[-1]
        assert query.isActive
        write_input(source, "part-1.json", range(10, 25))
        wait_for(committed(2), "the second batch counted")
        second = scrapes[-1]
        assert query.isActive
    finally:
        query.stop()
    assert query.exception() is None

    assert value(first, "durable_sinks_epochs_committed_total", **job) == 1
    assert value(second, "durable_sinks_epochs_committed_total", **job) == 2
    rows = {"job": job_id, "sink": "postgres"}
    assert value(first, "durable_sinks_rows_total", **rows) == 10
    assert value(second, "durable_sinks_rows_total", **rows) == 25
    assert value(second, "durable_sinks_bytes_total", **rows) > value(
        first, "durable_sinks_bytes_total", **rows
    )
    for phase in ("lookup", "write", "total"):  # one-phase: no pre_commit, no commit
        count = value(second, "durable_sinks_epoch_phase_seconds_count", **job, phase=phase)
        assert count == 2, phase
    assert value(second, "durable_sinks_last_committed_epoch", **job) == 1
    assert value(second, "durable_sinks_epochs_failed_total", **job) == 0
    assert value(second, "durable_sinks_epochs_retried_total", **job) == 0
    assert value(second, "durable_sinks_prepared_in_doubt", **job) == 0
    assert "durable_sinks_replay_mismatches_total" in second
    assert postgres_ids(dsn, table) == list(range(25))
    assert writer.totals.epochs_committed == 2

    # Spark replays batch 1 (it had landed): counted as already committed, nothing written.
    writer(spark.read.schema("id LONG, body STRING").json(str(source / "part-1.json")), 1)
    third = scrape(port)
    assert value(third, "durable_sinks_epochs_already_committed_total", **job) == 1
    assert value(third, "durable_sinks_epochs_committed_total", **job) == 2
    assert value(third, "durable_sinks_rows_total", **rows) == 25
    assert value(third, "durable_sinks_last_committed_epoch", **job) == 1
    assert value(third, "durable_sinks_epoch_phase_seconds_count", **job, phase="total") == 3

    # No secret in what is served or logged: not the DSN, not its password.
    assert postgres.password not in second
    assert dsn not in second
    records = [r for r in caplog.records if r.name == "durable_sinks.epochs"]
    facts = [json.loads(r.ds_epoch_json) for r in records]  # type: ignore[attr-defined]
    assert [(f["epoch"], f["outcome"]) for f in facts] == [
        (0, "committed"),
        (1, "committed"),
        (1, "already_committed"),
    ]
    for record in records:
        facts = json.loads(record.ds_epoch_json)  # type: ignore[attr-defined]
        assert facts["job"] == job_id
        assert postgres.password not in record.ds_epoch_json  # type: ignore[attr-defined]
        assert postgres.password not in record.getMessage()
    assert [json.loads(r.ds_epoch_json)["rows"] for r in records] == [  # type: ignore[attr-defined]
        {"postgres": 10},
        {"postgres": 15},
        {},
    ]


def test_writers_of_one_process_share_the_endpoint_and_a_taken_port_is_a_config_error(
    postgres: PostgresEndpoint, pg_schema: str, job_id: str
) -> None:
    from durable_sinks.core.errors import ConfigError

    dsn, table = postgres.conninfo(), f"{pg_schema}.events"
    chosen = durable_sink(
        "postgres", dsn=dsn, table=table, job_id=job_id, create_table=True, metrics_port=0
    )
    again = durable_sink(
        "postgres",
        dsn=dsn,
        table=f"{pg_schema}.other",
        job_id=job_id + "_b",
        create_table=True,
        metrics_port=0,
    )
    try:
        assert chosen.metrics_port is not None
        assert chosen.metrics_port == again.metrics_port  # one endpoint for port 0
        text = scrape(chosen.metrics_port)
        for job in (job_id, job_id + "_b"):
            assert f'durable_sinks_epochs_committed_total{{job="{job}"}} 0.0' in text
    finally:
        chosen.close()
        again.close()

    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))  # noqa: S104 - the endpoint binds every interface too
        holder.listen()
        taken = int(holder.getsockname()[1])
        with pytest.raises(ConfigError, match=f"metrics_port {taken}") as caught:
            durable_sink("postgres", dsn=dsn, table=table, job_id=job_id, metrics_port=taken)
    assert caught.value.fix
