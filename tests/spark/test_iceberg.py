"""`durable_sink("iceberg", ...)` in a real Spark streaming query (driver mode), with Postgres
in one job: each batch lands in both once, a replayed batch changes nothing, a restarted query
goes on. The table is read back with pyiceberg and with Spark's own Iceberg reader (Java's
Iceberg library, in the pyspark 4.1 interpreter of tests/services/iceberg_spark.py: its runtime
has no build for the main lane's Spark), which must see every row exactly once too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_sinks.coordinator import EpochOutcome
from durable_sinks.sinks.iceberg.layout import Layout
from durable_sinks.spark import durable_sink, sink
from tests.services import PostgresEndpoint, Testbed
from tests.support.iceberg_spark_reader import read_with_spark
from tests.support.iceberg_target import IcebergCatalog

from .streams import (
    postgres_ids,
    prepared_transactions,
    run_available_now,
    source_stream,
    write_input,
)


@pytest.fixture
def catalog(postgres: PostgresEndpoint, tmp_path: Path) -> Iterator[IcebergCatalog]:
    made = IcebergCatalog(postgres, tmp_path)
    made.create_namespace()
    try:
        yield made
    finally:
        made.drop()


def test_iceberg_and_postgres_in_one_job_land_each_batch_once(
    spark: Any,
    testbed: Testbed,
    postgres: PostgresEndpoint,
    pg_schema: str,
    catalog: IcebergCatalog,
    job_id: str,
    tmp_path: Path,
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(3):
        write_input(source, f"part-{n}.json", range(n * 20, n * 20 + 20))

    def writer_() -> Any:
        return durable_sink(
            [
                sink("postgres", dsn=dsn, table=table, create_table=True),
                sink("iceberg", **catalog.sink_options(create_table=True)),
            ],
            job_id=job_id,
        )

    writer = writer_()
    run_available_now(source_stream(spark, source), writer, checkpoint)
    assert sorted(r["id"] for r in catalog.rows()) == list(range(60))
    replayed = spark.read.schema("id LONG, body STRING").json(str(source / "part-1.json"))
    writer(replayed, 1)
    assert writer.last_result.outcome is EpochOutcome.ALREADY_COMMITTED
    write_input(source, "part-3.json", range(60, 80))
    run_available_now(source_stream(spark, source), writer_(), checkpoint)
    assert sorted(r["id"] for r in catalog.rows()) == list(range(80))
    assert postgres_ids(dsn, table) == list(range(80))
    assert prepared_transactions(dsn, job_id) == []
    loaded = catalog.catalog().load_table(("ds", "events"))
    assert loaded.properties[Layout(job_id, "iceberg").epoch_property] == "3"

    # Java's Iceberg, through Spark's catalog on the same SQL catalog: the same rows, each
    # once, the same data files, and one snapshot per epoch, each naming its epoch.
    read = read_with_spark(
        testbed, catalog.name, catalog.properties(), ("ds", "events"), tmp_path / "spark-read"
    )
    assert sorted(read.column("id")) == list(range(80))
    assert sorted(read.data_files) == sorted(t.file.file_path for t in loaded.scan().plan_files())
    epochs = [s["durable-sinks.epoch"] for s in read.snapshots if "durable-sinks.epoch" in s]
    assert epochs == ["0", "1", "2", "3"]
    # No data file in the warehouse that the current snapshot does not hold.
    assert catalog.data_files() == sorted(Path(f.removeprefix("file://")) for f in read.data_files)


def test_a_table_the_job_partitions_is_pruned_by_sparks_reader(
    spark: Any, testbed: Testbed, catalog: IcebergCatalog, job_id: str, tmp_path: Path
) -> None:
    """`partition_by` with a bucket transform (pyiceberg-core computes the buckets): a filter
    on the column is pushed into Spark's Iceberg scan (Java's bucket function), which reads
    only the files of the row's bucket and finds the row."""
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    for n in range(2):
        write_input(source, f"part-{n}.json", range(n * 20, n * 20 + 20))
    options = catalog.sink_options(create_table=True, partition_by=("bucket(4, id)",))
    writer = durable_sink(
        [sink("iceberg", **options)], job_id=job_id, decision_store=str(tmp_path / "decisions")
    )
    run_available_now(source_stream(spark, source), writer, checkpoint)
    loaded = catalog.catalog().load_table(("ds", "events"))
    assert [str(f.transform) for f in loaded.spec().fields] == ["bucket[4]"]
    every = list(loaded.scan().plan_files())
    seven = list(loaded.scan(row_filter="id == 7").plan_files())
    assert 0 < len(seven) < len(every)
    assert sorted(r["id"] for r in catalog.rows()) == list(range(40))
    # One read by Spark: were Java's buckets not pyiceberg-core's, the row's file would be
    # pruned and the read empty.
    pruned = read_with_spark(
        testbed,
        catalog.name,
        catalog.properties(),
        ("ds", "events"),
        tmp_path / "where",
        where="id = 7",
    )
    assert pruned.column("id") == [7]
    # The filter is pushed into Iceberg's scan (`IcebergScan(... filters=id IS NOT NULL,
    # id = 7 ...)`), which plans only the files whose partition can hold the row.
    scans = [line for line in pruned.plan.splitlines() if "IcebergScan(" in line]
    assert len(scans) == 1, pruned.plan
    assert "id = 7" in scans[0].split("filters=", 1)[1], pruned.plan
