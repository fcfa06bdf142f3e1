"""Schema evolution of the S3 and files sinks read by Spark: an S3 dataset whose epochs gained a
column and widened another, read with `mergeSchema` and with the schema durable-sinks' reader
gives; and a streaming query restarted from its checkpoint with a new column, going on exactly
once into S3 and files.

Spark here has no S3 connector (hadoop-aws needs the AWS SDK bundle, ~690 MB), so Spark reads
the S3 sink's committed objects (those the epoch markers list) byte for byte from a local copy
under the same keys: what is tested is how Spark reads the files the sink wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks import S3, Files
from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.bad_rows import SchemaEvolution, WritePolicy
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import folder as files_reader
from durable_sinks.sinks.s3 import (
    S3Sink,
    committed_dataset,
    committed_markers,
    committed_objects,
    committed_schema,
)
from durable_sinks.spark import durable_sink
from tests.services import S3Endpoint
from tests.support.s3_target import s3_options, s3_sink_config

from .streams import restart_with_a_new_column, s3_committed_ids


def local_copy(s3: S3Endpoint, path: str, into: Path) -> list[str]:
    """The committed objects under `path`, copied to `into` under their keys' relative
    names (`epoch=.../part-....parquet`): the files a Spark reader of the prefix reads."""
    config = s3_sink_config(s3, path)
    prefix = path.removeprefix(f"s3://{s3.bucket}/") + "/"
    client = s3.client()
    files = []
    for listed in committed_objects(path, config.connection):
        local = into / listed.key.removeprefix(prefix)
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(client.get_object(Bucket=s3.bucket, Key=listed.key)["Body"].read())
        files.append(str(local))
    return files


def test_spark_reads_an_evolved_s3_dataset_every_row_once(
    spark: Any, s3: S3Endpoint, s3_prefix: str, tmp_path: Path
) -> None:
    from pyspark.sql.pandas.types import from_arrow_schema

    path = f"s3://{s3.bucket}/{s3_prefix.rstrip('/')}"
    job = Coordinator(
        "job",
        [S3Sink(s3_sink_config(s3, path))],
        LocalDirectoryStore(tmp_path / "store"),
        policy=WritePolicy(schema_evolution=SchemaEvolution.ADD_COLUMNS),
    )
    job.start()
    epochs = [
        {"id": pa.array([0, 1], pa.int64()), "body": ["a", "b"]},
        {"id": [2, 3], "body": ["c", "d"], "extra": ["x", None], "n": pa.array([1, 2], pa.int32())},
        {"id": [4], "n": pa.array([2**40], pa.int64())},  # body and extra missing, n widened
    ]
    for epoch, columns in enumerate(epochs):
        outcome = job.run_epoch(epoch, [pa.record_batch(columns)]).outcome
        assert outcome is EpochOutcome.COMMITTED
    job.close()
    markers = committed_markers(path, s3_sink_config(s3, path).connection)
    assert [getattr(m.schema(), "names", None) for m in markers] == [
        ["id", "body"],
        ["id", "body", "extra", "n"],
        ["id", "body", "extra", "n"],  # the new object keeps what earlier epochs added
    ]
    files = local_copy(s3, path, tmp_path / "copy")

    # mergeSchema merges new columns: epochs 0 and 1 read as one table.
    early = spark.read.option("mergeSchema", "true").parquet(*files[:2])
    assert sorted(tuple(r) for r in early.select("id", "body", "extra", "n").collect()) == [
        (0, "a", None, None),
        (1, "b", None, None),
        (2, "c", "x", 1),
        (3, "d", None, 2),
    ]
    # ... but not an int32 column with an int64 one: Spark readers give the read schema.
    with pytest.raises(Exception, match="CANNOT_MERGE_SCHEMAS"):  # py4j's error, in classic Spark
        spark.read.option("mergeSchema", "true").parquet(*files).collect()
    schema = committed_schema(path, s3_sink_config(s3, path).connection)
    assert schema is not None
    whole = spark.read.schema(from_arrow_schema(schema)).parquet(*files)
    assert sorted(tuple(r) for r in whole.select("id", "body", "extra", "n").collect()) == [
        (0, "a", None, None),
        (1, "b", None, None),
        (2, "c", "x", 1),
        (3, "d", None, 2),
        (4, None, None, 2**40),
    ]


def test_a_query_restarted_with_a_new_column_goes_on_exactly_once_into_s3_and_files(
    spark: Any, s3: S3Endpoint, s3_prefix: str, job_id: str, tmp_path: Path
) -> None:
    source, checkpoint, out = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "out"
    s3_path = f"s3://{s3.bucket}/{s3_prefix.rstrip('/')}"

    def writer() -> Any:
        return durable_sink(
            [S3(**s3_options(s3, s3_path)), Files(path=str(out))],
            job_id=job_id,
            decision_store=str(tmp_path / "decisions"),
            schema_evolution="add_columns",
        )

    restart_with_a_new_column(spark, source, checkpoint, writer)
    assert s3_committed_ids(s3, s3_path) == list(range(20))
    table = files_reader.committed_dataset(out).to_table().sort_by("id")
    assert table.column("id").to_pylist() == list(range(20))
    extra = [None] * 10 + [f"e{i}" for i in range(10, 20)]
    assert table.column("extra").to_pylist() == extra
    s3_table = committed_dataset(s3_path, s3_sink_config(s3, s3_path).connection).to_table()
    assert s3_table.sort_by("id").column("extra").to_pylist() == extra
