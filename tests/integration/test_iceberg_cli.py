"""The `durable-sinks` command on an Iceberg sink (pyiceberg's SQL catalog in the test bed's
Postgres, a local warehouse): a distributed epoch whose two task parts were decided, then the
driver died -> `inspect` lists both parts' files outside the table with the decision,
`resolve --apply` appends them in the epoch's one commit, `verify` counts every epoch's rows
from the table's manifests; a data file deleted behind the table's back fails `verify`
naming the epoch. The catalog's password comes from the environment and never shows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner, Result

from durable_sinks.cli import main
from durable_sinks.coordinator import Coordinator, prepare_part
from durable_sinks.core.protocol import CommitHandle
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from tests.services import PostgresEndpoint
from tests.support.iceberg_target import IcebergCatalog


def events(start: int, count: int) -> pa.RecordBatch:
    ids = list(range(start, start + count))
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "body": pa.array([f"r{i}" for i in ids], pa.string())}
    )


@pytest.fixture
def catalog(postgres: PostgresEndpoint, tmp_path: Path) -> Iterator[IcebergCatalog]:
    made = IcebergCatalog(postgres, tmp_path)
    made.create_namespace()
    made.catalog().create_table(("ds", "events"), schema=events(0, 0).schema)
    try:
        yield made
    finally:
        made.drop()


def test_inspect_resolve_verify_an_iceberg_sink_after_a_crash(
    catalog: IcebergCatalog, tmp_path: Path, job_id: str
) -> None:
    store = tmp_path / "decisions"
    options = catalog.sink_options()
    job_file = tmp_path / "job.json"
    job_file.write_text(
        json.dumps(
            {
                "job_id": job_id,
                "decision_store": str(store),
                "kind": "iceberg",
                **options,
                "catalog": {**options["catalog"], "uri": "${env:CLI_ICEBERG_URI}"},
            }
        )
    )
    env = {"CLI_ICEBERG_URI": catalog.uri()}

    def run(*args: str) -> Result:
        result = CliRunner().invoke(
            main, [args[0], job_id, "-f", str(job_file), *args[1:]], env=env
        )
        assert catalog.postgres.password not in result.output
        return result

    def build() -> list[Any]:
        return [create("iceberg", options)]

    def parts(epoch: int, start: int) -> Any:
        def prepare(generation: int) -> list[CommitHandle]:
            handles = []
            for n, part in enumerate(("p0-t1", "p1-t2")):
                batch = [events(start + 10 * n, 10)]
                handles += prepare_part(job_id, generation, epoch, part, build, batch)
            return handles

        return prepare

    coordinator = Coordinator(job_id, build(), LocalDirectoryStore(store), executor_mode=True)
    coordinator.start()
    coordinator.run_distributed_epoch(0, parts(0, 0))
    steps = coordinator.distributed_epoch_steps(1, parts(1, 100))
    while next(steps) != "after-decision":
        pass  # the driver dies here
    steps.close()
    coordinator.close()

    status = run("status")
    assert status.exit_code == 0, status.output
    assert "epochs in flight 1" in status.output

    inspect = run("inspect")
    assert inspect.exit_code == 0, inspect.output
    assert inspect.output.count("1 data file outside the table") == 2
    assert inspect.output.count("decided by generation 1: commit") == 2

    dry = run("resolve")
    assert dry.exit_code == 0, dry.output
    assert "dry run: 2 participant(s)" in dry.output
    assert len(catalog.rows()) == 20

    applied = run("resolve", "--apply", "--force")
    assert applied.exit_code == 0, applied.output
    assert "committed 2, rolled back 0" in applied.output
    assert len(catalog.rows()) == 40
    assert run("inspect").output.strip().endswith("nothing in doubt")

    verify = run("verify")
    assert verify.exit_code == 0, verify.output
    assert "verify passed: epochs 0..1, 2 checks" in verify.output
    assert "20 rows counted" in verify.output
    doctor = run("doctor", "--read-only")
    assert doctor.exit_code == 0, doctor.output

    table = catalog.catalog().load_table(("ds", "events"))
    first = next(s for s in table.snapshots() if s.summary["durable-sinks.epoch"] == "0")
    lost = next(
        str(entry.data_file.file_path)
        for manifest in first.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io)
    )
    Path(lost.removeprefix("file://")).unlink()
    deleted = run("verify")
    assert deleted.exit_code == 1, deleted.output
    assert "in epoch(s) [0]" in deleted.output
    assert "MISMATCH" in deleted.output
    assert "missing" in deleted.output  # "<the file> is in the table but missing"
