"""`durable-sinks drop` after executor mode, on the test bed's Postgres and S3: each epoch's
parts are prepared as tasks do (`prepare_part`: a Postgres prepared transaction and S3
multipart uploads per part, a staging folder per part in a files sink, a journal per part in
a Delta table), and one epoch's decision is written but the driver stops before
committing. Drop refuses while any part is prepared (naming the epoch); after `resolve
--apply` the dry run lists every item and `--apply` leaves no prepared transaction, no
multipart upload, no staging folder or journal, no marker, fence or decision of the job; the
rows of every part stay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
from click.testing import CliRunner, Result
from psycopg import sql

from durable_sinks.cli import main
from durable_sinks.coordinator import Coordinator, prepare_part
from durable_sinks.core.naming import component
from durable_sinks.core.protocol import CommitHandle
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from tests.services import PostgresEndpoint, S3Endpoint
from tests.support.s3_target import s3_options
from tests.support.targets import prepared_gids


def rows(start: int, count: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + count), pa.int64())})


def test_drop_after_executor_mode_refuses_prepared_parts_then_leaves_nothing(
    tmp_path: Path,
    postgres: PostgresEndpoint,
    s3: S3Endpoint,
    conn: psycopg.Connection[Any],
    pg_schema: str,
    job_id: str,
    s3_prefix: str,
) -> None:
    prefix = s3_prefix.rstrip("/")
    store = tmp_path / "decisions"
    pg = {"table": f"{pg_schema}.events", "create_table": True}
    lake = s3_options(s3, f"s3://{s3.bucket}/{prefix}")
    folder = {"path": str(tmp_path / "files")}
    delta = {"path": str(tmp_path / "delta"), "create_table": True}
    job_file = tmp_path / "job.json"
    job_file.write_text(
        json.dumps(
            {
                "job_id": job_id,
                "decision_store": str(store),
                "execution": "executor",
                "sinks": [
                    {"kind": "postgres", "dsn": "${env:DROP_PG_DSN}", **pg},
                    {"kind": "s3", **lake},
                    {"kind": "files", **folder},
                    {"kind": "delta", **delta},
                ],
            }
        )
    )

    def run(*args: str) -> Result:
        result = CliRunner().invoke(
            main,
            [args[0], job_id, "-f", str(job_file), *args[1:]],
            env={"DROP_PG_DSN": postgres.conninfo()},
        )
        assert postgres.password not in result.output
        return result

    def build() -> list[Any]:
        return [
            create("postgres", {"dsn": postgres.conninfo(), **pg}),
            create("s3", lake),
            create("files", folder),
            create("delta", delta),
        ]

    def parts(epoch: int, start: int) -> Any:
        def prepare(generation: int) -> list[CommitHandle]:
            handles = []
            for n, part in enumerate(("p0-t1", "p1-t2")):
                batch = [rows(start + 10 * n, 10)]
                handles += prepare_part(job_id, generation, epoch, part, build, batch)
            return handles

        return prepare

    coordinator = Coordinator(job_id, build(), LocalDirectoryStore(store), executor_mode=True)
    coordinator.start()
    coordinator.run_distributed_epoch(0, parts(0, 0))
    steps = coordinator.distributed_epoch_steps(1, parts(1, 100))
    while next(steps) != "after-decision":
        pass  # the driver stops here: every part prepared, the epoch decided
    steps.close()
    coordinator.close()

    def s3_keys() -> list[str]:
        listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=f"{prefix}/")
        return sorted(o["Key"][len(prefix) + 1 :] for o in listed.get("Contents", []))

    def uploads() -> list[str]:
        listed = s3.client().list_multipart_uploads(Bucket=s3.bucket, Prefix=f"{prefix}/")
        return [u["Key"] for u in listed.get("Uploads", [])]

    def job_rows() -> list[int]:
        return [
            int(
                conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s").format(
                        sql.Identifier(pg_schema, table)
                    ),
                    (job_id,),
                ).fetchone()[0]  # type: ignore[index]
            )
            for table in ("durable_sinks_epochs", "durable_sinks_fences")
        ]

    assert len(prepared_gids(conn, job_id, "postgres")) == 2
    assert len(uploads()) == 2
    staging = tmp_path / "files" / "_staging"
    journals = tmp_path / "delta" / "_durable_sinks" / component(job_id)
    assert len(list(staging.iterdir())) == 2
    assert len(list(journals.rglob("*.json"))) == 2

    def files() -> list[str]:
        return sorted(str(p) for p in tmp_path.rglob("*") if "decisions" not in p.parts)

    before = (job_rows(), s3_keys(), uploads(), files())
    for args in (("drop",), ("drop", "--apply", "--force")):
        refused = run(*args)
        assert refused.exit_code == 2, refused.output
        assert "DropRefusedError" in refused.output
        assert "epoch 1" in refused.output
        assert (job_rows(), s3_keys(), uploads(), files()) == before

    resolved = run("resolve", "--apply", "--force")
    assert resolved.exit_code == 0, resolved.output
    dry = run("drop")
    assert dry.exit_code == 0, dry.output
    for shown in (
        "marker rows",
        "fence row",
        "_job.json",
        "decision store folder",
        "journal folders (empty)",
        "application transaction (txn)",
    ):
        assert shown in dry.output, shown

    applied = run("drop", "--apply", "--force")
    assert applied.exit_code == 0, applied.output
    assert prepared_gids(conn, job_id, "postgres") == []
    assert uploads() == []
    assert job_rows() == [0, 0]
    assert not (store / component(job_id)).exists()
    assert not staging.exists()
    assert not journals.exists()
    left = s3_keys()
    assert all(k.startswith(("epoch=", "_epochs/")) for k in left), left
    assert len([k for k in left if k.startswith("epoch=")]) == 4  # 2 epochs x 2 parts
    total = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(pg_schema, "events"))
    ).fetchone()
    assert total == (40,)
    from deltalake import DeltaTable

    assert DeltaTable(str(tmp_path / "delta")).to_pyarrow_table().num_rows == 40
    assert len(list((tmp_path / "files").glob("epoch=*/part=*/*.parquet"))) == 4
