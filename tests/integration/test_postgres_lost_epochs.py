"""Committed epochs the Postgres sink's server lost, against the test bed's Postgres (and
Kafka): found at the next start, and put back by `durable-sinks repair-epochs`, either copied
from the old server's data (two databases of the bed's server stand in for the old primary
and the asynchronous standby promoted in its place) or recorded as lost after the rows were
re-supplied."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from durable_sinks import CommittedEpochLostError
from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.spark import sink
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.operator_cli import repair_epochs, write_job_file
from tests.support.targets import prepared_gids


def rows(start: int, count: int) -> pa.RecordBatch:
    ids = range(start, start + count)
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "note": [f"r{i}" for i in ids]})


def ids(conn: psycopg.Connection[Any], table: sql.Composable) -> list[int]:
    query = sql.SQL("SELECT id FROM {} ORDER BY id").format(table)
    return [int(r[0]) for r in conn.execute(query).fetchall()]


def test_rows_and_marker_deleted_behind_a_job_stop_its_start_until_the_loss_is_recorded(
    tmp_path: Path,
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    conn: psycopg.Connection[Any],
    pg_schema: str,
    job_id: str,
    kafka_topic: str,
) -> None:
    table = sql.Identifier(pg_schema, "events")
    store = tmp_path / "decisions"
    specs = [
        sink("postgres", dsn=postgres.conninfo(), table=f"{pg_schema}.events", create_table=True),
        sink("kafka", bootstrap_servers=kafka.bootstrap_servers, topic=kafka_topic),
    ]

    def coordinator() -> Coordinator:
        return Coordinator(job_id, [s.build() for s in specs], LocalDirectoryStore(store))

    def started() -> Coordinator:
        made = coordinator()
        made.start()
        return made

    first = started()
    for epoch in range(2):
        first.run_epoch(epoch, [rows(epoch * 10, 10)])
    first.close()
    # Epoch 1's rows and marker row vanish (as after a failover to a lagging standby).
    conn.execute(sql.SQL("DELETE FROM {} WHERE id >= 10").format(table))
    markers = sql.Identifier(pg_schema, "durable_sinks_epochs")
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE job_id = %s AND epoch = 1").format(markers), (job_id,)
    )

    refused = coordinator()
    with pytest.raises(CommittedEpochLostError, match="holds epochs up to 0 only") as raised:
        refused.start()
    refused.close()
    assert (raised.value.sink, raised.value.first_lost, raised.value.last_lost) == (
        "postgres",
        1,
        1,
    )

    # The operator re-supplies epoch 1's rows from the source, then records the loss.
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT i, 'r' || i FROM generate_series(10, 19) i").format(table)
    )
    settings = {
        "job_id": job_id,
        "decision_store": str(store),
        "sinks": [
            {"kind": "postgres", "dsn": "${env:PG}", "table": f"{pg_schema}.events"},
            {"kind": "kafka", "bootstrap_servers": kafka.bootstrap_servers, "topic": kafka_topic},
        ],
    }
    job_file = write_job_file(tmp_path, settings)
    env = {"PG": postgres.conninfo()}
    recorded = repair_epochs(
        job_file,
        job_id,
        env,
        "--record-loss",
        "--through",
        "1",
        "--note",
        "restored by ops from the source",
        "--apply",
    )
    assert recorded.exit_code == 0, recorded.output
    assert "recorded as lost (restored by ops from the source)" in recorded.output

    again = started()
    assert again.run_epoch(2, [rows(20, 10)]).outcome is EpochOutcome.COMMITTED
    again.close()
    assert ids(conn, table) == list(range(30))


@pytest.fixture
def old_and_new(postgres: PostgresEndpoint, unique: UniqueNames) -> Iterator[tuple[str, str]]:
    """Two databases' names: the old primary's and the standby promoted in its place."""
    names = (unique.name("old"), unique.name("new"))
    yield names
    for name in names:
        with psycopg.connect(postgres.conninfo(dbname=name), autocommit=True) as db:
            for (gid,) in db.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
            ).fetchall():
                db.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    with psycopg.connect(postgres.conninfo(), autocommit=True) as admin:
        for name in names:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_lost_epochs_are_copied_from_the_old_primarys_data(
    mode: str,
    tmp_path: Path,
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    job_id: str,
    old_and_new: tuple[str, str],
) -> None:
    old, new = old_and_new
    keyed: dict[str, Any] = {"mode": "upsert", "key": ["id"]} if mode == "upsert" else {}
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(old)))
    store = tmp_path / "decisions"
    table = sql.Identifier("public", "events")

    def job(dbname: str) -> Coordinator:
        specs = [
            sink(
                "postgres",
                dsn=postgres.conninfo(dbname=dbname),
                table="public.events",
                create_table=True,
                **keyed,
            ),
            sink("files", path=str(tmp_path / "files")),
        ]
        return Coordinator(job_id, [s.build() for s in specs], LocalDirectoryStore(store))

    first = job(old)
    first.start()
    first.run_epoch(0, [rows(0, 10)])
    first.close()
    # The standby's copy: it received epoch 0 only.
    conn.execute(
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(new), sql.Identifier(old))
    )
    second = job(old)
    second.start()
    second.run_epoch(1, [rows(10, 10)])
    # Upsert: epoch 2 writes keys 15..19 of epoch 1 again (copied once, their last version).
    second.run_epoch(2, [rows(15, 15) if keyed else rows(20, 10)])
    steps = second.epoch_steps(3, [rows(30, 10)])
    for step in steps:
        if step == "after-decision":
            break  # the old primary dies: epoch 3 decided, its transaction left prepared
    steps.close()
    second.close()

    # Failover: the job now writes to the promoted standby, which lost epochs 1 and 2 and
    # epoch 3's prepared transaction. Epoch 3 is decided but not finished: the start leaves
    # it to the replay (whose COMMIT PREPARED would find the participant lost; not run here:
    # the bed's two databases share one server's prepared transactions).
    promoted = job(new)
    with pytest.raises(CommittedEpochLostError):
        promoted.start()
    promoted.close()

    settings = {
        "job_id": job_id,
        "decision_store": str(store),
        "sinks": [
            {"kind": "postgres", "dsn": "${env:PG}", "table": "public.events", **keyed},
            {"kind": "files", "path": str(tmp_path / "files")},
        ],
    }
    job_file = write_job_file(tmp_path, settings)
    env = {"PG": postgres.conninfo(dbname=new), "OLD": postgres.conninfo(dbname=old)}
    dry = repair_epochs(job_file, job_id, env, "--from", "${env:OLD}")
    assert dry.exit_code == 0, dry.output
    assert "would repair 3 epoch(s)" in dry.output
    assert "commit prepared transaction" in dry.output
    with psycopg.connect(postgres.conninfo(dbname=new)) as standby:
        assert ids(standby, table) == list(range(10))  # a dry run changes nothing

    applied = repair_epochs(job_file, job_id, env, "--from", "${env:OLD}", "--apply")
    assert applied.exit_code == 0, applied.output
    assert "repaired 3 epoch(s)" in applied.output
    with psycopg.connect(postgres.conninfo(dbname=new)) as standby:
        assert ids(standby, table) == list(range(40))
    with psycopg.connect(postgres.conninfo(dbname=old), autocommit=True) as primary:
        assert prepared_gids(primary, job_id, "postgres") == []

    resumed = job(new)
    resumed.start()
    assert resumed.run_epoch(3, [rows(30, 10)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert resumed.run_epoch(4, [rows(40, 10)]).outcome is EpochOutcome.COMMITTED
    resumed.close()
    with psycopg.connect(postgres.conninfo(dbname=new)) as standby:
        assert ids(standby, table) == list(range(50))
    again = repair_epochs(job_file, job_id, env, "--from", "${env:OLD}")
    assert "would repair 0 epoch(s)" in again.output
