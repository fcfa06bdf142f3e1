"""One-phase commit: a job whose only sink is Postgres commits each epoch in one transaction
that carries the decision in its marker row (no PREPARE, no decision-store write). Against the
test bed's real Postgres."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core import OpenContext
from durable_sinks.core.errors import EpochOrderError, FencedError, TransientError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint
from tests.support.targets import prepared_gids


@pytest.fixture
def table(conn: psycopg.Connection[Any], pg_schema: str) -> str:
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, name text NOT NULL)").format(
            sql.Identifier(pg_schema, "events")
        )
    )
    return f"{pg_schema}.events"


def ids(conn: psycopg.Connection[Any], table: str) -> list[int]:
    schema, name = table.split(".")
    query = sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(schema, name))
    return [int(r[0]) for r in conn.execute(query).fetchall()]


def batch(*keys: int) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(keys, pa.int64()), "name": pa.array([f"n{k}" for k in keys])}
    )


def coordinator(
    postgres: PostgresEndpoint, table: str, job_id: str, store: Path, **options: Any
) -> Coordinator:
    sink = PostgresSink(Postgres(postgres.conninfo(), table))
    options.setdefault("source", "query-1")  # one stream: its replays are replays
    return Coordinator(job_id, [sink], LocalDirectoryStore(store), **options)


def test_an_epoch_is_one_transaction_carrying_its_decision(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Path
) -> None:
    prepared_at_steps: list[int] = []

    def watch(step: str) -> None:
        prepared_at_steps.append(len(prepared_gids(conn, unique.job_id, "postgres")))

    job = coordinator(postgres, table, unique.job_id, tmp_path, on_step=watch)
    job.start()
    result = job.run_epoch(0, [batch(1, 2), batch(3)])
    assert result.outcome is EpochOutcome.COMMITTED
    assert ids(conn, table) == [1, 2, 3]
    assert len(prepared_at_steps) > 5
    assert set(prepared_at_steps) == {0}  # never prepared
    assert job.store.get(0) is None  # the store only fences generations
    assert job.decision(0) == result.decision
    schema = table.split(".")[0]
    carried = conn.execute(
        sql.SQL("SELECT decision FROM {} WHERE job_id = %s").format(
            sql.Identifier(schema, "durable_sinks_epochs")
        ),
        (unique.job_id,),
    ).fetchone()
    assert carried is not None
    assert json.loads(carried[0])["handles"][0]["rows"] == 3

    # Spark replays the batch (same or other data): recognised, nothing changes; also after a
    # restart, which finds the decision in the marker row.
    assert job.run_epoch(0, [batch(9)]).outcome is EpochOutcome.ALREADY_COMMITTED
    job.close()
    again = coordinator(postgres, table, unique.job_id, tmp_path)
    again.start()
    assert again.run_epoch(0, [batch(9)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert again.run_epoch(1, [batch(4)]).outcome is EpochOutcome.COMMITTED
    assert ids(conn, table) == [1, 2, 3, 4]
    again.close()


def test_with_one_phase_off_the_epoch_is_prepared_and_decided_in_the_store(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Path
) -> None:
    prepared: dict[str, list[str]] = {}

    def watch(step: str) -> None:
        prepared[step] = prepared_gids(conn, unique.job_id, "postgres")

    job = coordinator(postgres, table, unique.job_id, tmp_path, one_phase=False, on_step=watch)
    job.start()
    result = job.run_epoch(0, [batch(1)])
    assert len(prepared["after-pre-commit:postgres"]) == 1
    assert prepared["after-finish"] == []
    assert job.store.get(0) == result.decision
    job.close()


def test_a_crash_before_the_commit_leaves_nothing_and_the_replay_lands_once(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Path
) -> None:
    job = coordinator(postgres, table, unique.job_id, tmp_path)
    job.start()
    steps = job.epoch_steps(0, [batch(1, 2)])
    while next(steps) != "after-pre-commit:postgres":
        pass  # then the driver dies: the open transaction is never committed
    assert ids(conn, table) == []
    restarted = coordinator(postgres, table, unique.job_id, tmp_path)
    restarted.start()  # ends the dead driver's session: its transaction rolls back
    assert restarted.run_epoch(0, [batch(1, 2)]).outcome is EpochOutcome.COMMITTED
    assert ids(conn, table) == [1, 2]
    with pytest.raises(FencedError):
        for _ in steps:  # the old driver wakes up: it cannot commit
            pass
    assert ids(conn, table) == [1, 2]
    assert prepared_gids(conn, unique.job_id, "postgres") == []
    restarted.close()


def test_a_session_lost_before_the_commit_fails_the_epoch_cleanly(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Path
) -> None:
    job = coordinator(postgres, table, unique.job_id, tmp_path)
    job.start()
    sink = job.sinks[0]
    assert isinstance(sink, PostgresSink)

    def kill_session(step: str) -> None:
        if step == "after-pre-commit:postgres" and sink._tx is not None:
            conn.execute("SELECT pg_terminate_backend(%s)", (sink._tx.info.backend_pid,))

    job.on_step = kill_session
    with pytest.raises(TransientError, match="connection"):
        job.run_epoch(0, [batch(1)])
    assert ids(conn, table) == []
    job.on_step = None
    assert job.run_epoch(0, [batch(1)]).outcome is EpochOutcome.COMMITTED  # Spark's retry
    assert ids(conn, table) == [1]
    job.close()


def test_a_marker_table_from_before_one_phase_gains_the_decision_column(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Path
) -> None:
    schema = table.split(".")[0]
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (job_id text NOT NULL, sink text NOT NULL, epoch bigint NOT NULL, "
            "part text NOT NULL, participant text NOT NULL, rows bigint NOT NULL, "
            "checksum text NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), "
            "PRIMARY KEY (job_id, sink, epoch, part))"
        ).format(sql.Identifier(schema, "durable_sinks_epochs"))
    )
    job = coordinator(postgres, table, unique.job_id, tmp_path)
    job.start()
    assert job.run_epoch(0, [batch(5)]).outcome is EpochOutcome.COMMITTED
    assert job.decision(0) is not None
    job.close()


def test_an_old_generation_cannot_commit_after_a_new_one_opened(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames
) -> None:
    config = Postgres(postgres.conninfo(), table)
    old, new = PostgresSink(config), PostgresSink(config)
    old.open(OpenContext(unique.job_id, "postgres", 1, commit_point=True))
    old.begin_epoch(0)
    old.write_batch(batch(7))
    handle = old.pre_commit(0)
    new.open(OpenContext(unique.job_id, "postgres", 2, commit_point=True))
    with pytest.raises(FencedError):
        old.commit_with_decision(0, handle, {"epoch": 0})
    assert ids(conn, table) == []
    assert new.read_decision(0) is None
    old.close()
    new.close()


def test_one_phase_needs_no_prepared_transactions(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Path
) -> None:
    """Postgres ships with max_prepared_transactions = 0: a lone sink works anyway."""
    sink = PostgresSink(Postgres(postgres.conninfo(), table, participants_in_flight=100_000))
    job = Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path))
    job.start()
    assert job.run_epoch(0, [batch(1)]).outcome is EpochOutcome.COMMITTED
    job.close()


def test_a_new_stream_continues_a_one_phase_job_after_its_marker_rows(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Path
) -> None:
    """The decisions are the marker rows: a stream new to the job is checked against the
    newest one (refused at batch 0, naming first_epoch=2), and continues the job with it."""
    first = coordinator(postgres, table, unique.job_id, tmp_path)
    first.start()
    first.run_epoch(0, [batch(1)])
    first.run_epoch(1, [batch(2)])
    first.close()
    refused = coordinator(postgres, table, unique.job_id, tmp_path, source="query-2")
    refused.start()
    with pytest.raises(EpochOrderError, match="first_epoch=2"):
        refused.run_epoch(0, [batch(10)])
    refused.close()
    moved = coordinator(postgres, table, unique.job_id, tmp_path, source="query-2", first_epoch=2)
    moved.start()
    assert moved.run_epoch(2, [batch(10)]).outcome is EpochOutcome.COMMITTED
    moved.close()
    assert ids(conn, table) == [1, 2, 10]
