"""An executor-mode epoch's participants committed at once: Postgres on several sessions,
S3's uploads completed side by side. Every part lands; a participant lost among them is
reported (ParticipantLostError) while every other one still commits; a coordinator that
starts after a crash past the decision commits them all."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from durable_sinks.coordinator import Coordinator, EpochOutcome, prepare_part
from durable_sinks.core import CommitHandle, SinkConnector
from durable_sinks.core.errors import ParticipantLostError
from durable_sinks.core.naming import owner_prefix
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from durable_sinks.sinks.s3 import S3Sink, committed_dataset
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint, S3Endpoint
from tests.support.s3_objects import incomplete_uploads
from tests.support.s3_target import s3_sink_config

Conn = psycopg.Connection[Any]
PARTS = 8


def rows(part: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(part * 10, part * 10 + 10), pa.int64())})


def parts(
    job: str, build: Callable[[], Sequence[SinkConnector]]
) -> Callable[[int], list[CommitHandle]]:
    """Executor mode's prepare: PARTS tasks, each preparing its part of epoch 0."""

    def prepare(generation: int) -> list[CommitHandle]:
        handles: list[CommitHandle] = []
        for part in range(PARTS):
            handles += prepare_part(job, generation, 0, f"p{part}-t{part}", build, [rows(part)])
        return handles

    return prepare


def coordinator(
    job: str, sink: SinkConnector, tmp_path: Path, on_step: Callable[[str], None] | None = None
) -> Coordinator:
    made = Coordinator(
        job,
        [sink],
        LocalDirectoryStore(tmp_path / "store"),
        executor_mode=True,
        source="q",
        on_step=on_step,
    )
    made.start()
    return made


class CrashError(Exception):
    """A crash of the driver at a step."""


def stop_at(step: str) -> Callable[[str], None]:
    def on_step(reached: str) -> None:
        if reached == step:
            raise CrashError(step)

    return on_step


# -- Postgres ------------------------------------------------------------------------------------
@pytest.fixture
def table(conn: Conn, pg_schema: str) -> str:
    name = f"{pg_schema}.parts"
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.SQL(name)))
    return name


def pg_sink(postgres: PostgresEndpoint, table: str) -> PostgresSink:
    return PostgresSink(
        Postgres(postgres.conninfo(), table, participants_in_flight=PARTS, commit_sessions=3)
    )


def ids(conn: Conn, table: str) -> list[int]:
    query = sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.SQL(table))
    return [row[0] for row in conn.execute(query)]


def prepared(conn: Conn, job: str) -> list[str]:
    query = "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s"
    return [row[0] for row in conn.execute(query, (owner_prefix(job, "postgres") + "%",))]


def short_job(unique: UniqueNames) -> str:
    """A job id short enough to stay whole in its sessions' application_name."""
    return f"cc-{unique.job_id[-10:]}"


def sessions(conn: Conn, job: str) -> int:
    query = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s"
    found = conn.execute(query, (f"ds:{job}:%",)).fetchone()
    assert found is not None
    return int(found[0])


def test_postgres_commits_an_epochs_parts_on_several_sessions(
    postgres: PostgresEndpoint, conn: Conn, table: str, unique: UniqueNames, tmp_path: Path
) -> None:
    job = short_job(unique)
    driver = coordinator(job, pg_sink(postgres, table), tmp_path)
    try:
        before = sessions(conn, job)
        result = driver.run_distributed_epoch(0, parts(job, lambda: [pg_sink(postgres, table)]))
        assert result.outcome is EpochOutcome.COMMITTED
        assert len(result.decision.handles) == PARTS
        assert ids(conn, table) == list(range(PARTS * 10))
        assert prepared(conn, job) == []
        assert sessions(conn, job) == before + 2  # commit_sessions=3: the admin one and 2 more
        assert driver.sinks[0].metrics()["epochs_committed"] == PARTS
    finally:
        driver.close()
    deadline = time.monotonic() + 10  # a closed session's backend exits a moment later
    while sessions(conn, job) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sessions(conn, job) == 0


def test_postgres_a_lost_part_is_reported_and_every_other_part_commits(
    postgres: PostgresEndpoint, conn: Conn, table: str, unique: UniqueNames, tmp_path: Path
) -> None:
    job = short_job(unique)
    lost: list[str] = []

    def lose_one(step: str) -> None:
        if step == "after-decision":  # an operator's ROLLBACK PREPARED, a failover's loss
            [gid, *_] = sorted(prepared(conn, job))
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            lost.append(gid)

    driver = coordinator(job, pg_sink(postgres, table), tmp_path, on_step=lose_one)
    try:
        with pytest.raises(ParticipantLostError, match=lost[0] if lost else "does not exist"):
            driver.run_distributed_epoch(0, parts(job, lambda: [pg_sink(postgres, table)]))
    finally:
        driver.close()
    assert len(lost) == 1
    assert prepared(conn, job) == []  # the other seven committed
    assert len(ids(conn, table)) == (PARTS - 1) * 10


def test_postgres_a_start_after_a_crash_past_the_decision_commits_every_part(
    postgres: PostgresEndpoint, conn: Conn, table: str, unique: UniqueNames, tmp_path: Path
) -> None:
    job = short_job(unique)
    crashed = coordinator(job, pg_sink(postgres, table), tmp_path, stop_at("after-decision"))
    with pytest.raises(CrashError):
        crashed.run_distributed_epoch(0, parts(job, lambda: [pg_sink(postgres, table)]))
    assert len(prepared(conn, job)) == PARTS
    crashed.close()
    successor = coordinator(job, pg_sink(postgres, table), tmp_path)
    successor.close()
    assert prepared(conn, job) == []
    assert ids(conn, table) == list(range(PARTS * 10))


# -- S3 ------------------------------------------------------------------------------------------
@pytest.fixture
def path(s3: S3Endpoint, s3_prefix: str) -> str:
    return f"s3://{s3.bucket}/{s3_prefix.rstrip('/')}"


def s3_sink(s3: S3Endpoint, path: str) -> S3Sink:
    return S3Sink(s3_sink_config(s3, path))


def s3_ids(s3: S3Endpoint, path: str) -> list[int]:
    dataset = committed_dataset(
        path,
        endpoint_url=s3.endpoint_url,
        region=s3.region,
        access_key_id=s3.access_key_id,
        secret_access_key=s3.secret_access_key,
        addressing_style="path",
    )
    return sorted(dataset.to_table().column("id").to_pylist())


def pending(s3: S3Endpoint, path: str) -> list[Any]:
    prefix = path.removeprefix(f"s3://{s3.bucket}/") + "/"
    return incomplete_uploads(s3.client(), s3.bucket, prefix)


def test_s3_completes_an_epochs_parts_side_by_side(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    driver = coordinator("job", s3_sink(s3, path), tmp_path)
    try:
        result = driver.run_distributed_epoch(0, parts("job", lambda: [s3_sink(s3, path)]))
    finally:
        driver.close()
    assert result.outcome is EpochOutcome.COMMITTED
    assert s3_ids(s3, path) == list(range(PARTS * 10))
    assert pending(s3, path) == []


def test_s3_a_lost_part_is_reported_and_every_other_part_completes(
    s3: S3Endpoint, path: str, tmp_path: Path
) -> None:
    aborted: list[Any] = []

    def lose_one(step: str) -> None:
        if step == "after-decision":  # a lifecycle rule's abort of the pending upload
            upload = sorted(pending(s3, path), key=lambda u: u.key)[0]
            s3.client().abort_multipart_upload(
                Bucket=s3.bucket, Key=upload.key, UploadId=upload.upload_id
            )
            aborted.append(upload)

    driver = coordinator("job", s3_sink(s3, path), tmp_path, on_step=lose_one)
    try:
        with pytest.raises(ParticipantLostError):
            driver.run_distributed_epoch(0, parts("job", lambda: [s3_sink(s3, path)]))
    finally:
        driver.close()
    assert len(aborted) == 1
    assert pending(s3, path) == []  # the seven others completed
