"""`durable-sinks drop` on the table formats and the folder sinks, on the real test bed: one
job of a Postgres target (a CHECK constraint refuses some rows), a Delta table (a local
folder), an Iceberg table (pyiceberg's SQL catalog in the test bed's Postgres, a local
warehouse) and a jsonl dead-letter sink. The dry run lists every item, kept ones with why;
`--apply` removes the rest; afterwards a listing of every place (the Postgres catalog, the
Delta table's folder, the Iceberg warehouse, the dead-letter folder) shows nothing of the
job's bookkeeping but what is kept in the tables' own history, and every row is where it
was: the good rows in the three targets, the refused ones in the dead letter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from click.testing import CliRunner, Result
from psycopg import sql

from durable_sinks.cli import main
from durable_sinks.coordinator import EpochOutcome
from durable_sinks.core.naming import component
from durable_sinks.spark import sink
from durable_sinks.spark._build import build_coordinator
from durable_sinks.spark._options import JobOptions
from tests.services import PostgresEndpoint
from tests.support.coordinators import started
from tests.support.iceberg_target import IcebergCatalog

SINK_TABLES = ("durable_sinks_epochs", "durable_sinks_fences")


def rows(start: int, count: int, bad: int = 0) -> pa.RecordBatch:
    """`count` rows; the last `bad` of them break the Postgres table's CHECK (score > 0)."""
    ids = list(range(start, start + count))
    return pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "score": pa.array([-1 if i >= start + count - bad else 1 for i in ids], pa.int64()),
        }
    )


@pytest.fixture
def catalog(postgres: PostgresEndpoint, tmp_path: Path) -> Iterator[IcebergCatalog]:
    made = IcebergCatalog(postgres, tmp_path)
    made.create_namespace()
    made.catalog().create_table(("ds", "events"), schema=rows(0, 0).schema)
    try:
        yield made
    finally:
        made.drop()


def job_rows(conn: psycopg.Connection[Any], schema: str, job: str) -> dict[str, int]:
    found = {}
    for table in SINK_TABLES:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s").format(
                sql.Identifier(schema, table)
            ),
            (job,),
        ).fetchone()
        found[table] = int(row[0]) if row else 0
    return found


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_drop_on_delta_iceberg_and_a_jsonl_dead_letter_sink(
    tmp_path: Path,
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    pg_schema: str,
    catalog: IcebergCatalog,
    job_id: str,
) -> None:
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, score bigint CHECK (score > 0))").format(
            sql.Identifier(pg_schema, "events")
        )
    )
    delta_path = tmp_path / "delta"
    letters = tmp_path / "letters"
    store = tmp_path / "decisions"
    iceberg = catalog.sink_options()
    targets: list[dict[str, Any]] = [
        {"kind": "postgres", "table": f"{pg_schema}.events"},
        {"kind": "delta", "path": str(delta_path), "create_table": True},
        {"kind": "iceberg", **iceberg},
    ]
    dead_letter = {"kind": "jsonl", "path": str(letters), "name": "dead_letters"}
    env = {"DROP_PG_DSN": postgres.conninfo(), "DROP_ICEBERG_URI": catalog.uri()}
    job_file = tmp_path / "job.json"
    file_targets = [
        {**targets[0], "dsn": "${env:DROP_PG_DSN}"},
        targets[1],
        {
            **iceberg,
            "kind": "iceberg",
            "catalog": {**iceberg["catalog"], "uri": "${env:DROP_ICEBERG_URI}"},
        },
    ]
    job_file.write_text(
        json.dumps(
            {
                "job_id": job_id,
                "decision_store": str(store),
                "on_bad_rows": "dead_letter",
                "max_bad_rows": 10,
                "dead_letter": dead_letter,
                "sinks": file_targets,
            }
        )
    )

    def run(*args: str) -> Result:
        result = CliRunner().invoke(
            main, [args[0], job_id, "-f", str(job_file), *args[1:]], env=env
        )
        assert postgres.password not in result.output
        return result

    specs = [
        sink("postgres", dsn=postgres.conninfo(), table=f"{pg_schema}.events"),
        sink("delta", path=str(delta_path), create_table=True),
        sink("iceberg", **iceberg),
    ]
    options = JobOptions(
        job_id=job_id,
        decision_store=str(store),
        on_bad_rows="dead_letter",
        max_bad_rows=10,
        dead_letter=sink("jsonl", path=str(letters), name="dead_letters"),
    )
    coordinator = started(build_coordinator(specs, options))
    assert coordinator.run_epoch(0, [rows(0, 5, bad=2)]).outcome is EpochOutcome.COMMITTED
    assert coordinator.run_epoch(1, [rows(5, 3)]).outcome is EpochOutcome.COMMITTED
    coordinator.close()
    assert job_rows(conn, pg_schema, job_id) == {
        "durable_sinks_epochs": 2,
        "durable_sinks_fences": 1,
    }
    delta_before, letters_before = listing(delta_path), listing(letters)
    warehouse_before = listing(catalog.warehouse)
    property_key = f"durable-sinks.{component(job_id)}.iceberg.epoch"
    journal_key = f"durable-sinks.{component(job_id)}.iceberg.journal"

    def iceberg_properties() -> dict[str, str]:
        return dict(catalog.catalog().load_table(catalog.identifier()).metadata.properties)

    assert iceberg_properties()[property_key] == "1"

    dry = run("drop")
    assert dry.exit_code == 0, dry.output
    for shown in (
        "marker rows",
        "application transaction (txn)",
        "journal folders (empty)",
        "snapshot summaries",
        f"table property {property_key}",
        f"table property {journal_key}",
        "epoch markers _EPOCH.json",
        "decision store folder",
    ):
        assert shown in dry.output, shown
    assert "dead_letters" in dry.output
    assert (listing(delta_path), listing(letters)) == (delta_before, letters_before)

    applied = run("drop", "--apply", "--live-window", "0")
    assert applied.exit_code == 0, applied.output
    assert job_rows(conn, pg_schema, job_id) == dict.fromkeys(SINK_TABLES, 0)
    assert not (store / component(job_id)).exists()
    # The Delta table's folder holds its log and data files only: no journal or staged rows.
    assert all(
        f.startswith("_delta_log/") or (f.startswith("part-") and f.endswith(".parquet"))
        for f in listing(delta_path)
    ), listing(delta_path)
    assert not (delta_path / "_durable_sinks" / component(job_id)).exists()
    # The Iceberg table: its properties gone in one metadata-only commit (a new metadata
    # file, no new snapshot: the same data files), its history kept.
    assert not {property_key, journal_key} & set(iceberg_properties())
    added = sorted(set(listing(catalog.warehouse)) - set(warehouse_before))
    assert set(warehouse_before) <= set(listing(catalog.warehouse))
    assert [a.endswith(".metadata.json") for a in added] == [True], added
    # The dead-letter folder: its letters and (kept) epoch markers, no staging.
    assert not (letters / "_staging").exists()
    assert listing(letters) == [f for f in letters_before if not f.startswith("_staging")]
    assert "epoch=0/part=0/rows.jsonl" in listing(letters)

    markers = run("drop", "--apply", "--epoch-markers", "--live-window", "0")
    assert markers.exit_code == 0, markers.output
    assert not [f for f in listing(letters) if f.endswith("_EPOCH.json")]
    again = run("drop")
    assert again.exit_code == 0, again.output
    assert "0 kind(s) of bookkeeping" in again.output

    # Every row is where it was.
    good = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(pg_schema, "events"))
    ).fetchone()
    assert good == (6,)
    from deltalake import DeltaTable

    assert DeltaTable(str(delta_path)).to_pyarrow_table().num_rows == 8
    assert len(catalog.rows()) == 8
    dead = [
        json.loads(line)
        for f in letters.rglob("*.jsonl")
        for line in f.read_text().splitlines()
        if line
    ]
    assert len(dead) == 2
