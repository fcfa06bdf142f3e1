"""`durable-sinks drop` against the real test bed: a job of Postgres + S3 + files + Kafka that
committed two epochs -> the dry run lists its bookkeeping and removes nothing; `--apply`
leaves nothing of the job in any sink or store (listed on the servers: rows, objects, files,
topics) while the committed data, and another job's bookkeeping in the same tables, stay; a
prepared participant left in doubt makes it refuse, naming the epoch and `resolve`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql

from durable_sinks.cli import main
from durable_sinks.coordinator import Coordinator
from durable_sinks.core.naming import component
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.spark import sink
from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from tests.support.s3_target import s3_options
from tests.support.targets import prepared_gids


def rows(start: int, count: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + count), pa.int64())})


class Job:
    """A job of four sinks, described by a job file (the DSN from the environment)."""

    def __init__(
        self,
        tmp_path: Path,
        postgres: PostgresEndpoint,
        s3: S3Endpoint,
        kafka: KafkaEndpoint,
        schema: str,
        job: str,
        topic: str,
        prefix: str,
    ) -> None:
        self.job, self.schema, self.topic = job, schema, topic
        self.s3, self.kafka = s3, kafka
        self.prefix = prefix.rstrip("/")
        self.store = tmp_path / "decisions"
        self.folder = tmp_path / "files"
        self.secret = postgres.password
        self.env = {"DROP_PG_DSN": postgres.conninfo()}
        self.options: list[dict[str, Any]] = [
            {"kind": "postgres", "table": f"{schema}.events", "create_table": True},
            {"kind": "s3", **s3_options(s3, f"s3://{s3.bucket}/{self.prefix}")},
            {"kind": "files", "path": str(self.folder)},
            {"kind": "kafka", "bootstrap_servers": kafka.bootstrap_servers, "topic": topic},
        ]
        self.file = tmp_path / "job.json"
        self.file.write_text(
            json.dumps(
                {
                    "job_id": job,
                    "decision_store": str(self.store),
                    "sinks": [
                        {**o, "dsn": "${env:DROP_PG_DSN}"} if o["kind"] == "postgres" else o
                        for o in self.options
                    ],
                }
            )
        )
        dsn = postgres.conninfo()
        self.specs = [
            sink(o["kind"], **{k: v for k, v in o.items() if k != "kind"})
            if o["kind"] != "postgres"
            else sink("postgres", dsn=dsn, table=o["table"], create_table=True)
            for o in self.options
        ]

    def coordinator(self) -> Coordinator:
        return Coordinator(
            self.job, [s.build() for s in self.specs], LocalDirectoryStore(self.store)
        )

    def run(self, *args: str) -> Result:
        result = CliRunner().invoke(
            main, [args[0], self.job, "-f", str(self.file), *args[1:]], env=self.env
        )
        assert self.secret not in result.output
        return result

    # -- what the servers hold, listed ---------------------------------------------------------
    def s3_keys(self, under: str = "") -> list[str]:
        found: list[str] = []
        paginator = self.s3.client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.s3.bucket, Prefix=f"{self.prefix}/{under}"):
            found += [o["Key"] for o in page.get("Contents", [])]
        return sorted(found)

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*"))

    def topics(self) -> set[str]:
        return set(AdminClient(self.kafka.config()).list_topics(timeout=30).topics)

    def committed_records(self) -> int:
        consumer = Consumer(
            {
                **self.kafka.config(),
                "group.id": f"{self.job}-check",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=30)
            return int(high - low)
        finally:
            consumer.close()


def marker_rows(conn: psycopg.Connection[Any], schema: str, job: str) -> dict[str, int]:
    found = {}
    for table in ("durable_sinks_epochs", "durable_sinks_fences"):
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s").format(
                sql.Identifier(schema, table)
            ),
            (job,),
        ).fetchone()
        found[table] = int(row[0]) if row else 0
    return found


@pytest.fixture
def job(
    tmp_path: Path,
    postgres: PostgresEndpoint,
    s3: S3Endpoint,
    kafka: KafkaEndpoint,
    pg_schema: str,
    job_id: str,
    kafka_topic: str,
    s3_prefix: str,
) -> Job:
    return Job(tmp_path, postgres, s3, kafka, pg_schema, job_id, kafka_topic, s3_prefix)


def test_drop_lists_then_removes_the_jobs_bookkeeping_and_keeps_its_data(
    job: Job, conn: psycopg.Connection[Any], postgres: PostgresEndpoint, tmp_path: Path
) -> None:
    coordinator = job.coordinator()
    coordinator.start()
    coordinator.run_epoch(0, [rows(0, 5)])
    coordinator.run_epoch(1, [rows(5, 3)])
    coordinator.close()
    # Another job's bookkeeping in the same marker and fence tables must stay.
    other_id = f"{job.job}-other"
    other = Coordinator(
        other_id,
        [
            sink(
                "postgres", dsn=postgres.conninfo(), table=f"{job.schema}.other", create_table=True
            ).build()
        ],
        LocalDirectoryStore(job.store),
    )
    other.start()
    other.run_epoch(0, [rows(0, 2)])
    other.close()
    progress = f"{job.topic}-ds-progress"
    data_keys = job.s3_keys("epoch=")
    before = {
        "pg": marker_rows(conn, job.schema, job.job),
        "keys": job.s3_keys(),
        "files": job.files(),
        "store": sorted(str(p) for p in job.store.rglob("*")),
    }
    assert before["pg"] == {"durable_sinks_epochs": 2, "durable_sinks_fences": 1}
    assert f"{job.prefix}/_job.json" in before["keys"]
    assert progress in job.topics()

    dry = job.run("drop")
    assert dry.exit_code == 0, dry.output
    for shown in ("marker rows", "fence row", "_job.json", "progress topic", "transactional.id"):
        assert shown in dry.output
    assert "kept: readers that read through the markers" in dry.output
    assert "dry run" in dry.output
    assert marker_rows(conn, job.schema, job.job) == before["pg"]
    assert job.s3_keys() == before["keys"]
    assert job.files() == before["files"]
    assert sorted(str(p) for p in job.store.rglob("*")) == before["store"]
    assert progress in job.topics()

    applied = job.run("drop", "--apply", "--live-window", "0")
    assert applied.exit_code == 0, applied.output
    assert "dropped job" in applied.output

    # Nothing of the job is left but the epoch markers readers read through ...
    assert marker_rows(conn, job.schema, job.job) == {
        "durable_sinks_epochs": 0,
        "durable_sinks_fences": 0,
    }
    assert marker_rows(conn, job.schema, other_id) == {
        "durable_sinks_epochs": 1,
        "durable_sinks_fences": 1,
    }
    assert not (job.store / component(job.job)).exists()
    assert (job.store / component(other_id)).is_dir()
    assert job.s3_keys() == sorted([*data_keys, *job.s3_keys("_epochs/")])
    assert not (job.folder / "_staging").exists()
    assert progress not in job.topics()
    # ... and the committed data is as it was.
    total = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(job.schema, "events"))
    ).fetchone()
    assert total == (8,)
    assert job.committed_records() >= 8  # the records, plus the transactions' markers
    parquet = sorted(job.folder.glob("epoch=*/part=*/*.parquet"))
    assert sum(pq.read_metadata(p).num_rows for p in parquet) == 8

    # With --epoch-markers the markers go too; the data objects and files stay.
    markers = job.run("drop", "--apply", "--epoch-markers")
    assert markers.exit_code == 0, markers.output
    assert job.s3_keys() == data_keys
    assert not list(job.folder.glob("epoch=*/part=*/_EPOCH.json"))
    assert sorted(job.folder.glob("epoch=*/part=*/*.parquet")) == parquet
    again = job.run("drop")
    assert again.exit_code == 0, again.output
    assert "0 kind(s) of bookkeeping" in again.output


def test_drop_refuses_while_a_participant_is_prepared(
    job: Job, conn: psycopg.Connection[Any]
) -> None:
    coordinator = job.coordinator()
    coordinator.start()
    coordinator.run_epoch(0, [rows(0, 5)])
    steps = coordinator.epoch_steps(1, [rows(5, 3)])
    for step in steps:
        if step == "after-pre-commit:postgres":
            break
    steps.close()
    coordinator.close()
    assert len(prepared_gids(conn, job.job, "postgres")) == 1
    before = (marker_rows(conn, job.schema, job.job), job.s3_keys(), job.files())

    for args in (("drop",), ("drop", "--apply", "--force")):
        refused = job.run(*args)
        assert refused.exit_code == 2, refused.output
        assert "DropRefusedError" in refused.output
        assert "epoch 1" in refused.output
        assert "durable-sinks resolve" in refused.output
        assert (marker_rows(conn, job.schema, job.job), job.s3_keys(), job.files()) == before
        assert (job.store / component(job.job)).is_dir()

    resolved = job.run("resolve", "--apply", "--live-window", "0")
    assert resolved.exit_code == 0, resolved.output
    dropped = job.run("drop", "--apply", "--live-window", "0")
    assert dropped.exit_code == 0, dropped.output
    assert marker_rows(conn, job.schema, job.job) == {
        "durable_sinks_epochs": 0,
        "durable_sinks_fences": 0,
    }


def test_drop_refuses_while_a_coordinator_looks_alive(job: Job) -> None:
    coordinator = job.coordinator()
    coordinator.start()
    coordinator.run_epoch(0, [rows(0, 5)])
    try:
        refused = job.run("drop", "--apply")
        assert refused.exit_code == 2, refused.output
        assert "seems to run" in refused.output
        assert f"{job.prefix}/_job.json" in job.s3_keys()
    finally:
        coordinator.close()
