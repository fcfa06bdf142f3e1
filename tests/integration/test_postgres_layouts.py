"""The layouts of the tables durable-sinks creates in Postgres carry their version in the
table's comment (core/formats.py, clients/postgres.py): the Postgres sink's marker and fence
tables and the Postgres decision store's tables. Tables of the previous release (no comment)
are read as version 1; a newer version is refused at the start, naming the table, before
anything is written."""

from __future__ import annotations

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.errors import StoredFormatError
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint

TABLES = {
    "durable_sinks_epochs": "Postgres marker table",
    "durable_sinks_fences": "Postgres fence table",
    "durable_sinks_generations": "Postgres decision store generations table",
    "durable_sinks_decisions": "Postgres decision store decisions table",
}


def coordinator(postgres: PostgresEndpoint, schema: str, job: str) -> Coordinator:
    sink = PostgresSink(Postgres(postgres.conninfo(), f"{schema}.events", create_table=True))
    return Coordinator(job, [sink], PostgresDecisionStore(postgres.conninfo(), schema=schema))


def run(postgres: PostgresEndpoint, schema: str, job: str, epoch: int) -> EpochOutcome:
    job_coordinator = coordinator(postgres, schema, job)
    try:
        job_coordinator.start()
        batch = pa.record_batch({"id": pa.array([epoch], pa.int64())})
        return job_coordinator.run_epoch(epoch, [batch]).outcome
    finally:
        job_coordinator.close()


def comments(conn: psycopg.Connection[object], schema: str) -> dict[str, str | None]:
    return {
        table: conn.execute(
            "SELECT obj_description(%s::regclass, 'pg_class')",
            (sql.Identifier(schema, table).as_string(conn),),
        ).fetchone()[0]  # type: ignore[index]
        for table in TABLES
    }


def comment(conn: psycopg.Connection[object], schema: str, table: str, text: str | None) -> None:
    conn.execute(
        sql.SQL("COMMENT ON TABLE {} IS {}").format(
            sql.Identifier(schema, table), sql.Literal(text)
        )
    )


def test_tables_carry_their_layout_version_and_the_previous_releases_are_read(
    postgres: PostgresEndpoint, pg_schema: str, unique: UniqueNames
) -> None:
    assert run(postgres, pg_schema, unique.job_id, 0) == EpochOutcome.COMMITTED
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        assert comments(conn, pg_schema) == {
            table: f"durable-sinks {name}, version 1" for table, name in TABLES.items()
        }
        for table in TABLES:  # as the previous release left them
            comment(conn, pg_schema, table, None)
    assert run(postgres, pg_schema, unique.job_id, 1) == EpochOutcome.COMMITTED


@pytest.mark.parametrize("table", list(TABLES))
def test_a_table_of_a_newer_layout_is_refused_before_anything_is_written(
    postgres: PostgresEndpoint, pg_schema: str, unique: UniqueNames, table: str
) -> None:
    assert run(postgres, pg_schema, unique.job_id, 0) == EpochOutcome.COMMITTED
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        comment(conn, pg_schema, table, f"durable-sinks {TABLES[table]}, version 2")
    with pytest.raises(StoredFormatError) as raised:
        run(postgres, pg_schema, unique.job_id, 1)
    assert f'table "{pg_schema}"."{table}"' in raised.value.message
    assert f"{TABLES[table]} version 2 was written by a newer release" in raised.value.message
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        ids = conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(pg_schema, "events")))
        assert [r[0] for r in ids] == [0]
