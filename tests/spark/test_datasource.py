"""`df.writeStream.format("durable")`: the Python Data Source API path, in real Spark."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
from psycopg import sql

from durable_sinks.core.errors import ConfigError
from durable_sinks.spark import register_data_source
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.child_process import run_child_report

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


# -- what Spark shows of a job, and a job's second application ------------------------------------
def exposure_run(tmp_path: Path, name: str, **plan: Any) -> dict[str, Any]:
    """tests/spark/exposure_child.py in a process (a Spark application) of its own."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = tmp_path / f"{name}-app"
    (folder / "events").mkdir(parents=True)
    plan = {**plan, "ui_port": port, "event_log": str(folder / "events")}
    result = run_child_report("tests.spark.exposure_child", plan, folder, "plan")
    assert result["exit"] == 0, result["stderr"][-4000:]
    return result


def secret_role(postgres: PostgresEndpoint, pg_schema: str, job_id: str) -> tuple[str, str]:
    """A login role owning `pg_schema`, with a random password; its DSN in URL form (the
    password in the URL: no option name or `password=` there for Spark's redaction to see)."""
    secret = f"pw{uuid.uuid4().hex}"
    role = f"r_{job_id[-12:]}"
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(secret)
            )
        )
        conn.execute(
            sql.SQL("GRANT ALL ON SCHEMA {} TO {}").format(
                sql.Identifier(pg_schema), sql.Identifier(role)
            )
        )
    dsn = f"postgresql://{role}:{secret}@{postgres.host}:{postgres.port}/{postgres.dbname}"
    return f"{dsn}?sslmode=disable", secret


@pytest.mark.parametrize(
    "form",
    [
        "kind",
        # The same redaction through the `sinks` option's JSON: the fault tier's (make
        # test-faults, CI's rotation); one Spark application of ~45 s each.
        pytest.param("sinks", marks=pytest.mark.fault_tier),
    ],
)
def test_spark_shows_no_option_of_a_durable_query(
    postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path, form: str
) -> None:
    """A password in the DSN given as the `dsn` option or inside `sinks` shows nowhere Spark
    shows a query: explain, progress, the UI (its REST API and pages) and the event log.
    Spark's redaction (spark.sql.redaction.options.regex, spark.redaction.regex) never sees
    a URL-form DSN's password; a Python data source's options do not reach any of them."""
    dsn, secret = secret_role(postgres, pg_schema, job_id)
    source = tmp_path / "in"
    write_input(source, "part-0.json", range(20))
    result = exposure_run(
        tmp_path,
        "exposure",
        dsn=dsn,
        table=f"{pg_schema}.events",
        job_id=job_id,
        source=str(source),
        checkpoint=str(tmp_path / "checkpoint"),
        secret=secret,
        form=form,
    )
    assert result["error"] is None, result["error"]
    assert result["controls"] == {"ui environment": True, "event log": True}, result
    assert not any(result["found"].values()), result["found"]
    assert len(result["found"]) == 9
    assert postgres_ids(dsn, f"{pg_schema}.events") == list(range(20))


@pytest.mark.fault_tier  # three Spark applications (~100 s): CI's rotation runs it; the
# refusal and first_epoch in the default suite: test_durable_sink.py, test_connect.py
def test_a_new_checkpoint_in_a_new_application_is_refused_not_a_key_collision(
    postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    """Two Spark applications, one job id: the second with a new checkpoint (a deleted or
    moved one) and new rows. Its tasks write before the driver decides; task attempt ids
    count from 0 in every application, so its parts had the names of the first's committed
    parts, and the marker rows collided: a SchemaMismatchError telling to deduplicate rows.
    Now the parts' names are the attempt's own and the driver refuses the batch
    (EpochOrderError: another stream under the job id); nothing of it lands. Told
    `first_epoch`, the second application continues the job."""
    table = f"{pg_schema}.events"
    dsn = postgres.conninfo()
    first, second = tmp_path / "first", tmp_path / "second"
    write_input(first, "part-0.json", range(20))
    write_input(second, "part-0.json", range(1000, 1020))
    plan = {"dsn": dsn, "table": table, "job_id": job_id, "secret": "-", "form": "kind"}
    ran = exposure_run(
        tmp_path, "first", **plan, source=str(first), checkpoint=str(tmp_path / "ck-first")
    )
    assert ran["error"] is None, ran["error"]
    again = exposure_run(
        tmp_path, "second", **plan, source=str(second), checkpoint=str(tmp_path / "ck-second")
    )
    assert again["error"] is not None
    assert "another query writes under the same job id" in again["error"], again["error"]
    assert "first_epoch=1" in again["error"], again["error"]
    assert postgres_ids(dsn, table) == list(range(20))
    assert prepared_transactions(dsn, job_id) == []
    moved = exposure_run(
        tmp_path,
        "moved",
        **plan,
        source=str(second),
        checkpoint=str(tmp_path / "ck-second"),  # restarted: its refused batch 0 replays
        first_epoch=1,
    )
    assert moved["error"] is None, moved["error"]
    assert postgres_ids(dsn, table) == [*range(20), *range(1000, 1020)]
    assert prepared_transactions(dsn, job_id) == []
