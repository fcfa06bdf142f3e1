"""A running job keeps its bookkeeping to the last `retain_epochs` epochs (coordinator/_expiry.py,
docs/operations.md, "Retention"), counted on the servers themselves after a run of tiny epochs
driven straight through the coordinator (no Spark).

Each job shape runs twice: `fast` (retain 2, 6 epochs; the default suite) and `long` (retain
100, 1,000 epochs; the crash tier). What the job expires is counted exactly: the sinks are
asked at the run's first epoch and then every `expiry_interval(retain)` epochs, so after the
last epoch they keep `kept` epochs, at most `retain + interval - 1` (2 and 109); the
decision store expires after every epoch and keeps `retain`. What it must keep is counted too:
S3's and the files sink's epoch markers (readers find committed epochs through them), Kafka's
progress records (compacted by the broker, never younger than the topic's
`min.compaction.lag.ms` of an hour), the Delta log's commits (the table's history); an
Iceberg table's snapshots are kept to its `keep_snapshots`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.coordinator._expiry import expiry_interval
from durable_sinks.core.naming import component, owner_prefix
from durable_sinks.manifest import DecisionStore, LocalDirectoryStore
from durable_sinks.spark import sink
from durable_sinks.spark._build import decision_store
from durable_sinks.spark._options import JobOptions
from durable_sinks.spark._specs import SinkSpec
from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from tests.support.coordinators import started
from tests.support.delta_target import delta_s3_options
from tests.support.iceberg_target import IcebergCatalog
from tests.support.kafka_reads import read_committed
from tests.support.s3_target import s3_options


@dataclass(frozen=True)
class Window:
    retain: int
    epochs: int

    @property
    def interval(self) -> int:
        return expiry_interval(self.retain)

    @property
    def bound(self) -> int:
        """The most epochs a sink keeps between two expiries."""
        return self.retain + self.interval - 1

    @property
    def kept(self) -> int:
        """Epochs a sink keeps after the run: those since its last expiry's window."""
        last_asked = (self.epochs - 1) // self.interval * self.interval
        return min(self.epochs, self.epochs - 1 - last_asked + self.retain)

    @property
    def decisions(self) -> int:
        return min(self.epochs, self.retain)


@pytest.fixture(
    params=[
        pytest.param(Window(2, 6), id="fast"),
        pytest.param(
            Window(100, 1_000),
            id="long",
            # 1,000 epochs: 35-365 s each on the shared 2-core machine (S3 alone the slowest).
            marks=[pytest.mark.crash_tier, pytest.mark.timeout(1_800)],
        ),
    ]
)
def window(request: pytest.FixtureRequest) -> Window:
    window: Window = request.param
    assert window.kept <= window.bound
    return window


def rows(epoch: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array([2 * epoch, 2 * epoch + 1], pa.int64())})


def run(job: str, specs: list[SinkSpec], store: DecisionStore, window: Window) -> None:
    coordinator = started(
        Coordinator(job, [s.build() for s in specs], store, retain_epochs=window.retain, source="q")
    )
    try:
        for epoch in range(window.epochs):
            result = coordinator.run_epoch(epoch, [rows(epoch)])
            assert result.outcome is EpochOutcome.COMMITTED
    finally:
        coordinator.close()


def marker_epochs(conn: psycopg.Connection[Any], schema: str, job: str) -> tuple[int, int, int]:
    """(distinct epochs, lowest, highest) of the job's Postgres marker rows."""
    table = sql.Identifier(schema, "durable_sinks_epochs")
    row = conn.execute(
        sql.SQL(
            "SELECT count(DISTINCT epoch), min(epoch), max(epoch) FROM {} WHERE job_id = %s"
        ).format(table),
        (job,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def count(conn: psycopg.Connection[Any], schema: str, table: str, job: str) -> int:
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s").format(sql.Identifier(schema, table)),
        (job,),
    ).fetchone()
    return int(row[0]) if row else 0


def s3_keys(s3: S3Endpoint, prefix: str) -> list[str]:
    found: list[str] = []
    paginator = s3.client().get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=s3.bucket, Prefix=prefix):
        found += [o["Key"][len(prefix) :] for o in page.get("Contents", [])]
    return found


def directory_decisions(folder: Path, job: str) -> int:
    """Decided epochs a directory store holds (`decisions/`), after checking that the epochs
    marked finished (`finished/`) and the generations' links are no more."""
    home = folder / component(job)
    decided = {p.name for p in (home / "decisions").iterdir()}
    finished = {p.name for p in (home / "finished").iterdir()}
    assert {f"{name}.json" for name in finished} <= decided, (finished, decided)
    linked = list(home.glob("generations/*/decisions/*.json"))  # the commit points' links
    assert len(linked) <= len(decided), linked
    return len(decided)


def assert_postgres_markers(
    conn: psycopg.Connection[Any], schema: str, job: str, window: Window
) -> None:
    epochs, lowest, highest = marker_epochs(conn, schema, job)
    assert (epochs, highest) == (window.kept, window.epochs - 1)
    assert lowest == window.epochs - window.kept  # contiguous: the newest ones
    assert count(conn, schema, "durable_sinks_fences", job) == 1


def test_postgres_alone_keeps_its_marker_rows_which_are_its_decisions_to_the_window(
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    pg_schema: str,
    job_id: str,
    window: Window,
) -> None:
    specs = [
        sink("postgres", dsn=postgres.conninfo(), table=f"{pg_schema}.events", create_table=True)
    ]
    store = decision_store(specs, JobOptions(job_id=job_id))
    run(job_id, specs, store, window)
    assert_postgres_markers(conn, pg_schema, job_id, window)
    # One-phase: the markers are the decisions; the store keeps the generation only.
    assert count(conn, pg_schema, "durable_sinks_decisions", job_id) == 0
    assert count(conn, pg_schema, "durable_sinks_generations", job_id) == 1
    total = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(pg_schema, "events"))
    ).fetchone()
    assert total == (2 * window.epochs,)  # the user's rows all stay


def test_postgres_and_s3_keep_markers_and_decisions_to_the_window_and_every_s3_epoch_marker(
    postgres: PostgresEndpoint,
    s3: S3Endpoint,
    conn: psycopg.Connection[Any],
    pg_schema: str,
    job_id: str,
    s3_prefix: str,
    window: Window,
) -> None:
    specs = [
        sink("postgres", dsn=postgres.conninfo(), table=f"{pg_schema}.events", create_table=True),
        sink("s3", **s3_options(s3, f"s3://{s3.bucket}/{s3_prefix}")),
    ]
    store = decision_store(specs, JobOptions(job_id=job_id))  # in the Postgres sink's schema
    run(job_id, specs, store, window)
    assert_postgres_markers(conn, pg_schema, job_id, window)
    assert count(conn, pg_schema, "durable_sinks_decisions", job_id) == window.decisions
    keys = s3_keys(s3, s3_prefix)
    markers = [k for k in keys if k.startswith("_epochs/")]
    assert len(markers) == window.epochs  # readers read through them: never expired
    assert len([k for k in keys if k.startswith("epoch=")]) == window.epochs


def test_s3_alone_keeps_its_decisions_to_the_window_and_every_epoch_marker(
    s3: S3Endpoint, job_id: str, s3_prefix: str, window: Window
) -> None:
    specs = [sink("s3", **s3_options(s3, f"s3://{s3.bucket}/{s3_prefix}"))]
    store = decision_store(specs, JobOptions(job_id=job_id))  # <prefix>/_decisions/
    run(job_id, specs, store, window)
    keys = s3_keys(s3, s3_prefix)
    decisions = [k for k in keys if k.startswith(f"_decisions/{component(job_id)}/decisions/")]
    assert len([k for k in keys if k.startswith("_epochs/")]) == window.epochs
    assert len(decisions) == window.decisions, sorted(decisions)


def test_files_keep_every_epoch_marker_and_the_directory_store_the_window(
    tmp_path: Path, job_id: str, window: Window
) -> None:
    folder, decisions = tmp_path / "out", tmp_path / "decisions"
    run(job_id, [sink("files", path=str(folder))], LocalDirectoryStore(decisions), window)
    assert len(list(folder.glob("epoch=*/part=*/_EPOCH.json"))) == window.epochs
    assert list((folder / "_staging").iterdir()) == []
    assert directory_decisions(decisions, job_id) == window.decisions


def test_a_local_delta_table_keeps_its_journal_folders_to_the_window(
    tmp_path: Path, job_id: str, window: Window
) -> None:
    table, decisions = tmp_path / "table", tmp_path / "decisions"
    specs = [sink("delta", path=str(table), create_table=True, name="lake")]
    run(job_id, specs, LocalDirectoryStore(decisions), window)
    journals = table / "_durable_sinks" / component(job_id) / "lake"
    folders = sorted(p.name for p in journals.iterdir())
    assert len(folders) == window.kept
    assert folders[-1] == f"e{window.epochs - 1:012d}"  # the newest stays
    assert all(not any(journals.joinpath(f).iterdir()) for f in folders)
    commits = list((table / "_delta_log").glob("*.json"))
    assert len(commits) >= window.epochs  # the table's history: the table's own retention
    assert directory_decisions(decisions, job_id) == window.decisions


def test_a_delta_table_on_s3_keeps_no_journal_key_of_a_committed_epoch(
    s3: S3Endpoint, tmp_path: Path, job_id: str, s3_prefix: str, window: Window
) -> None:
    """On S3 an epoch's commit deletes its journals by name (DeleteObjects), which leaves no
    empty marker object behind for the epoch's folder: a start's listing of the journals
    stays as long as what is in flight, not as the table's history."""
    path = f"s3://{s3.bucket}/{s3_prefix}table"
    specs = [sink("delta", **delta_s3_options(s3, path, create_table=True, name="lake"))]
    run(job_id, specs, LocalDirectoryStore(tmp_path / "decisions"), window)
    journals = f"{s3_prefix}table/_durable_sinks/"
    assert s3_keys(s3, journals) == []
    assert any(k.endswith(".json") for k in s3_keys(s3, f"{s3_prefix}table/_delta_log/"))


def test_postgres_and_kafka_keep_markers_and_decisions_to_the_window_and_progress_by_compaction(
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    conn: psycopg.Connection[Any],
    pg_schema: str,
    job_id: str,
    kafka_topic: str,
    progress_topic: str,
    window: Window,
) -> None:
    specs = [
        sink("postgres", dsn=postgres.conninfo(), table=f"{pg_schema}.events", create_table=True),
        sink(
            "kafka",
            bootstrap_servers=kafka.bootstrap_servers,
            topic=kafka_topic,
            progress_topic=progress_topic,
        ),
    ]
    store = decision_store(specs, JobOptions(job_id=job_id))
    run(job_id, specs, store, window)
    assert_postgres_markers(conn, pg_schema, job_id, window)
    assert count(conn, pg_schema, "durable_sinks_decisions", job_id) == window.decisions
    # One key per (job, sink) and kind: the broker's compaction keeps the latest record of
    # each, but never one younger than min.compaction.lag.ms (an hour): all are there yet.
    progress = owner_prefix(job_id, "kafka").encode() + b"progress"
    found = read_committed(kafka, AdminClient(kafka.config()), progress_topic)
    assert len([m for m in found if m.key() == progress]) == window.epochs


def test_an_iceberg_table_keeps_its_snapshots_to_keep_snapshots_and_the_store_the_window(
    postgres: PostgresEndpoint, tmp_path: Path, job_id: str, window: Window
) -> None:
    """An Iceberg table's record of the epochs is its snapshots (each one's summary names
    its epoch) and one table property: with `keep_snapshots` at the window, the table holds
    at most half as many again, the newest epochs', and the table's rows all stay."""
    catalog = IcebergCatalog(postgres, tmp_path / "warehouse")
    catalog.create_namespace()
    try:
        options = catalog.sink_options(create_table=True, keep_snapshots=window.retain)
        decisions = tmp_path / "decisions"
        run(job_id, [sink("iceberg", **options)], LocalDirectoryStore(decisions), window)
        table = catalog.catalog().load_table(catalog.identifier())
        epochs = [int(s.summary["durable-sinks.epoch"]) for s in table.snapshots() if s.summary]
        assert window.retain <= len(epochs) <= window.retain + window.retain // 2
        assert epochs == list(range(window.epochs - len(epochs), window.epochs))
        properties = [k for k in table.properties if k.startswith("durable-sinks.")]
        # The committed epoch and the journal's, one key each per job and sink.
        assert len(properties) == 2
        assert directory_decisions(decisions, job_id) == window.decisions
        assert len(catalog.rows()) == 2 * window.epochs
    finally:
        catalog.drop()
