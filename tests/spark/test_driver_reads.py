"""Driver mode's reads (durable_sinks.spark._arrow) on the running pyspark: the socket read
where its probe passes, the public partitions read everywhere, the same Arrow types from
both, and the read a writer chooses."""

from __future__ import annotations

import datetime as dt
import decimal
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks.spark import durable_sink
from durable_sinks.spark._arrow import (
    arrow_schema,
    partition_batches,
    socket_batches,
    socket_read_problem,
    table_of,
)
from tests.services import PostgresEndpoint

from .streams import (
    postgres_ids,
    prepared_transactions,
    run_available_now,
    source_stream,
    write_input,
)

TYPED_SCHEMA = (
    "id LONG, name STRING, amount DECIMAL(12,2), at TIMESTAMP, day DATE, ok BOOLEAN, "
    "raw BINARY, tags ARRAY<STRING>, point STRUCT<x: DOUBLE, y: DOUBLE>, attrs MAP<STRING, INT>"
)


def _typed(spark: Any, rows: int, partitions: int) -> Any:
    at = dt.datetime(2026, 11, 25, 12, 30, 15, 123456, tzinfo=dt.timezone.utc)
    data = [
        (
            i,
            None if i % 7 == 0 else f"name {i}",
            decimal.Decimal(i) / 4,
            at + dt.timedelta(seconds=i),
            dt.date(2026, 1, 1) + dt.timedelta(days=i % 300),
            i % 2 == 0,
            bytes([i % 256]) * 3,
            [f"t{i}", None],
            (float(i), -float(i)),
            {"k": i},
        )
        for i in range(rows)
    ]
    return spark.createDataFrame(data, TYPED_SCHEMA).repartition(partitions)


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by("id")


def test_the_socket_read_serves_classic_pyspark(spark: Any) -> None:
    assert socket_read_problem(spark) is None


def test_both_reads_give_every_row_once_with_to_arrows_types(spark: Any) -> None:
    df = _typed(spark, 500, 3)
    schema = arrow_schema(df)
    socket = pa.Table.from_batches(list(socket_batches(df, job="reads")), schema=schema)
    public = pa.Table.from_batches(list(partition_batches(df)), schema=schema)
    assert socket.num_rows == public.num_rows == 500
    assert _sorted(socket).equals(_sorted(public))
    assert _sorted(table_of(df)).equals(_sorted(public))
    assert pa.types.is_timestamp(schema.field("at").type)
    assert schema.field("at").type.tz == "UTC"


def test_the_partitions_read_skips_empty_partitions_and_reads_an_empty_batch(spark: Any) -> None:
    df = _typed(spark, 3, 6)  # more partitions than rows
    assert sum(b.num_rows for b in partition_batches(df)) == 3
    assert list(partition_batches(df.where("id < 0"))) == []


@pytest.mark.parametrize(
    ("driver_read", "chosen"), [("stream", "socket"), ("partitions", "partitions")]
)
def test_a_writer_logs_the_read_it_chose_and_lands_every_row_once(
    spark: Any,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    driver_read: str,
    chosen: str,
) -> None:
    source, table = tmp_path / "in", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(2):
        write_input(source, f"part-{n}.json", range(n * 100, n * 100 + 100))
    with caplog.at_level(logging.INFO, logger="durable_sinks"):
        writer = durable_sink(
            "postgres",
            dsn=dsn,
            table=table,
            job_id=job_id,
            create_table=True,
            driver_read=driver_read,
        )
    assert writer._read == chosen
    chose = [
        r.getMessage() for r in caplog.records if "driver mode reads batches" in r.getMessage()
    ]
    assert len(chose) == 1, chose
    run_available_now(source_stream(spark, source).repartition(3), writer, tmp_path / "cp")
    assert postgres_ids(dsn, table) == list(range(200))
    assert prepared_transactions(dsn, job_id) == []
