"""`durable_sink("delta", ...)` in real Spark streaming queries: alone and in one job with
Postgres and Kafka (driver mode), and merging by key from the executors (executor mode). The
tables are read back with Spark's own Delta reader (delta-spark from Maven Central, on the
test bed's classpath: tests/services/maven/spark-extras.xml; reading by path needs no session
extension), and the log's JSON with Spark's JSON reader for the job's application transaction
versions and the commits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from durable_sinks.coordinator import EpochOutcome
from durable_sinks.spark import durable_sink, sink
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.delta_target import folder_leftovers, log_epochs

from .streams import (
    kafka_ids,
    postgres_ids,
    prepared_transactions,
    restart_with_a_new_column,
    run_available_now,
    source_stream,
    write_input,
)


def spark_rows(spark: Any, path: Path) -> list[tuple[int, str]]:
    """The table as Spark's Delta reader sees it."""
    rows = spark.read.format("delta").load(str(path)).select("id", "body").collect()
    return sorted((int(r["id"]), str(r["body"])) for r in rows)


def spark_transactions(spark: Any, path: Path) -> dict[str, int]:
    """The application transactions of the table's log (appId -> highest version), read with
    Spark from the log's JSON commits."""
    log = spark.read.json(str(path / "_delta_log" / "*.json"))
    found: dict[str, int] = {}
    for row in log.where("txn is not null").select("txn.appId", "txn.version").collect():
        found[row["appId"]] = max(found.get(row["appId"], -1), int(row["version"]))
    return found


def spark_commits(spark: Any, path: Path) -> list[str]:
    """The operation of each commit in the log (DESCRIBE HISTORY would need Delta's session
    extension and catalog on the shared session; the log's JSON says the same)."""
    log = spark.read.json(str(path / "_delta_log" / "*.json"))
    return [
        r["operation"]
        for r in log.where("commitInfo is not null").select("commitInfo.operation").collect()
    ]


def test_delta_postgres_and_kafka_in_one_job_land_each_batch_once(
    spark: Any,
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    kafka_topic: str,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    delta = tmp_path / "lake" / "events"
    dsn = postgres.conninfo()
    for n in range(3):
        write_input(source, f"part-{n}.json", range(n * 20, n * 20 + 20))

    def writer_() -> Any:
        return durable_sink(
            [
                sink("postgres", dsn=dsn, table=table, create_table=True),
                sink("delta", path=str(delta), create_table=True),
                sink("kafka", bootstrap_servers=kafka.bootstrap_servers, topic=kafka_topic),
            ],
            job_id=job_id,
        )

    writer = writer_()
    run_available_now(source_stream(spark, source), writer, checkpoint)
    expected = [(i, f"row {i}") for i in range(60)]
    assert spark_rows(spark, delta) == expected
    assert spark_transactions(spark, delta) == {f"durable-sinks:{job_id}:delta": 2}
    # One commit per epoch (the first created the table).
    assert spark_commits(spark, delta) == ["CREATE TABLE", "WRITE", "WRITE"]

    # A replayed batch changes nothing; a restarted query goes on.
    replayed = spark.read.schema("id LONG, body STRING").json(str(source / "part-1.json"))
    writer(replayed, 1)
    assert writer.last_result.outcome is EpochOutcome.ALREADY_COMMITTED
    write_input(source, "part-3.json", range(60, 80))
    restarted = writer_()
    run_available_now(source_stream(spark, source), restarted, checkpoint)
    expected = [(i, f"row {i}") for i in range(80)]
    assert spark_rows(spark, delta) == expected
    assert postgres_ids(dsn, table) == list(range(80))
    assert kafka_ids(kafka, kafka_topic) == list(range(80))
    assert spark_transactions(spark, delta) == {f"durable-sinks:{job_id}:delta": 3}
    assert log_epochs(delta) == [0, 1, 2, 3]
    assert folder_leftovers(delta) == []
    assert prepared_transactions(dsn, job_id) == []


def test_executor_mode_merges_by_key_with_one_commit_per_batch(
    spark: Any, job_id: str, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    delta = tmp_path / "lake" / "latest"
    # Batches 0-2 hold ids 0-29, 15-44, 30-59: batches 1 and 2 update half of their ids.
    for n in range(3):
        write_input(source, f"part-{n}.json", range(n * 15, n * 15 + 30))
    writer = durable_sink(
        "delta",
        path=str(delta),
        mode="upsert",
        key="id",
        create_table=True,
        job_id=job_id,
        execution="executor",
        decision_store=str(tmp_path / "decisions"),  # a Delta sink hosts none
    )
    run_available_now(source_stream(spark, source).repartition(3), writer, checkpoint)
    assert spark_rows(spark, delta) == [(i, f"row {i}") for i in range(60)]
    assert spark_transactions(spark, delta) == {f"durable-sinks:{job_id}:delta": 2}
    assert log_epochs(delta) == [0, 1, 2]
    result = writer.last_result
    assert result is not None
    # Three tasks wrote the batch; the driver committed it once.
    assert len(result.decision.handles_for("delta")) == 3
    assert sorted(spark_commits(spark, delta)) == ["MERGE", "MERGE", "WRITE"]
    assert folder_leftovers(delta) == []


def test_spark_reads_a_table_whose_epochs_added_a_column(spark: Any, tmp_path: Path) -> None:
    """schema_evolution='add_columns' on a partitioned table: Spark's Delta reader sees the
    added column, null in the rows written before it."""
    import pyarrow as pa

    from durable_sinks.coordinator import Coordinator
    from durable_sinks.core.bad_rows import SchemaEvolution, WritePolicy
    from durable_sinks.manifest import LocalDirectoryStore
    from durable_sinks.sinks import create

    path = tmp_path / "evolved"
    coordinator = Coordinator(
        "spark-reads-evolved",
        [create("delta", {"path": str(path), "create_table": True, "partition_by": ["day"]})],
        LocalDirectoryStore(tmp_path / "store"),
        policy=WritePolicy(schema_evolution=SchemaEvolution.ADD_COLUMNS),
    )
    coordinator.start()
    coordinator.run_epoch(0, [pa.record_batch({"id": [1], "day": ["a"]})])
    coordinator.run_epoch(1, [pa.record_batch({"id": [2], "day": ["b"], "score": [2.5]})])
    coordinator.close()
    frame = spark.read.format("delta").load(str(path))
    assert frame.columns == ["id", "day", "score"]
    rows = sorted((r["id"], r["day"], r["score"]) for r in frame.collect())
    assert rows == [(1, "a", None), (2, "b", 2.5)]


def test_a_query_restarted_with_a_new_column_goes_on_exactly_once_into_delta(
    spark: Any, job_id: str, tmp_path: Path
) -> None:
    """A Delta-alone job (its decisions in the table's folder), schema_evolution='add_columns':
    the query changed to carry a new column and restarted from its checkpoint writes its next
    epochs once, and Spark's Delta reader sees every row once, the new column null before."""
    source, checkpoint, path = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "table"

    def writer() -> Any:
        return durable_sink(
            "delta",
            path=str(path),
            create_table=True,
            job_id=job_id,
            schema_evolution="add_columns",
        )

    restart_with_a_new_column(spark, source, checkpoint, writer)

    frame = spark.read.format("delta").load(str(path))
    assert frame.columns == ["id", "body", "extra"]
    found = sorted((r["id"], r["extra"]) for r in frame.collect())
    assert found == [(i, None if i < 10 else f"e{i}") for i in range(20)]
    assert sorted(set(log_epochs(path))) == [0, 1, 2, 3]
