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
from durable_sinks.core.errors import SchemaMismatchError, TransientError
from durable_sinks.core.naming import job_prefix
from durable_sinks.sinks.postgres import Postgres, PostgresSink
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
    config = Postgres(postgres.conninfo(), table)
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


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_a_key_in_two_partitions_of_one_epoch_is_a_typed_error_not_a_wait(
    postgres: PostgresEndpoint, conn: Conn, pg_schema: str, unique: UniqueNames, mode: str
) -> None:
    """Two slices of one epoch (Spark partitions 0 and 1) hold the same key: the second waits
    on the first's prepared transaction, which only the decision (waiting for the second)
    would release. The wait ends within seconds in the typed error driver mode gives for a key
    twice in a batch, not at the lock time-out (30 s) and again in every retry."""
    table = f"{pg_schema}.keyed_{mode}"
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v text)").format(sql.SQL(table)))
    key = ("id",) if mode == "upsert" else ()
    config = Postgres(postgres.conninfo(), table, mode=mode, key=key)  # type: ignore[arg-type]
    driver = PostgresSink(config)
    driver.open(OpenContext(unique.job_id, "postgres", 1))

    def part(name: str) -> PostgresSink:
        worker = PostgresSink(config)
        worker.open(OpenContext(unique.job_id, "postgres", 1, worker=True, part=name))
        return worker

    def prepare(worker: PostgresSink, ids: list[int]) -> None:
        """Upsert waits at the merge (pre-commit), append at the COPY."""
        worker.write_batch(pa.record_batch({"id": pa.array(ids, pa.int64()), "v": ["x"] * 2}))
        worker.pre_commit(0)

    first, second = part("p0-t1"), part("p1-t2")
    try:
        first.begin_epoch(0)
        first.write_batch(pa.record_batch({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
        held = first.pre_commit(0)
        second.begin_epoch(0)
        started = time.monotonic()
        with pytest.raises(SchemaMismatchError, match="two Spark partitions") as raised:
            prepare(second, [2, 3])
        assert time.monotonic() - started < 10, "ended by the lock time-out, not the watch"
        assert "p0-t1" in raised.value.message
        assert "p1-t2" in raised.value.message
        assert "dropDuplicates" in (raised.value.fix or "")
        assert raised.value.epoch == 0
        assert raised.value.sink == "postgres"
        second.rollback_epoch(0, None)
        driver.rollback_epoch(0, held)
        left = conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
            (job_prefix(unique.job_id),),
        ).fetchone()
        assert left == (0,)
        count = sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(table))
        assert conn.execute(count).fetchone() == (0,)
    finally:
        first.close()
        second.close()
        driver.close()
