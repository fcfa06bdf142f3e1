"""Column names come from the DataFrame, i.e. from whoever wrote the query or the data's
schema: hostile ones (quotes, semicolons, SQL, Unicode, NUL, very long) reach Postgres only
quoted. Each batch is either refused before anything is written, or lands in a table whose
columns carry exactly those names, while a canary table beside it survives every attempt."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg import sql

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.errors import DurableSinkError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.services import PostgresEndpoint
from tests.unit.test_hostile_names import KNOWN_BAD

COLUMN = st.one_of(st.sampled_from([n for n in KNOWN_BAD if n]), st.text(min_size=1, max_size=70))


def tables(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> set[str]:
    found = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))
    return {str(row[0]) for row in found.fetchall()}


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(names=st.lists(COLUMN, min_size=1, max_size=3, unique=True))
@example(names=["x" * 64])
@example(names=["x" * 63 + "a", "x" * 63 + "b"])
@example(names=["a\x00b"])
@example(names=['x"; DROP TABLE canary; --'])
def test_hostile_column_names_are_quoted_or_refused(
    names: list[str], postgres: PostgresEndpoint, pg_schema: str, tmp_path: Path
) -> None:
    job = f"hostile-{uuid.uuid4().hex[:10]}"
    table = f"events_{uuid.uuid4().hex[:8]}"
    batch = pa.record_batch({n: pa.array([i, i + 1], pa.int64()) for i, n in enumerate(names)})
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (x int)").format(
                sql.Identifier(pg_schema, "canary")
            )
        )
        before = tables(conn, pg_schema)
    sink = PostgresSink(Postgres(postgres.conninfo(), f"{pg_schema}.{table}", create_table=True))
    coordinator = Coordinator(job, [sink], LocalDirectoryStore(tmp_path / job))
    try:
        coordinator.start()
        refusal: DurableSinkError | None = None
        try:
            outcome = coordinator.run_epoch(0, [batch]).outcome
        except DurableSinkError as refused:
            outcome, refusal = None, refused
        if os.environ.get("DS_SHOW_HOSTILE"):
            print(repr(names), "->", outcome or f"refused: {refusal}")
    finally:
        coordinator.close()
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        now = tables(conn, pg_schema)
        assert "canary" in now, "the canary table is gone"
        made = now - before - {"durable_sinks_epochs", "durable_sinks_fences"}
        if outcome is None:
            assert refusal is not None
            assert refusal.fix, f"refused without a fix: {refusal}"
            assert made == set(), f"a refused batch left tables behind: {made}"
            return
        assert outcome is EpochOutcome.COMMITTED
        assert made == {table}, made
        columns = conn.execute(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (f'"{pg_schema}"."{table}"',),
        ).fetchall()
        assert [c[0] for c in columns] == names
        rows = conn.execute(
            sql.SQL("SELECT {} FROM {} ORDER BY 1").format(
                sql.SQL(", ").join(map(sql.Identifier, names)), sql.Identifier(pg_schema, table)
            )
        ).fetchall()
        assert rows == sorted(
            tuple(batch.column(i)[r].as_py() for i in range(len(names))) for r in range(2)
        )
