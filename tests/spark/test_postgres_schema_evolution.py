"""A streaming query into Postgres restarted from its checkpoint with a new column: with
schema_evolution="add_columns" the column is added with the first epoch that has it, and the
query goes on exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from durable_sinks.coordinator import EpochOutcome
from durable_sinks.spark import durable_sink
from tests.services import PostgresEndpoint

from .streams import (
    postgres_ids,
    prepared_transactions,
    run_available_now,
    source_stream,
    write_input,
)


def test_a_restarted_query_with_a_new_column_adds_it_and_goes_on_exactly_once(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    from pyspark.sql.functions import col

    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(2):
        write_input(source, f"part-{n}.json", range(n * 10, n * 10 + 10))
    first = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id, create_table=True)
    run_available_now(source_stream(spark, source), first, checkpoint)
    assert postgres_ids(dsn, table) == list(range(20))

    # The query is changed (a new column) and restarted from the same checkpoint.
    for n in range(2, 4):
        write_input(source, f"part-{n}.json", range(n * 10, n * 10 + 10))
    changed = source_stream(spark, source).withColumn("score", col("id") * 0.5)
    restarted = durable_sink(
        "postgres", dsn=dsn, table=table, job_id=job_id, schema_evolution="add_columns"
    )
    run_available_now(changed, restarted, checkpoint)
    assert restarted.last_result is not None
    assert restarted.last_result.epoch == 3
    # Spark replays the last batch (its commit log entry was lost): nothing is written again.
    replayed = spark.read.schema("id LONG, body STRING").json(str(source / "part-3.json"))
    restarted(replayed.withColumn("score", col("id") * 0.5), 3)
    assert restarted.last_result.outcome is EpochOutcome.ALREADY_COMMITTED

    assert postgres_ids(dsn, table) == list(range(40))  # each row once
    schema, name = table.split(".")
    with psycopg.connect(dsn) as conn:
        scores = conn.execute(
            sql.SQL("SELECT id, score FROM {} ORDER BY id").format(sql.Identifier(schema, name))
        ).fetchall()
    assert scores == [(i, None if i < 20 else i * 0.5) for i in range(40)]
    assert prepared_transactions(dsn, job_id) == []
