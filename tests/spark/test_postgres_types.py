"""Typed Postgres columns through `durable_sink` with real Spark DataFrames: a Spark
`decimal(10,2)` into `numeric(10,2)` and a `string` into `varchar(10)` land with their values;
a wider scale is refused naming the Spark cast; a table in a missing schema is refused when the
writer is built, before any query starts."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import functions

from durable_sinks.core.errors import ConfigError, SchemaMismatchError
from durable_sinks.spark import durable_sink
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint

from .streams import prepared_transactions


def test_spark_decimals_and_strings_land_in_typed_columns(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    dsn, table = postgres.conninfo(), f"{pg_schema}.orders"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{pg_schema}".orders '
            "(id bigint PRIMARY KEY, amount numeric(10,2), name varchar(10))"
        )
    df = spark.createDataFrame(
        [(1, Decimal("12345678.91"), "ten chars!"), (2, Decimal("-0.05"), "ü")],
        "id long, amount decimal(10,2), name string",
    )
    writer = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id)
    writer(df, 0)

    wider = df.withColumn("id", functions.col("id") + 10).withColumn(
        "amount", functions.col("amount").cast("decimal(12,4)")
    )
    with pytest.raises(SchemaMismatchError) as raised:
        writer(wider, 1)
    assert "numeric(10,2) in the table but the batch has Arrow decimal128(12, 4)" in str(
        raised.value
    )
    assert 'col("amount").cast("decimal(10,2)")' in (raised.value.fix or "")

    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(f'SELECT * FROM "{pg_schema}".orders ORDER BY id').fetchall()
    assert found == [(1, Decimal("12345678.91"), "ten chars!"), (2, Decimal("-0.05"), "ü")]
    assert prepared_transactions(dsn, job_id) == []


def test_a_table_in_a_missing_schema_is_refused_when_the_writer_is_built(
    postgres: PostgresEndpoint, unique: UniqueNames, job_id: str
) -> None:
    missing = unique.name("nosuch")
    with pytest.raises(ConfigError) as raised:
        durable_sink(
            "postgres",
            dsn=postgres.conninfo(),
            table=f"{missing}.events",
            job_id=job_id,
            create_table=True,
        )
    assert f"schema '{missing}'" in raised.value.message
    assert "does not exist" in raised.value.message
    assert f"CREATE SCHEMA {missing}" in (raised.value.fix or "")
    assert postgres.password not in str(raised.value)
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        assert (
            conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (missing,)).fetchone()
            is None
        )
