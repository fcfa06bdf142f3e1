"""Schema evolution of the Postgres sink (schema_evolution="add_columns") against the test
bed's real Postgres: a new batch column becomes a nullable column of the table inside the
epoch's transaction (and goes away with it when the epoch rolls back); smallint/integer and
real columns are widened; anything else is refused as without evolution, with the fix. In
executor mode a worker adds the column in a short transaction of its own, so that the other
parts of the epoch, prepared and holding their locks, never wait on it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from durable_sinks.coordinator import Coordinator, EpochOutcome, prepare_part
from durable_sinks.core import CommitHandle, OpenContext
from durable_sinks.core.bad_rows import BadRowPolicy, SchemaEvolution, WritePolicy
from durable_sinks.core.errors import ConfigError, SchemaMismatchError, TransientError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink, catalog
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint
from tests.support.pg_access import Role

Conn = psycopg.Connection[Any]
ADD = WritePolicy(schema_evolution=SchemaEvolution.ADD_COLUMNS)


def columns_of(conn: Conn, table: str) -> dict[str, str]:
    found = conn.execute(
        "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (table,),
    ).fetchall()
    return {r[0]: r[1] for r in found}


def rows_of(conn: Conn, table: str) -> list[tuple[Any, ...]]:
    schema, name = table.split(".")
    query = sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(schema, name))
    return [tuple(r) for r in conn.execute(query).fetchall()]


@pytest.fixture
def table(conn: Conn, pg_schema: str) -> str:
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, name text)").format(
            sql.Identifier(pg_schema, "events")
        )
    )
    return f"{pg_schema}.events"


def batch(ids: list[int], **extra: pa.Array) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids], **extra}
    )


@pytest.mark.parametrize("one_phase", [True, False], ids=["one-phase", "two-phase"])
def test_a_new_column_in_a_later_epoch_is_added_with_it(
    one_phase: bool, postgres: PostgresEndpoint, conn: Conn, table: str, job_id: str, tmp_path: Path
) -> None:
    sink = PostgresSink(Postgres(postgres.conninfo(), table))
    coordinator = Coordinator(
        job_id, [sink], LocalDirectoryStore(tmp_path / "store"), one_phase=one_phase, policy=ADD
    )
    coordinator.start()
    assert coordinator.run_epoch(0, [batch([1])]).outcome is EpochOutcome.COMMITTED
    later = batch([2], score=pa.array([2.5]), tags=pa.array(["x"], pa.string()))
    assert coordinator.run_epoch(1, [later, batch([3])]).outcome is EpochOutcome.COMMITTED
    # The batch without the new columns, after them in the same epoch, still fits.
    assert coordinator.run_epoch(2, [batch([4], score=pa.array([None], pa.float64()))]).outcome
    coordinator.close()
    assert columns_of(conn, table) == {
        "id": "bigint",
        "name": "text",
        "score": "double precision",
        "tags": "text",
    }
    assert rows_of(conn, table) == [
        (1, "n1", None, None),
        (2, "n2", 2.5, "x"),
        (3, "n3", None, None),
        (4, "n4", None, None),
    ]


def test_an_epoch_rolled_back_takes_its_new_column_with_it(
    postgres: PostgresEndpoint, conn: Conn, table: str, unique: UniqueNames
) -> None:
    sink = PostgresSink(Postgres(postgres.conninfo(), table))
    sink.open(OpenContext(unique.job_id, "postgres", 1, policy=ADD))
    try:
        new = batch([1], score=pa.array([1.5]))
        sink.begin_epoch(0)
        sink.write_batch(new)
        handle = sink.pre_commit(0)  # prepared: the column is in the prepared transaction
        assert "score" not in columns_of(conn, table)  # not visible to others
        sink.rollback_epoch(0, handle)
        assert columns_of(conn, table) == {"id": "bigint", "name": "text"}
        # The sink read the table again: the same batch adds the column once more.
        sink.begin_epoch(0)
        sink.write_batch(new)
        sink.commit_epoch(0, sink.pre_commit(0))
    finally:
        sink.close()
    assert columns_of(conn, table)["score"] == "double precision"
    assert rows_of(conn, table) == [(1, "n1", 1.5)]


def test_narrow_columns_are_widened_narrower_batches_cast_up_and_other_changes_refused(
    postgres: PostgresEndpoint, conn: Conn, pg_schema: str, unique: UniqueNames
) -> None:
    table = f"{pg_schema}.narrow"
    conn.execute(
        sql.SQL("CREATE TABLE {} (id integer, small smallint, ratio real, big bigint)").format(
            sql.Identifier(pg_schema, "narrow")
        )
    )
    conn.execute(
        sql.SQL("INSERT INTO {} VALUES (1, 2, 0.5, 3)").format(sql.Identifier(pg_schema, "narrow"))
    )
    sink = PostgresSink(Postgres(postgres.conninfo(), table))
    sink.open(OpenContext(unique.job_id, "postgres", 1, commit_point=True, policy=ADD))
    try:
        sink.begin_epoch(0)
        wide = pa.record_batch(
            {
                "id": pa.array([2**40], pa.int64()),
                "small": pa.array([70_000], pa.int32()),
                "ratio": pa.array([0.1], pa.float64()),
                "big": pa.array([4], pa.int64()),
            }
        )
        sink.write_batch(wide)
        sink.commit_with_decision(0, sink.pre_commit(0), {"epoch": 0})
        # A batch narrower than the (widened) columns, as before the widening, is cast up.
        sink.begin_epoch(1)
        narrower = pa.record_batch(
            {
                "id": pa.array([5], pa.int32()),
                "small": pa.array([6], pa.int16()),
                "ratio": pa.array([0.25], pa.float32()),
                "big": pa.array([7], pa.int32()),
            }
        )
        assert sink.write_batch(narrower).rows == 1
        sink.commit_with_decision(1, sink.pre_commit(1), {"epoch": 1})
        # Another type is refused as without evolution, with the fix.
        sink.begin_epoch(2)
        with pytest.raises(
            SchemaMismatchError, match="column 'id' is bigint in the table"
        ) as raised:
            sink.write_batch(pa.record_batch({"id": pa.array(["x"], pa.string())}))
        assert 'col("id").cast("bigint")' in (raised.value.fix or "")
        sink.rollback_epoch(2, None)
    finally:
        sink.close()
    assert columns_of(conn, table) == {
        "id": "bigint",
        "small": "integer",
        "ratio": "double precision",
        "big": "bigint",
    }
    assert rows_of(conn, table) == [(1, 2, 0.5, 3), (5, 6, 0.25, 7), (2**40, 70_000, 0.1, 4)]


def test_workers_add_the_column_in_their_own_transaction_and_never_wait_on_each_other(
    postgres: PostgresEndpoint, conn: Conn, table: str, job_id: str, tmp_path: Path
) -> None:
    """The first part adds the column and commits that at once; the second part, while the
    first is prepared (holding its lock on the table), finds the column there and writes
    without an ALTER. A rollback of the epoch keeps the column (nullable, empty)."""
    config = Postgres(postgres.conninfo(), table, participants_in_flight=4)
    coordinator = Coordinator(
        job_id,
        [PostgresSink(config)],
        LocalDirectoryStore(tmp_path / "store"),
        executor_mode=True,
        one_phase=False,
        policy=ADD,
    )
    coordinator.start()

    def prepare(generation: int) -> list[CommitHandle]:
        handles = []
        for part, ids in (("p0-t1", [1, 2]), ("p1-t2", [3])):
            handles += prepare_part(
                job_id,
                generation,
                0,
                part,
                lambda: [PostgresSink(config)],
                [batch(ids, score=pa.array([float(i) for i in ids]))],
                policy=ADD,
            )
            assert "score" in columns_of(conn, table)  # committed by the first part
        return handles

    assert coordinator.run_distributed_epoch(0, prepare).outcome is EpochOutcome.COMMITTED
    coordinator.close()
    assert rows_of(conn, table) == [(1, "n1", 1.0), (2, "n2", 2.0), (3, "n3", 3.0)]
    assert coordinator.sinks[0].metrics().get("columns_changed", 0) == 0  # the driver's: none


def test_a_job_user_that_cannot_alter_the_table_is_refused_at_open(
    postgres: PostgresEndpoint,
    table: str,
    unique: UniqueNames,
    roles: Callable[..., Role],
) -> None:
    role = roles()
    role.grant_table("events", "SELECT, INSERT")
    sink = PostgresSink(Postgres(role.dsn(), table))
    with pytest.raises(ConfigError, match="only its owner") as raised:
        sink.open(OpenContext(unique.job_id, "postgres", 1, policy=ADD))
    assert "leave schema_evolution out" in (raised.value.fix or "")
    sink.close()
    # Without schema evolution the same user runs the job.
    sink = PostgresSink(Postgres(role.dsn(), table))
    sink.open(OpenContext(unique.job_id, "postgres", 2))
    sink.close()


def test_a_part_whose_batches_change_columns_after_its_first_copy_is_refused(
    postgres: PostgresEndpoint, conn: Conn, table: str, unique: UniqueNames
) -> None:
    """A worker's own transaction holds the table's lock after its first COPY: it refuses a
    later batch with a new column at once, rather than wait on itself."""
    config = Postgres(postgres.conninfo(), table)
    driver = PostgresSink(config)
    driver.open(OpenContext(unique.job_id, "postgres", 1, policy=ADD))
    worker = PostgresSink(config)
    worker.open(OpenContext(unique.job_id, "postgres", 1, worker=True, part="p0-t1", policy=ADD))
    try:
        worker.begin_epoch(0)
        worker.write_batch(batch([1]))
        with pytest.raises(SchemaMismatchError, match="changed columns after its first COPY"):
            worker.write_batch(batch([2], score=pa.array([1.0])))
        worker.rollback_epoch(0, None)
    finally:
        worker.close()
        driver.close()
    assert columns_of(conn, table) == {"id": "bigint", "name": "text"}


def test_a_column_added_in_dead_letter_mode_stays_when_a_later_batch_has_refused_rows(
    postgres: PostgresEndpoint, conn: Conn, table: str, unique: UniqueNames
) -> None:
    """The ALTER runs under dead-letter mode's savepoint: it is sealed before the next COPY,
    so rolling back a refused COPY never takes the new column away."""
    conn.execute(sql.SQL("ALTER TABLE {} ADD CHECK (id > 0)").format(sql.SQL(table)))
    sink = PostgresSink(Postgres(postgres.conninfo(), table))
    policy = WritePolicy(BadRowPolicy.DEAD_LETTER, SchemaEvolution.ADD_COLUMNS)
    sink.open(OpenContext(unique.job_id, "postgres", 1, commit_point=True, policy=policy))
    try:
        sink.begin_epoch(0)
        assert sink.write_batch(batch([1, 2])).rows == 2
        # A new column, then a batch whose COPY the check refuses (row 1): the group of
        # batches under the savepoint is written again, the column stays.
        assert sink.write_batch(batch([3], score=pa.array([3.0]))).rows == 1
        later = sink.write_batch(batch([4, -5, 6], score=pa.array([4.0, 5.0, 6.0])))
        assert (later.rows, later.refused.rows) == (2, (1,))
        sink.commit_with_decision(0, sink.pre_commit(0), {"epoch": 0})
    finally:
        sink.close()
    assert rows_of(conn, table) == [
        (1, "n1", None),
        (2, "n2", None),
        (3, "n3", 3.0),
        (4, "n4", 4.0),
        (6, "n6", 6.0),
    ]


def test_an_alter_behind_a_reader_gives_up_after_the_lock_timeout_and_changes_nothing(
    postgres: PostgresEndpoint,
    conn: Conn,
    table: str,
    job_id: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader holding the table (an open transaction that read it) makes the ALTER wait;
    it gives up after the lock timeout with a TransientError, nothing of the epoch written,
    and the epoch succeeds once the reader is gone."""
    monkeypatch.setattr(catalog, "EVOLUTION_LOCK_TIMEOUT_S", 0.3)
    sink = PostgresSink(Postgres(postgres.conninfo(), table))
    coordinator = Coordinator(
        job_id, [sink], LocalDirectoryStore(tmp_path / "store"), one_phase=False, policy=ADD
    )
    coordinator.start()
    new = batch([1], score=pa.array([1.5]))
    with psycopg.connect(postgres.conninfo()) as reader:
        reader.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(table)))  # holds it
        started = time.monotonic()
        with pytest.raises(TransientError, match="lock timeout"):
            coordinator.run_epoch(0, [new])
        assert time.monotonic() - started < 5
        reader.rollback()
    assert columns_of(conn, table) == {"id": "bigint", "name": "text"}
    assert coordinator.run_epoch(0, [new]).outcome is EpochOutcome.COMMITTED
    coordinator.close()
    assert rows_of(conn, table) == [(1, "n1", 1.5)]
