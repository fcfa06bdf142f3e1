"""Executor mode against a table with a primary key: a part whose keys are held by a dead
attempt's prepared transaction fails with a TransientError after a bounded wait instead of
hanging the batch, and once that attempt is rolled back (what the driver's next attempt's
recovery does) the part writes."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from durable_sinks.core import OpenContext
from durable_sinks.core.errors import TransientError
from durable_sinks.sinks.postgres import PostgresSink, PostgresSinkConfig
from durable_sinks.sinks.postgres import sink as postgres_sink
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint

Conn = psycopg.Connection[Any]


def test_a_part_waiting_on_a_dead_attempts_keys_fails_fast_then_writes_after_its_rollback(
    postgres: PostgresEndpoint,
    conn: Conn,
    pg_schema: str,
    unique: UniqueNames,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(postgres_sink, "WORKER_LOCK_TIMEOUT_S", 1)
    table = f"{pg_schema}.keyed"
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(sql.SQL(table)))
    config = PostgresSinkConfig(postgres.conninfo(), table)
    driver = PostgresSink(config)
    driver.open(OpenContext(unique.job_id, "postgres", 1))
    rows = pa.record_batch({"id": pa.array([1, 2], pa.int64())})

    def part(name: str) -> PostgresSink:
        worker = PostgresSink(config)
        worker.open(OpenContext(unique.job_id, "postgres", 1, worker=True, part=name))
        return worker

    dead = part("p0-t1")
    dead.begin_epoch(0)
    dead.write_batch(rows)
    held = dead.pre_commit(0)  # its task then dies: the prepared transaction holds keys 1, 2
    dead.close()
    retry = part("p0-t2")
    try:
        retry.begin_epoch(0)
        started = time.monotonic()
        with pytest.raises(TransientError, match="lock") as raised:
            retry.write_batch(rows)
        assert time.monotonic() - started < 10
        assert raised.value.sink == "postgres"
        retry.rollback_epoch(0, None)
        driver.rollback_epoch(0, held)  # the next attempt's recovery: no decision, roll back
        retry.begin_epoch(0)
        assert retry.write_batch(rows).rows == 2
        retry.rollback_epoch(0, retry.pre_commit(0))
    finally:
        retry.close()
        driver.close()
