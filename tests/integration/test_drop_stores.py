"""`durable-sinks drop` with each kind of decision store, on the real test bed: a Postgres
store (in the Postgres sink's schema), an S3 store (beside the S3 sink, under `_decisions/`),
a local directory, and a one-phase Postgres-only job whose decisions are its marker rows.

For each: an epoch decided but not finished (one sink committed, the other still prepared)
makes drop refuse, dry run and --apply alike, naming the epoch; after `resolve --apply` the
dry run lists every item, `--apply` removes them, and a listing of every server (Postgres
catalog queries for the job's rows and prepared transactions, the S3 prefix, the store's
folder) shows nothing of the job's bookkeeping left while the committed data stays."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from click.testing import CliRunner, Result
from psycopg import sql

from durable_sinks.cli import main
from durable_sinks.coordinator import Coordinator
from durable_sinks.core.naming import component
from durable_sinks.manifest import DecisionStore, LocalDirectoryStore, store_from
from durable_sinks.spark import sink
from durable_sinks.spark._build import decision_store
from durable_sinks.spark._options import JobOptions
from tests.services import PostgresEndpoint, S3Endpoint
from tests.support.coordinators import run_until, started
from tests.support.s3_target import s3_options
from tests.support.targets import prepared_gids

#: The Postgres tables a job's bookkeeping lives in (the sink's, then a Postgres store's).
META_TABLES = (
    "durable_sinks_epochs",
    "durable_sinks_fences",
    "durable_sinks_decisions",
    "durable_sinks_generations",
)


def rows(start: int, count: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + count), pa.int64())})


def job_rows(
    conn: psycopg.Connection[Any], schema: str, job: str, store_schema: str | None = None
) -> dict[str, int]:
    """The job's rows in each bookkeeping table: the sink's in `schema`, a Postgres store's
    in `store_schema` (default: `schema` too); a missing table counts none."""
    found = {}
    for table in META_TABLES:
        where = store_schema if store_schema and table in META_TABLES[2:] else schema
        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f'"{where}"."{table}"',)
        ).fetchone()
        if not (exists and exists[0]):
            found[table] = 0
            continue
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s").format(
                sql.Identifier(where, table)
            ),
            (job,),
        ).fetchone()
        found[table] = int(row[0]) if row else 0
    return found


class StoreJob:
    """A job described by a job file: Postgres + S3 (two-phase; the store is the first
    sink's default, or a directory), or Postgres alone (one-phase)."""

    def __init__(
        self,
        kind: str,
        tmp_path: Path,
        postgres: PostgresEndpoint,
        s3: S3Endpoint,
        schema: str,
        job: str,
        prefix: str,
    ) -> None:
        self.kind, self.job, self.schema, self.s3 = kind, job, schema, s3
        self.prefix = prefix.rstrip("/")
        self.secret = postgres.password
        self.env = {"DROP_PG_DSN": postgres.conninfo()}
        pg = {"kind": "postgres", "table": f"{schema}.events", "create_table": True}
        lake = {"kind": "s3", **s3_options(s3, f"s3://{s3.bucket}/{self.prefix}")}
        self.options: list[dict[str, Any]] = {
            "postgres": [pg, lake],
            "postgres-dsn": [pg, lake],
            "s3": [lake, pg],
            "directory": [pg, lake],
            "one-phase": [pg],
        }[kind]
        self.directory = tmp_path / "decisions"
        settings: dict[str, Any] = {"job_id": job}
        if kind == "directory":
            settings["decision_store"] = str(self.directory)
        if kind == "postgres-dsn":
            settings["decision_store"] = "${env:DROP_PG_DSN}"
        #: Where a Postgres store keeps its tables: the sink's schema, or the DSN's `public`.
        self.store_schema = "public" if kind == "postgres-dsn" else schema
        self.file = tmp_path / "job.json"
        self.file.write_text(
            json.dumps(
                {
                    **settings,
                    "sinks": [
                        {**o, "dsn": "${env:DROP_PG_DSN}"} if o["kind"] == "postgres" else o
                        for o in self.options
                    ],
                }
            )
        )
        self.specs = [
            sink("postgres", dsn=postgres.conninfo(), table=o["table"], create_table=True)
            if o["kind"] == "postgres"
            else sink(o["kind"], **{k: v for k, v in o.items() if k != "kind"})
            for o in self.options
        ]

    def coordinator(self) -> Coordinator:
        if self.kind == "directory":
            store: DecisionStore = LocalDirectoryStore(self.directory)
        elif self.kind == "postgres-dsn":
            store = store_from(self.env["DROP_PG_DSN"])
        else:
            store = decision_store(self.specs, JobOptions(job_id=self.job))
        return Coordinator(self.job, [s.build() for s in self.specs], store, source="query-1")

    def run(self, *args: str) -> Result:
        result = CliRunner().invoke(
            main, [args[0], self.job, "-f", str(self.file), *args[1:]], env=self.env
        )
        assert self.secret not in result.output
        return result

    def s3_keys(self) -> list[str]:
        found: list[str] = []
        paginator = self.s3.client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.s3.bucket, Prefix=f"{self.prefix}/"):
            found += [o["Key"][len(self.prefix) + 1 :] for o in page.get("Contents", [])]
        return sorted(found)

    def s3_uploads(self) -> list[str]:
        listed = self.s3.client().list_multipart_uploads(
            Bucket=self.s3.bucket, Prefix=f"{self.prefix}/"
        )
        return [u["Key"] for u in listed.get("Uploads", [])]

    def directory_files(self) -> list[str]:
        return sorted(str(p) for p in self.directory.rglob("*"))


@pytest.fixture(params=["postgres", "postgres-dsn", "s3", "directory", "one-phase"])
def store_job(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    postgres: PostgresEndpoint,
    s3: S3Endpoint,
    pg_schema: str,
    job_id: str,
    s3_prefix: str,
) -> StoreJob:
    return StoreJob(request.param, tmp_path, postgres, s3, pg_schema, job_id, s3_prefix)


def test_drop_refuses_an_unfinished_epoch_then_leaves_nothing_of_the_job_in_its_store(
    store_job: StoreJob, conn: psycopg.Connection[Any]
) -> None:
    job = store_job
    two_phase = job.kind != "one-phase"
    coordinator = started(job.coordinator())
    coordinator.run_epoch(0, [rows(0, 5)])
    alive = job.run("drop", "--apply")  # the coordinator just decided an epoch
    assert alive.exit_code == 2, alive.output
    assert "seems to run" in alive.output
    if two_phase:
        # Epoch 1 decided and unfinished, as a driver that stopped in its commits leaves
        # it: committed on the first sink only, the second still prepared; or (the Postgres
        # stores) committed on both, with S3's objects complete but its epoch marker not
        # yet written, so that no participant is prepared and only the decision tells.
        steps = coordinator.epoch_steps(1, [rows(5, 3)])
        stop = -1 if job.kind.startswith("postgres") else 0
        run_until(steps, f"after-commit:{job.options[stop]['kind']}")
        assert coordinator.decision(1) is not None
    else:
        coordinator.run_epoch(1, [rows(5, 3)])
    coordinator.close()
    before = (
        job_rows(conn, job.schema, job.job, job.store_schema),
        job.s3_keys(),
        job.directory_files(),
    )
    pg_first = job.options[0]["kind"] == "postgres"
    assert before[0]["durable_sinks_epochs"] == (2 if pg_first else 1)
    assert before[0]["durable_sinks_fences"] == 1
    if job.kind in ("postgres", "postgres-dsn"):
        assert before[0]["durable_sinks_generations"] == 1
        assert before[0]["durable_sinks_decisions"] == 2
    if job.kind == "s3":
        assert any(k.startswith("_decisions/") for k in before[1])
    if job.kind == "one-phase":
        # The store only fences; the decisions are in the marker rows.
        assert before[0]["durable_sinks_generations"] == 1
        assert before[0]["durable_sinks_decisions"] == 0

    if two_phase:
        for args in (("drop",), ("drop", "--apply", "--force")):
            refused = job.run(*args)
            assert refused.exit_code == 2, refused.output
            assert "DropRefusedError" in refused.output
            assert "epoch 1" in refused.output
            assert "durable-sinks resolve" in refused.output
            if stop == -1:
                assert "sink s3 has not committed it yet" in refused.output
            after = (
                job_rows(conn, job.schema, job.job, job.store_schema),
                job.s3_keys(),
                job.directory_files(),
            )
            assert after == before
        resolved = job.run("resolve", "--apply", "--live-window", "0")
        assert resolved.exit_code == 0, resolved.output
        # Finished everywhere: published on S3 too, also where S3 had completed its
        # objects before the driver stopped (nothing of it was left prepared).
        assert "_epochs/000000000001.json" in job.s3_keys()

    data_keys = [k for k in job.s3_keys() if k.startswith("epoch=")]
    marker_keys = [k for k in job.s3_keys() if k.startswith("_epochs/")]
    dry = job.run("drop")
    assert dry.exit_code == 0, dry.output
    assert "dry run" in dry.output
    for shown in ("marker rows", "fence row"):
        assert shown in dry.output
    if two_phase:
        assert "_job.json" in dry.output
    shown_store = {
        "postgres": "decision records",
        "postgres-dsn": "decision records",
        "s3": "decision store objects",
        "directory": "decision store folder",
        "one-phase": "generation row",
    }[job.kind]
    assert shown_store in dry.output
    listed = job_rows(conn, job.schema, job.job, job.store_schema)
    assert listed["durable_sinks_epochs"] >= 1

    kept_store = job.directory.with_name("store-before-drop")
    if job.kind == "directory":
        shutil.copytree(job.directory, kept_store)
    applied = job.run("drop", "--apply", "--live-window", "0")
    assert applied.exit_code == 0, applied.output
    assert "dropped job" in applied.output
    if job.kind == "directory":
        # A drop cut short after the sinks, before the store (the store is last): the sinks
        # no longer show the decided epochs committed, and the next drop finishes the rest.
        shutil.rmtree(job.directory)
        kept_store.rename(job.directory)
        finished = job.run("drop", "--apply", "--live-window", "0")
        assert finished.exit_code == 0, finished.output
        assert "decision store folder" in finished.output

    # Nothing of the job is left on any server but the epoch markers readers read through.
    assert job_rows(conn, job.schema, job.job, job.store_schema) == dict.fromkeys(META_TABLES, 0)
    assert prepared_gids(conn, job.job, "postgres") == []
    assert prepared_gids(conn, job.job, "s3") == []
    assert job.s3_uploads() == []
    assert job.s3_keys() == sorted([*data_keys, *marker_keys])
    assert not (job.directory / component(job.job)).exists()
    # ... and the committed data is as it was.
    total = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(job.schema, "events"))
    ).fetchone()
    assert total == (8,)
    if two_phase:
        assert len(data_keys) == 2
    again = job.run("drop", "--apply", "--epoch-markers", "--live-window", "0")
    assert again.exit_code == 0, again.output
    assert job.s3_keys() == data_keys
    last = job.run("drop")
    assert last.exit_code == 0, last.output
    assert "0 kind(s) of bookkeeping" in last.output
