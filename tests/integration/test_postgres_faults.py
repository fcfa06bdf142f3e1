"""Postgres rides through lost sessions: the job's sessions are ended (`pg_terminate_backend`,
found by their application_name, as an operator or a restart of the server would end them)
at every protocol step of a real Coordinator, with a Postgres sink and a Postgres decision
store. What comes out is always a retriable DurableSinkError (never a psycopg error), and a
new coordinator, built as the ride-through loop builds one (close the old, new sinks and
store, start, replay the same epoch with the same data), lands the epoch exactly once, leaves
no prepared transaction, and commits the next epoch.

Two jobs: two-phase (the Postgres sink and a files sink, decisions in Postgres) and
one-phase (the Postgres sink alone: its commit carries the decision; the store only fences).
A second group ends the session *during* the statements whose outcome that leaves unknown
(PREPARE TRANSACTION, the one-phase COMMIT, the store's put): InDoubtError.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg import sql

from durable_sinks.coordinator import Coordinator, EpochOutcome, RetryPolicy
from durable_sinks.core import SinkConnector
from durable_sinks.core.errors import DurableSinkError, InDoubtError
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint
from tests.support.targets import prepared_gids

#: Fast retries of phase-2 commits (the default waits up to a minute in all).
QUICK_RETRY = RetryPolicy(attempts=3, tolerance_s=5, first_wait_s=0.01, max_wait_s=0.05)
EPOCH_0 = ((1, 2), (3,))  # two batches

TWO_PHASE_STEPS = [
    "recovery:after-fence",
    "recovery:after-open:pg",
    "recovery:after-open:files",
    "epoch-start",
    "after-begin:pg",
    "after-begin:files",
    "after-write:0:pg",
    "after-write:0:files",
    "after-write:1:files",
    "after-pre-commit:pg",
    "after-pre-commit:files",
    "after-decision",
    "after-commit:pg",
    "after-commit:files",
    "after-finish",
]
ONE_PHASE_STEPS = [
    "recovery:after-fence",
    "recovery:after-open:pg",
    "epoch-start",
    "after-begin:pg",
    "after-write:0:pg",
    "after-write:1:pg",
    "after-pre-commit:pg",
    "after-decision",
    "after-finish",
]


def batch(*keys: int) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(keys, pa.int64()), "name": pa.array([f"n{k}" for k in keys])}
    )


def epoch_0() -> list[pa.RecordBatch]:
    return [batch(*keys) for keys in EPOCH_0]


class Job:
    """One job's configuration: builds coordinators the way the ride-through loop does
    (new sinks, new store, new sessions each time) and reads what landed."""

    def __init__(
        self,
        postgres: PostgresEndpoint,
        schema: str,
        job_id: str,
        files: Path | None,
    ) -> None:
        self.postgres = postgres
        self.dsn = postgres.conninfo()
        self.schema = schema
        self.job_id = job_id
        self.files = files

    @classmethod
    def of(
        cls, kind: str, postgres: PostgresEndpoint, schema: str, job_id: str, tmp_path: Path
    ) -> Job:
        """A "two-phase" job (Postgres + a files sink under `tmp_path`) or a "one-phase" one
        (Postgres alone)."""
        return cls(postgres, schema, job_id, tmp_path / "files" if kind == "two-phase" else None)

    def coordinator(self, on_step: Callable[[str], None] | None = None) -> Coordinator:
        sinks: list[SinkConnector] = [
            PostgresSink(Postgres(self.dsn, f"{self.schema}.events", name="pg"))
        ]
        if self.files is not None:
            sinks.append(FolderSink(Files(str(self.files), name="files", fsync=False)))
        store = PostgresDecisionStore(self.dsn, schema=self.schema)
        return Coordinator(self.job_id, sinks, store, commit_retry=QUICK_RETRY, on_step=on_step)

    def ids(self, conn: psycopg.Connection[Any]) -> list[int]:
        query = sql.SQL("SELECT id FROM {} ORDER BY id").format(
            sql.Identifier(self.schema, "events")
        )
        return [int(r[0]) for r in conn.execute(query).fetchall()]

    def markers(self, conn: psycopg.Connection[Any]) -> dict[int, int]:
        """Marker rows per epoch of the Postgres sink."""
        query = sql.SQL(
            "SELECT epoch, count(*) FROM {} WHERE job_id = %s AND sink = 'pg' GROUP BY epoch"
        ).format(sql.Identifier(self.schema, "durable_sinks_epochs"))
        return {int(e): int(n) for e, n in conn.execute(query, (self.job_id,)).fetchall()}

    def file_ids(self) -> list[int]:
        assert self.files is not None
        found: list[int] = []
        for file in sorted(self.files.glob("epoch=*/part=*/*.parquet")):
            found.extend(pq.read_table(file).column("id").to_pylist())
        return sorted(found)


def terminate(conn: psycopg.Connection[Any], job_id: str, query_like: str = "%") -> int:
    """End the job's sessions (sinks' and store's: application_name `ds:<job>:...`) whose
    current or last statement matches `query_like`; wait until each has gone."""
    rows = conn.execute(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
        "WHERE starts_with(application_name, %s) AND query ILIKE %s AND pid <> pg_backend_pid()",
        (f"ds:{job_id}:", query_like),
    ).fetchall()
    return len(rows)


def check_error(error: BaseException | None, postgres: PostgresEndpoint) -> None:
    """What the failed coordinator raised (if anything) is retriable and ours."""
    if error is None:
        return
    assert isinstance(error, DurableSinkError), f"untranslated: {type(error)!r}: {error}"
    assert error.retriable, f"not retriable: {error!r}"
    assert postgres.password not in str(error)


def ride_through(job: Job, conn: psycopg.Connection[Any], old: Coordinator) -> None:
    """What the ride-through loop does after a retriable error: close the old coordinator
    (its sessions may be dead: close must not raise), build a new one, replay epoch 0 with
    the same data; then check it landed once everywhere and that the next epoch commits."""
    old.close()
    new = job.coordinator()
    try:
        new.start()
        replay = new.run_epoch(0, epoch_0())
        assert replay.outcome in (EpochOutcome.COMMITTED, EpochOutcome.ALREADY_COMMITTED)
        assert new.run_epoch(1, [batch(4)]).outcome is EpochOutcome.COMMITTED
        assert job.ids(conn) == [1, 2, 3, 4]
        assert job.markers(conn) == {0: 1, 1: 1}
        if job.files is not None:
            assert job.file_ids() == [1, 2, 3, 4]
            assert new.store.get(0) is not None
        assert prepared_gids(conn, job.job_id, "pg") == []
    finally:
        new.close()


@pytest.fixture
def events(conn: psycopg.Connection[Any], pg_schema: str) -> str:
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, name text NOT NULL)").format(
            sql.Identifier(pg_schema, "events")
        )
    )
    return pg_schema


@pytest.fixture
def short_job(unique: UniqueNames) -> str:
    """A job id short enough to stay whole in application_name."""
    return f"flt{unique.token}"


@pytest.fixture(params=["two-phase", "one-phase"])
def job(
    request: pytest.FixtureRequest,
    postgres: PostgresEndpoint,
    events: str,
    short_job: str,
    tmp_path: Path,
) -> Job:
    return Job.of(request.param, postgres, events, short_job, tmp_path)


def _steps() -> Iterator[Any]:
    for step in TWO_PHASE_STEPS:
        yield pytest.param("two-phase", step, id=f"two-phase-{step}")
    for step in ONE_PHASE_STEPS:
        yield pytest.param("one-phase", step, id=f"one-phase-{step}")


@pytest.mark.parametrize(("kind", "step"), list(_steps()))
def test_sessions_ended_at_a_step_give_a_retriable_error_and_the_replay_lands_once(
    kind: str,
    step: str,
    postgres: PostgresEndpoint,
    events: str,
    short_job: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    job = Job.of(kind, postgres, events, short_job, tmp_path)
    ended: list[int] = []

    def end_sessions(at: str) -> None:
        if at == step:
            ended.append(terminate(conn, job.job_id))

    old = job.coordinator(on_step=end_sessions)
    error: BaseException | None = None
    try:
        old.start()
        old.run_epoch(0, epoch_0())
    except Exception as exc:  # noqa: BLE001 - checked below: it must be ours and retriable
        error = exc
    assert ended, f"{step} never came"
    assert ended[0] >= 1, f"no session of {job.job_id} found at {step}"
    check_error(error, postgres)
    ride_through(job, conn, old)


def test_recovery_interrupted_by_lost_sessions_is_finished_by_the_next_coordinator(
    job: Job, conn: psycopg.Connection[Any], postgres: PostgresEndpoint
) -> None:
    """A coordinator dies after preparing epoch 0 (two-phase: a prepared transaction is
    left); the next one loses its sessions while it recovers; the one after that finishes."""
    crashed = job.coordinator()
    crashed.start()
    steps = crashed.epoch_steps(0, epoch_0())
    while next(steps) != "after-pre-commit:pg":
        pass  # the driver dies here: nothing is closed or rolled back
    ended: list[int] = []

    def end_sessions(at: str) -> None:
        if at.startswith("recovery:after-open:pg") and not ended:
            ended.append(terminate(conn, job.job_id))

    recovering = job.coordinator(on_step=end_sessions)
    error: BaseException | None = None
    try:
        recovering.start()
        recovering.run_epoch(0, epoch_0())
    except Exception as exc:  # noqa: BLE001 - checked below
        error = exc
    assert ended
    assert ended[0] >= 1
    check_error(error, postgres)
    steps.close()
    crashed.close()
    ride_through(job, conn, recovering)


# -- during the statements whose outcome a lost session leaves unknown -----------------------


def end_during(
    postgres: PostgresEndpoint, job_id: str, query_like: str, ended: list[int]
) -> threading.Thread:
    """A thread that ends the job's session as soon as it runs a statement matching
    `query_like` (for at most 10 s)."""

    def watch() -> None:
        with psycopg.connect(postgres.conninfo(), autocommit=True) as watcher:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                found = watcher.execute(
                    "SELECT pid FROM pg_stat_activity WHERE starts_with(application_name, %s) "
                    "AND state = 'active' AND query ILIKE %s",
                    (f"ds:{job_id}:", query_like),
                ).fetchall()
                if found:
                    for (pid,) in found:
                        watcher.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
                    ended.append(len(found))
                    return
                time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def slow_commits(conn: psycopg.Connection[Any], schema: str) -> None:
    """A deferred constraint trigger that sleeps per row: it runs at PREPARE TRANSACTION or
    COMMIT, so those statements take long enough to be interrupted."""
    conn.execute(
        sql.SQL(
            "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$"
        ).format(sql.Identifier(schema, "slow"))
    )
    conn.execute(
        sql.SQL(
            "CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON {} DEFERRABLE INITIALLY DEFERRED "
            "FOR EACH ROW EXECUTE FUNCTION {}()"
        ).format(sql.Identifier(schema, "events"), sql.Identifier(schema, "slow"))
    )


@pytest.mark.parametrize(
    ("kind", "statement"),
    [
        ("two-phase", "PREPARE TRANSACTION%"),
        ("one-phase", "COMMIT"),
        ("two-phase", "SELECT generation % FOR SHARE"),  # the store's put
    ],
    ids=["prepare", "one-phase-commit", "store-put"],
)
def test_a_session_lost_during_a_statement_of_unknown_outcome_is_in_doubt(
    kind: str,
    statement: str,
    postgres: PostgresEndpoint,
    events: str,
    short_job: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    job = Job.of(kind, postgres, events, short_job, tmp_path)
    old = job.coordinator()
    old.start()
    blocker: psycopg.Connection[Any] | None = None
    if statement.startswith("SELECT generation"):
        # The store's put waits for this lock: it is ended while it waits.
        blocker = psycopg.connect(postgres.conninfo())
        blocker.execute(
            sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
                sql.Identifier(job.schema, "durable_sinks_generations")
            )
        )
    else:
        slow_commits(conn, job.schema)
    ended: list[int] = []
    watcher = end_during(postgres, job.job_id, statement, ended)
    try:
        with pytest.raises(InDoubtError) as raised:
            old.run_epoch(0, epoch_0())
    finally:
        watcher.join()
        if blocker is not None:
            blocker.close()
    assert ended == [1]
    assert f"{postgres.host}:{postgres.port}/" in str(raised.value)
    check_error(raised.value, postgres)
    ride_through(job, conn, old)


def test_every_session_of_the_job_carries_its_name(job: Job, conn: psycopg.Connection[Any]) -> None:
    coordinator = job.coordinator()
    coordinator.start()
    try:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE starts_with(application_name, %s) ORDER BY 1",
                (f"ds:{job.job_id}:",),
            ).fetchall()
        ]
    finally:
        coordinator.close()
    sink_sessions = [n for n in names if n.startswith(f"ds:{job.job_id}:pg:")]
    assert len(sink_sessions) == 2  # the epochs' session and the admin session
    assert all(n.endswith(f":g{coordinator.generation}") for n in sink_sessions)
    assert f"ds:{job.job_id}:store" in names
    assert all(len(n.encode()) <= 63 for n in names)
