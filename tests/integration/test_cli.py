"""The `durable-sinks` command against the real test bed: a job of
Postgres + S3 crashed after its decision, with a prepared Postgres transaction and S3 uploads
in doubt -> `inspect` lists both with the decision, `resolve` (dry run) changes nothing,
`resolve --apply` finishes them, `verify` passes; a hand-made duplicate or a deleted object
makes `verify` fail naming the epoch. Secrets come from the environment and never show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Producer
from psycopg import sql

from durable_sinks.cli import main
from durable_sinks.coordinator import Coordinator
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.spark import sink
from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from tests.support.operator_cli import resolve_the_decided_leftover
from tests.support.s3_target import s3_options
from tests.support.targets import prepared_gids


def rows(start: int, count: int) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(start, start + count), pa.int64()),
            "note": [f"r{i}" for i in range(start, start + count)],
        }
    )


class Job:
    """A Postgres + S3 job described by a job file whose secrets are environment variables."""

    def __init__(
        self, tmp_path: Path, postgres: PostgresEndpoint, s3: S3Endpoint, schema: str, job: str
    ) -> None:
        self.job = job
        self.table = f"{schema}.events"
        self.prefix = f"cli-{job}"
        self.s3 = s3
        self.store = tmp_path / "decisions"
        self.secrets = [postgres.password, s3.secret_access_key]
        self.env = {"CLI_PG_DSN": postgres.conninfo(), "CLI_S3_SECRET": s3.secret_access_key}
        options = s3_options(s3, f"s3://{s3.bucket}/{self.prefix}")
        options["secret_access_key"] = "${env:CLI_S3_SECRET}"
        s3_lines = "\n".join(f"{k} = {_toml(v)}" for k, v in options.items())
        self.file = tmp_path / "job.toml"
        self.file.write_text(
            f'job_id = "{job}"\ndecision_store = "{self.store}"\n\n'
            f'[[sinks]]\nkind = "postgres"\ndsn = "${{env:CLI_PG_DSN}}"\ntable = "{self.table}"\n'
            f'create_table = true\n\n[[sinks]]\nkind = "s3"\n{s3_lines}\n'
        )
        self.specs = [
            sink("postgres", dsn=postgres.conninfo(), table=self.table, create_table=True),
            sink("s3", **s3_options(s3, f"s3://{s3.bucket}/{self.prefix}")),
        ]

    def coordinator(self) -> Coordinator:
        return Coordinator(
            self.job, [s.build() for s in self.specs], LocalDirectoryStore(self.store)
        )

    def run(self, *args: str) -> Result:
        result = CliRunner().invoke(
            main, [args[0], self.job, "-f", str(self.file), *args[1:]], env=self.env
        )
        if os.environ.get("DS_SHOW_CLI"):  # docs/guide.md's examples come from this
            print(
                f"$ durable-sinks {' '.join(args[:1])} {self.job} -f job.toml {' '.join(args[1:])}"
            )
            print(result.output)
        for secret in self.secrets:
            assert secret not in result.output, f"a secret in the output of {args}"
        return result

    def data_keys(self, epoch: int) -> list[str]:
        listed = self.s3.client().list_objects_v2(
            Bucket=self.s3.bucket, Prefix=f"{self.prefix}/epoch={epoch:012d}/"
        )
        return [o["Key"] for o in listed.get("Contents", [])]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


@pytest.fixture
def job(
    tmp_path: Path, postgres: PostgresEndpoint, s3: S3Endpoint, pg_schema: str, job_id: str
) -> Job:
    return Job(tmp_path, postgres, s3, pg_schema, job_id)


def crash_after_decision(job: Job) -> None:
    """Epoch 0 lands whole; epoch 1 is decided, then the driver dies (its sessions end, the
    prepared transaction and the uploads stay)."""
    coordinator = job.coordinator()
    coordinator.start()
    coordinator.run_epoch(0, [rows(0, 50)])
    steps = coordinator.epoch_steps(1, [rows(50, 30)])
    for step in steps:
        if step == "after-decision":
            break
    steps.close()
    coordinator.close()


def test_inspect_resolve_verify_after_a_crash(
    job: Job, conn: psycopg.Connection[Any], s3: S3Endpoint
) -> None:
    crash_after_decision(job)
    gids = prepared_gids(conn, job.job, "postgres")
    assert len(gids) == 1

    status = job.run("status")
    assert status.exit_code == 0, status.output
    assert "generation       1" in status.output
    assert "epochs in flight 1" in status.output
    assert "continues with first_epoch=2" in status.output  # (the newest epoch is 1)

    inspect = job.run("inspect")
    assert inspect.exit_code == 0, inspect.output
    assert "prepared transaction" in inspect.output
    assert "multipart upload" in inspect.output
    assert inspect.output.count("decided by generation 1: commit") == 2

    dry = job.run("resolve")
    assert dry.exit_code == 0, dry.output
    assert "dry run: 2 participant(s)" in dry.output
    assert prepared_gids(conn, job.job, "postgres") == gids
    assert job.data_keys(1) == []  # the uploads are not completed

    refused = job.run("resolve", "--apply")  # the crashed generation decided seconds ago
    assert refused.exit_code == 2, refused.output
    assert "refused" in refused.output

    applied = job.run("resolve", "--apply", "--live-window", "0")
    assert applied.exit_code == 0, applied.output
    assert "committed 2, rolled back 0" in applied.output
    assert prepared_gids(conn, job.job, "postgres") == []
    assert job.run("inspect").output.strip().endswith("nothing in doubt")
    count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(job.table))).fetchone()
    assert count == (80,)

    verify = job.run("verify")
    assert verify.exit_code == 0, verify.output
    assert "verify passed: epochs 0..1, 4 checks" in verify.output

    # A hand-made duplicate: a copy of epoch 1's object under another name.
    (original,) = job.data_keys(1)
    copy = original.replace("_00000.parquet", "_00001.parquet")
    client = s3.client()
    client.copy_object(
        Bucket=s3.bucket, Key=copy, CopySource={"Bucket": s3.bucket, "Key": original}
    )
    duplicated = job.run("verify")
    assert duplicated.exit_code == 1, duplicated.output
    assert "in epoch(s) [1]" in duplicated.output
    assert "is not in the epoch's marker" in duplicated.output
    client.delete_object(Bucket=s3.bucket, Key=copy)

    # A deleted object of epoch 0.
    (lost,) = job.data_keys(0)
    client.delete_object(Bucket=s3.bucket, Key=lost)
    deleted = job.run("verify")
    assert deleted.exit_code == 1, deleted.output
    assert "in epoch(s) [0]" in deleted.output
    assert "is in the epoch marker but missing" in deleted.output


def test_doctor_and_expire(job: Job, conn: psycopg.Connection[Any]) -> None:
    coordinator = job.coordinator()
    coordinator.start()
    for epoch in range(4):
        coordinator.run_epoch(epoch, [rows(epoch * 10, 10)])
    coordinator.close()

    doctor = job.run("doctor", "--read-only")
    assert doctor.exit_code == 0, doctor.output
    assert "doctor: every check passed" in doctor.output

    expired = job.run("expire", "--keep", "2")
    assert expired.exit_code == 0, expired.output
    assert "postgres: deleted 2 record(s)" in expired.output
    assert "s3: keeps no markers to expire" in expired.output
    verify = job.run("verify")
    assert verify.exit_code == 0, verify.output
    assert "marker expired" in verify.output


def test_doctor_names_the_problem_and_the_fix(job: Job) -> None:
    job.file.write_text(job.file.read_text().replace('kind = "s3"', 'kind = "s4"'))
    doctor = job.run("doctor")
    assert doctor.exit_code == 1, doctor.output
    assert "FAILED  settings" in doctor.output
    assert "no sink kind 's4'" in doctor.output
    assert "Fix:" in doctor.output


def test_doctor_runs_the_start_checks_unless_the_job_runs(job: Job) -> None:
    fresh = job.run("doctor")
    assert fresh.exit_code == 0, fresh.output
    assert "ok      start checks" in fresh.output
    coordinator = job.coordinator()
    coordinator.start()  # generation 3 (doctor's start checks claimed 2), its sessions open
    coordinator.run_epoch(0, [rows(0, 5)])
    try:
        running = job.run("doctor")
    finally:
        coordinator.close()
    assert running.exit_code == 0, running.output
    assert "skipped, a coordinator runs (postgres has sessions of generation" in running.output


def test_an_unset_variable_is_named_not_guessed(job: Job) -> None:
    result = CliRunner().invoke(
        main, ["status", job.job, "-f", str(job.file)], env={"CLI_PG_DSN": ""}
    )
    assert result.exit_code == 2
    assert "CLI_S3_SECRET (named by ${env:CLI_S3_SECRET}) is not set" in result.output


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("durable-sinks")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    for command in ("status", "inspect", "resolve", "verify", "doctor", "expire"):
        assert command in done.stdout


def test_verify_counts_kafka_records_by_their_epoch_header(
    tmp_path: Path,
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    pg_schema: str,
    job_id: str,
    kafka_topic: str,
) -> None:
    table = f"{pg_schema}.events"
    store = tmp_path / "decisions"
    kafka_options = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "topic": kafka_topic,
        "epoch_header": True,
    }
    specs = [
        sink("postgres", dsn=postgres.conninfo(), table=table, create_table=True),
        sink("kafka", **kafka_options),
    ]
    coordinator = Coordinator(job_id, [s.build() for s in specs], LocalDirectoryStore(store))
    coordinator.start()
    for epoch in range(2):
        coordinator.run_epoch(epoch, [rows(epoch * 10, 10)])
    coordinator.close()
    job_file = tmp_path / "job.json"
    job_file.write_text(
        json.dumps(
            {
                "job_id": job_id,
                "decision_store": str(store),
                "sinks": [
                    {"kind": "postgres", "dsn": "${env:PG}", "table": table},
                    {"kind": "kafka", **kafka_options},
                ],
            }
        )
    )
    env = {"PG": postgres.conninfo()}
    args = ["verify", job_id, "-f", str(job_file)]
    passed = CliRunner().invoke(main, args, env=env)
    assert passed.exit_code == 0, passed.output
    assert "10 rows counted" in passed.output
    inspect = CliRunner().invoke(main, ["inspect", job_id, "-f", str(job_file)], env=env)
    assert inspect.exit_code == 0, inspect.output
    assert "nothing in doubt" in inspect.output

    duplicate = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    duplicate.produce(kafka_topic, b"{}", headers=[("ds-epoch", b"1")])
    duplicate.flush(10)
    failed = CliRunner().invoke(main, args, env=env)
    assert failed.exit_code == 1, failed.output
    assert "in epoch(s) [1]" in failed.output
    assert "the sink holds 11 rows, the decision 10" in failed.output


def test_files_sink_staging_and_counted_rows(tmp_path: Path, job_id: str) -> None:
    store, folder = tmp_path / "decisions", tmp_path / "out"
    coordinator = Coordinator(
        job_id, [sink("files", path=str(folder)).build()], LocalDirectoryStore(store)
    )
    coordinator.start()
    coordinator.run_epoch(0, [rows(0, 7)])
    steps = coordinator.epoch_steps(1, [rows(7, 3)])
    for step in steps:
        if step == "after-decision":
            break
    steps.close()
    coordinator.close()
    args = [job_id, "--kind", "files", "-o", f"path={folder}", "--store", str(store)]

    resolve_the_decided_leftover(args)

    (part,) = (folder / "epoch=0").glob("part=*")
    (original,) = part.glob("*.parquet")
    (part / "copy.parquet").write_bytes(original.read_bytes())
    failed = CliRunner().invoke(main, ["verify", *args])
    assert failed.exit_code == 1, failed.output
    assert "in epoch(s) [0]" in failed.output
    assert "holds 14 rows, its marker 7" in failed.output
