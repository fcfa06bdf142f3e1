"""`df.writeStream.format("durable")`: the Python Data Source API path, in real Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from durable_sinks.core.errors import ConfigError
from durable_sinks.spark import register_data_source
from tests.services import KafkaEndpoint, PostgresEndpoint

from .streams import postgres_ids, prepared_transactions, source_stream, write_input


def run(stream: Any, checkpoint: Path, **options: str) -> None:
    writer = stream.writeStream.format("durable")
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    assert query.awaitTermination(240), "the query did not finish in 240 s"
    error = query.exception()
    if error is not None:
        raise error


def _has_data_source_api() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyspark.sql.datasource") is not None


def test_format_durable_works_or_names_the_pyspark_it_needs(spark: Any) -> None:
    """pyspark 4.x registers the data source; 3.5 (no Python Data Source API) refuses with
    the version it needs and the foreachBatch way instead."""
    import pyspark

    if _has_data_source_api():
        register_data_source(spark)
        assert pyspark.__version__ >= "4"
        return
    with pytest.raises(
        ConfigError, match=r"pyspark 4\.0 or newer\); this is pyspark 3\.5"
    ) as raised:
        register_data_source(spark)
    assert "foreachBatch(durable_sink(...))" in str(raised.value)


def test_postgres_and_files_through_the_data_source_exactly_once_across_a_restart(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    register_data_source(spark)
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    for n in range(2):
        write_input(source, f"part-{n}.json", range(n * 50, n * 50 + 50))
    sinks = json.dumps(
        [
            {"kind": "postgres", "dsn": dsn, "table": table, "create_table": True},
            {"kind": "files", "path": str(tmp_path / "out")},
        ]
    )
    run(source_stream(spark, source).repartition(3), checkpoint, job_id=job_id, sinks=sinks)
    write_input(source, "part-2.json", range(100, 150))
    run(source_stream(spark, source).repartition(3), checkpoint, job_id=job_id, sinks=sinks)

    assert postgres_ids(dsn, table) == list(range(150))
    files = pq.read_table(tmp_path / "out", columns=["id"]).column("id").to_pylist()
    assert sorted(files) == list(range(150))
    assert prepared_transactions(dsn, job_id) == []


def test_one_sink_by_kind_and_string_options(
    spark: Any, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    register_data_source(spark)
    source, table = tmp_path / "in", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    write_input(source, "part-0.json", range(30))
    run(
        source_stream(spark, source),
        tmp_path / "checkpoint",
        kind="postgres",
        job_id=job_id,
        dsn=dsn,
        table=table,
        create_table="true",
    )
    assert postgres_ids(dsn, table) == list(range(30))


def test_kafka_through_the_data_source_is_refused_with_the_reason(
    spark: Any, kafka: KafkaEndpoint, kafka_topic: str, job_id: str, tmp_path: Path
) -> None:
    register_data_source(spark)
    source = tmp_path / "in"
    write_input(source, "part-0.json", range(3))
    with pytest.raises(Exception, match="distributed_prepare"):
        run(
            source_stream(spark, source),
            tmp_path / "checkpoint",
            kind="kafka",
            job_id=job_id,
            bootstrap_servers=kafka.bootstrap_servers,
            topic=kafka_topic,
            decision_store=str(tmp_path / "decisions"),
        )
