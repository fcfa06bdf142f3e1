"""`durable_sink` through Spark Connect: the client is a separate process with a remote session
(tests/spark/connect_child.py, as a user's script), foreachBatch runs on the test bed's real
Spark Connect server, the sinks are the test bed's Postgres and Kafka, and what landed is read
as their readers would (committed rows; a read_committed consumer).

The server-kill tests use a Connect server of their own (the `killable_connect` fixture): it is
the driver, and it is SIGKILLed in the middle of a batch, then started again.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pyspark
import pytest
from psycopg import sql

from durable_sinks.manifest import DecisionRecord
from tests.services import KafkaEndpoint, PostgresEndpoint, Testbed
from tests.support.child_process import run_child_report, start_child

from .streams import (
    kafka_ids,
    kafka_open_transactions,
    postgres_ids,
    prepared_transactions,
    write_input,
)

ROOT = Path(__file__).resolve().parents[2]
#: Up to pyspark 4.2 a Connect foreachBatch runs on the session that started the query, where
#: the query is active; from 4.3 it runs on a clone of that session, which sees no query.
PYSPARK = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
CONNECT_BATCH_SEES_QUERY = PYSPARK < (4, 3)
#: pyspark 3.5's Connect client learns that a query failed (STREAM_FAILED) but not why: the
#: cause is in the Connect server's log, where the writer logs every failed batch at ERROR.
CONNECT_CLIENT_SEES_CAUSE = PYSPARK >= (4, 0)


def failure_text(report: dict[str, Any], testbed: Testbed, job_id: str) -> str:
    """Why the client's query failed: its error, or (pyspark 3.5) the server's log lines of
    the job."""
    if CONNECT_CLIENT_SEES_CAUSE:
        return str(report["error"])
    lines = testbed.connect.log.read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if job_id in line)


def run_client(plan: dict[str, Any], folder: Path, name: str, timeout: float = 300) -> Any:
    """Run the client script with `plan`; its report (the query's error or None, its id)."""
    return run_child_report("tests.spark.connect_child", plan, folder, name, timeout)


def decisions(dsn: str, schema: str, job_id: str) -> dict[int, DecisionRecord]:
    """The job's decisions in the decision store the Postgres sink's database hosts."""
    table = sql.Identifier(schema, "durable_sinks_decisions")
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT epoch, record FROM {} WHERE job_id = %s").format(table), (job_id,)
        ).fetchall()
    return {int(e): DecisionRecord.from_bytes(bytes(r), source=f"epoch {e}") for e, r in rows}


def postgres_sink(dsn: str, table: str) -> dict[str, Any]:
    """The Postgres sink's options in a plan (the table created with the first batch)."""
    return {"kind": "postgres", "dsn": dsn, "table": table, "create_table": True}


def write_inputs(folder: Path, files: int, rows_per_file: int) -> None:
    """`files` source files of consecutive ids, `rows_per_file` each (one per batch)."""
    for n in range(files):
        write_input(folder, f"part-{n}.json", range(n * rows_per_file, (n + 1) * rows_per_file))


def second_sink(execution: str, kafka: KafkaEndpoint, topic: str, out: Path) -> dict[str, Any]:
    """Kafka in driver mode; in executor mode, where Kafka cannot prepare (it is refused at
    validation), the files sink."""
    if execution == "executor":
        return {"kind": "files", "path": str(out)}
    return {"kind": "kafka", "bootstrap_servers": kafka.bootstrap_servers, "topic": topic}


def second_ids(execution: str, kafka: KafkaEndpoint, topic: str, out: Path) -> list[int]:
    """What the second sink's readers see: a read_committed consumer, or the committed files."""
    if execution == "executor":
        return sorted(pq.read_table(out, columns=["id"]).column("id").to_pylist())
    return kafka_ids(kafka, topic)


def _plan(url: str, tmp_path: Path, job_id: str, sinks: list[dict[str, Any]], **job: Any) -> Any:
    """A client's plan. Where a Connect batch cannot see its query (pyspark 4.3), the job
    is told its checkpoint, as the docs tell users to (docs/guide.md)."""
    if not CONNECT_BATCH_SEES_QUERY:
        job.setdefault("checkpoint_location", str(tmp_path / "checkpoint"))
    return {
        "url": url,
        "source": str(tmp_path / "in"),
        "checkpoint": str(tmp_path / "checkpoint"),
        "job_id": job_id,
        "sinks": sinks,
        "job": job,
    }


def test_postgres_alone_lands_every_row_once_across_a_restart_from_the_checkpoint(
    spark_connect: str, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    dsn, table = postgres.conninfo(), f"{pg_schema}.events"
    write_inputs(tmp_path / "in", files=3, rows_per_file=10)
    pg = postgres_sink(dsn, table)
    plan = _plan(spark_connect, tmp_path, job_id, [pg])

    first = run_client(plan, tmp_path, "first")
    assert first["error"] is None, first["error"]
    assert postgres_ids(dsn, table) == list(range(30))

    # The query restarted from the same checkpoint (a new client, a new server-side copy of
    # the writer) goes on with batch 3.
    write_input(tmp_path / "in", "part-3.json", range(30, 40))
    second = run_client(plan, tmp_path, "second")
    assert second["error"] is None, second["error"]
    assert postgres_ids(dsn, table) == list(range(40))
    assert prepared_transactions(dsn, job_id) == []
    assert first["query_id"] == second["query_id"]


@pytest.mark.parametrize(
    ("execution", "guarantee"),
    [("driver", "exactly_once"), ("executor", "exactly_once"), ("driver", "at_least_once")],
)
def test_postgres_and_a_second_sink_commit_each_batch_once_from_the_server(
    spark_connect: str,
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    kafka_topic: str,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    execution: str,
    guarantee: str,
) -> None:
    dsn, table, out = postgres.conninfo(), f"{pg_schema}.events", tmp_path / "out"
    write_inputs(tmp_path / "in", files=4, rows_per_file=25)
    second = second_sink(execution, kafka, kafka_topic, out)
    sinks = [postgres_sink(dsn, table), second]
    plan = _plan(spark_connect, tmp_path, job_id, sinks, execution=execution, guarantee=guarantee)
    plan["files_per_batch"] = 2
    plan["repartition"] = 3 if execution == "executor" else 0

    report = run_client(plan, tmp_path, "run")
    assert report["error"] is None, report["error"]
    assert postgres_ids(dsn, table) == list(range(100))
    assert second_ids(execution, kafka, kafka_topic, out) == list(range(100))
    assert prepared_transactions(dsn, job_id) == []
    if execution == "driver":
        assert kafka_open_transactions(kafka, kafka_topic, f"{kafka_topic}-ds-progress") == []
    if guarantee == "exactly_once":
        decided = decisions(dsn, pg_schema, job_id)
        assert sorted(decided) == [0, 1]
        rows = {"postgres": 50, second["kind"]: 50}
        assert all(d.rows() == rows for d in decided.values())
        # Found through the batch's session (Connect has no local properties) where the
        # batch's session sees the query, read from the checkpoint otherwise.
        assert {d.source for d in decided.values()} == {report["query_id"]}
        parts = {h.participant for d in decided.values() for h in d.handles_for("postgres")}
        assert len(parts) == (6 if execution == "executor" else 2)  # per partition and batch


def test_the_durable_data_source_writes_through_a_remote_session(
    spark_connect: str, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    dsn, table = postgres.conninfo(), f"{pg_schema}.events"
    write_inputs(tmp_path / "in", files=2, rows_per_file=10)
    pg = postgres_sink(dsn, table)
    plan = {**_plan(spark_connect, tmp_path, job_id, [pg]), "via": "format"}
    report = run_client(plan, tmp_path, "run")
    assert report["error"] is None, report["error"]
    assert postgres_ids(dsn, table) == list(range(20))
    assert prepared_transactions(dsn, job_id) == []


def test_a_server_with_another_version_refuses_at_the_first_batch_before_writing(
    spark_connect: str,
    testbed: Testbed,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
) -> None:
    dsn, table = postgres.conninfo(), f"{pg_schema}.events"
    write_input(tmp_path / "in", "part-0.json", range(10))
    pg = postgres_sink(dsn, table)
    plan = {**_plan(spark_connect, tmp_path, job_id, [pg]), "version": "0.0.0+client"}
    report = run_client(plan, tmp_path, "run")
    assert report["exit"] == 1
    assert report["error"] is not None
    error = failure_text(report, testbed, job_id)
    assert "ConfigError" in error
    assert "the client that started the query has 0.0.0+client" in error
    assert "Fix: install durable-sinks==0.0.0+client" in error
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
    assert found == (None,)  # the table is created with the first batch: none was written
    assert prepared_transactions(dsn, job_id) == []


def test_a_sink_nobody_reaches_is_warned_on_the_client_and_fails_the_first_batch(
    spark_connect: str,
    testbed: Testbed,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
) -> None:
    """A server the client cannot reach may be reachable from the Connect server: the client
    warns and goes on; the server's first batch checks and fails before writing anything."""
    write_input(tmp_path / "in", "part-0.json", range(10))
    closed = postgres.conninfo().replace(f"port='{postgres.port}'", "port='1'")
    assert closed != postgres.conninfo()
    pg = {"kind": "postgres", "dsn": closed, "table": f"{pg_schema}.events"}
    plan = _plan(spark_connect, tmp_path, job_id, [pg], decision_store=str(tmp_path / "decisions"))
    plan["job"]["outage_tolerance_s"] = 0
    report = run_client(plan, tmp_path, "run")
    assert "Spark Connect: not reachable from this client" in report["stderr"]
    assert report["exit"] == 1
    error = failure_text(report, testbed, job_id)
    assert "UnreachableError" in error
    assert "127.0.0.1:1" in error or "port 1" in error
    assert postgres.password not in error + report["error"] + report["stderr"]


@pytest.mark.parametrize(
    "execution",
    [
        "driver",
        # The fault tier's (make test-faults, CI's rotation), as the other Connect variants;
        # classic Spark's executor mode stays in the default suite (test_durable_sink.py).
        pytest.param("executor", marks=pytest.mark.fault_tier),
    ],
)
@pytest.mark.fault_tier  # (~37 s) classic Spark's restart from a new checkpoint, both modes,
# stays in the default suite (test_durable_sink.py)
def test_a_job_restarted_from_a_new_checkpoint_beside_another_query_loses_no_row(
    spark_connect: str,
    testbed: Testbed,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    execution: str,
) -> None:
    """Two queries in one Connect session: the job's batch cannot see which query runs it.
    Told its checkpoint, the job knows its query; restarted from a new checkpoint on new rows
    under the same job id (its batch ids start again at 0), it fails typed, naming the fix,
    and never takes the new batches for replays of the decided ones (which would drop them);
    told `first_epoch`, it continues the job. Not told its checkpoint, it refuses its first
    batch, nothing written."""
    dsn, table = postgres.conninfo(), f"{pg_schema}.events"
    checkpoint = tmp_path / "checkpoint"
    write_inputs(tmp_path / "in", files=3, rows_per_file=10)
    # two-phase (decisions in the store's table, where the test reads their stream) in both
    told = {"execution": execution, "checkpoint_location": str(checkpoint), "one_phase": False}
    plan = {
        **_plan(spark_connect, tmp_path, job_id, [postgres_sink(dsn, table)], **told),
        "companion": True,
    }
    first = run_client(plan, tmp_path, "first")
    assert first["error"] is None, first["error"]
    assert postgres_ids(dsn, table) == list(range(30))
    assert {d.source for d in decisions(dsn, pg_schema, job_id).values()} == {first["query_id"]}

    # The checkpoint is deleted and the job restarted on new rows, same job id.
    shutil.rmtree(checkpoint)
    shutil.rmtree(tmp_path / "in")
    write_inputs(tmp_path / "in", files=2, rows_per_file=1000)
    restarted = run_client(plan, tmp_path, "restarted")
    assert restarted["exit"] == 1
    assert restarted["query_id"] != first["query_id"]
    error = failure_text(restarted, testbed, job_id)
    assert "EpochOrderError" in error
    newest = max(decisions(dsn, pg_schema, job_id))
    assert f"first_epoch={newest + 1}" in error
    assert postgres_ids(dsn, table) == list(range(30))  # nothing of the new stream written

    # Told where it starts, the restarted query continues the job (its batch 0 replayed).
    moved = run_client({**plan, "job": {**plan["job"], "first_epoch": newest + 1}}, tmp_path, "m")
    assert moved["error"] is None, moved["error"]
    both = sorted([*range(30), *range(2000)])  # each stream's rows once (they share ids)
    assert postgres_ids(dsn, table) == both

    # Not told its checkpoint: it cannot tell, so it refuses before writing.
    shutil.rmtree(checkpoint)
    del plan["job"]["checkpoint_location"]
    untold = run_client(plan, tmp_path, "untold")
    assert untold["exit"] == 1
    error = failure_text(untold, testbed, job_id)
    assert "ConfigError" in error
    assert "checkpoint_location=" in error
    assert postgres_ids(dsn, table) == both
    assert prepared_transactions(dsn, job_id) == []


@pytest.mark.parametrize(
    ("execution", "step"),
    [
        ("driver", "after-decision"),
        # The fault tier's (make test-faults, CI's rotation): one kill here; executor mode
        # under Connect stays in the default suite without a kill
        # (test_postgres_and_a_second_sink_commit_each_batch_once_from_the_server), and
        # classic Spark's executor-mode kills in tests/spark/test_crash.py.
        pytest.param("driver", "after-write", marks=pytest.mark.fault_tier),
        pytest.param("executor", "after-decision", marks=pytest.mark.fault_tier),
    ],
)
def test_the_connect_server_killed_mid_batch_then_restarted_lands_every_record_once(
    killable_connect: Any,
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    kafka_topic: str,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    execution: str,
    step: str,
) -> None:
    dsn, table, out = postgres.conninfo(), f"{pg_schema}.events", tmp_path / "out"
    write_inputs(tmp_path / "in", files=4, rows_per_file=20)
    second = second_sink(execution, kafka, kafka_topic, out)
    sinks = [postgres_sink(dsn, table), second]
    plan = _plan(killable_connect.url, tmp_path, job_id, sinks, execution=execution)
    plan["repartition"] = 2 if execution == "executor" else 0
    flag = tmp_path / "paused"
    plan["pause"] = {"epoch": 2, "step": step, "flag": str(flag)}

    client, log = start_child("tests.spark.connect_child", plan, tmp_path, "killed")
    try:
        deadline = time.monotonic() + 240
        while not flag.exists():
            assert client.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the batch never reached the kill point"
            time.sleep(0.2)
        assert flag.read_text().startswith(step)
        killable_connect.kill()  # the driver dies mid-batch
        client.wait(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
    reports = [line for line in log.read_text().splitlines() if line.startswith('{"error"')]
    assert reports, log.read_text()[-4000:]
    assert json.loads(reports[-1])["error"] is not None  # the client saw its driver die
    assert len(postgres_ids(dsn, table)) == 40  # batches 0 and 1 only (two files)
    # Decided before the kill: Postgres's part is prepared, for the restart to commit. Killed
    # while writing: nothing prepared (the open transaction died with its connection).
    in_doubt = prepared_transactions(dsn, job_id)
    assert bool(in_doubt) == (step == "after-decision"), in_doubt

    killable_connect.up()
    plan.pop("pause")
    report = run_client(plan, tmp_path, "restarted")
    assert report["error"] is None, report["error"]
    assert postgres_ids(dsn, table) == list(range(80))
    assert second_ids(execution, kafka, kafka_topic, out) == list(range(80))
    assert prepared_transactions(dsn, job_id) == []
    if execution == "driver":
        assert kafka_open_transactions(kafka, kafka_topic, f"{kafka_topic}-ds-progress") == []
    decided = decisions(dsn, pg_schema, job_id)
    assert sorted(decided) == [0, 1, 2, 3]
    assert sum(d.rows()["postgres"] for d in decided.values()) == 80


def _event_sizes(server: Any) -> dict[Path, int]:
    return {path: path.stat().st_size for path in server.events.rglob("*") if path.is_file()}


def _events_since(server: Any, sizes: dict[Path, int]) -> list[dict[str, Any]]:
    """The server's Spark events logged after `sizes` (_event_sizes) was taken."""
    events: list[dict[str, Any]] = []
    for path in sorted(p for p in server.events.rglob("*") if p.is_file()):
        with path.open("rb") as log:
            log.seek(sizes.get(path, 0))
            events.extend(json.loads(line) for line in log.read().splitlines() if line.strip())
    return events


def cache_events(events: list[dict[str, Any]]) -> list[str]:
    """Every sign of cached data among Spark's events: an RDD whose storage level keeps it in
    memory or on disk when its stage ran, and each unpersist."""
    found = []
    for event in events:
        kind = event.get("Event", "")
        if kind == "SparkListenerUnpersistRDD":
            found.append(f"unpersist RDD {event.get('RDD ID')}")
        for rdd in event.get("Stage Info", {}).get("RDD Info", []):
            level = rdd.get("Storage Level", {})
            if level.get("Use Memory") or level.get("Use Disk"):
                found.append(f"{kind}: RDD {rdd.get('RDD ID')} {rdd.get('Name')!r} {level}")
    return found


@pytest.mark.parametrize(("driver_read", "caches"), [(None, False), ("chunked", True)])
def test_driver_mode_under_connect_caches_nothing_unless_asked(
    killable_connect: Any,
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    kafka_topic: str,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    driver_read: str | None,
    caches: bool,
) -> None:
    """Serverless Spark refuses cache(): by default no batch is persisted under Connect (read
    partition by partition), and every batch lands once. Asked for `driver_read="chunked"`,
    the batches are persisted: the server's event log shows it (the check can fail)."""
    dsn, table = postgres.conninfo(), f"{pg_schema}.events"
    write_inputs(tmp_path / "in", files=3, rows_per_file=40)
    job = {} if driver_read is None else {"driver_read": driver_read}
    sinks = [postgres_sink(dsn, table), second_sink("driver", kafka, kafka_topic, tmp_path)]
    plan = _plan(killable_connect.url, tmp_path, job_id, sinks, **job)
    plan["repartition"] = 3
    before = _event_sizes(killable_connect)
    report = run_client(plan, tmp_path, "run")
    assert report["error"] is None, report["error"]
    assert postgres_ids(dsn, table) == list(range(120))
    assert kafka_ids(kafka, kafka_topic) == list(range(120))
    assert prepared_transactions(dsn, job_id) == []
    events = _events_since(killable_connect, before)
    assert any(e.get("Event") == "SparkListenerStageCompleted" for e in events), (
        f"the server at {killable_connect.url} logged no stage: is its event log on "
        f"({killable_connect.events})?"
    )
    found = cache_events(events)
    assert bool(found) == caches, found
