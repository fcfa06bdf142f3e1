"""Executor mode's Iceberg tasks with the driver's task brief, on the test bed's catalogs (the
SQL catalog in Postgres with a local warehouse; the SeaweedFS REST catalog on S3): a task
opened with the brief writes and prepares without a catalog, the driver commits, pyiceberg
reads the rows back; a table changed by another writer between the brief and the commit is
caught at the commit as before; and the epoch journal's entries of task attempts that began
after their epoch's sweeps are cleaned by the running job."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, prepare_part
from durable_sinks.coordinator._coordinator import LATE_SWEEP_EPOCHS
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle, OpenContext
from durable_sinks.core.redaction import is_secret
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from durable_sinks.sinks.iceberg import journal
from durable_sinks.sinks.iceberg.sink import IcebergSink
from tests.integration.test_iceberg_sink import catalog, events, ids, with_table
from tests.support.iceberg_target import CatalogUnderTest

__all__ = ["catalog"]  # the fixture, one per catalog kind
#: A password inside a URL (`scheme://user:password@host`).
URL = re.compile(r"://[^/:@\s]*:(?P<password>[^@/\s]+)@")


def build(catalog: CatalogUnderTest) -> Any:
    def built() -> list[Any]:
        return [create("iceberg", catalog.sink_options())]

    return built


def loads_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any catalog loaded from now on fails the test (the workers' opens)."""
    import pyiceberg.catalog

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a task with a brief loaded the catalog")

    monkeypatch.setattr(pyiceberg.catalog, "load_catalog", refused)


def test_tasks_with_the_brief_write_without_a_catalog_and_the_driver_commits(
    catalog: CatalogUnderTest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_table(catalog)
    job = Coordinator(
        "orders", build(catalog)(), LocalDirectoryStore(tmp_path / "store"), executor_mode=True
    )
    job.start()
    briefs: list[dict[str, bytes]] = []

    def prepare(epoch: int, parts: dict[str, list[int]]) -> Any:
        def run(generation: int) -> list[CommitHandle]:
            given = job.task_briefs(epoch)
            briefs.append(given)
            with monkeypatch.context() as patched:
                loads_refused(patched)
                return [
                    handle
                    for part, rows in parts.items()
                    for handle in prepare_part(
                        "orders",
                        generation,
                        epoch,
                        part,
                        build(catalog),
                        [events(rows)],
                        briefs=given,
                    )
                ]

        return run

    first = job.run_distributed_epoch(0, prepare(0, {"p0-t0": [1, 2], "p1-t1": [3]}))
    second = job.run_distributed_epoch(1, prepare(1, {"p0-t2": [4]}))
    job.close()
    assert first.outcome is second.outcome is EpochOutcome.COMMITTED
    assert [set(b) for b in briefs] == [{"iceberg"}, {"iceberg"}]
    assert ids(catalog) == [1, 2, 3, 4]
    table = catalog.catalog().load_table(catalog.identifier())
    epochs = [s.summary.get("durable-sinks.epoch") for s in table.snapshots() if s.summary]
    assert epochs == ["0", "1"]
    # The second epoch's brief is the table as the first epoch's commit left it.
    snapshot = json.loads(briefs[1]["iceberg"])["metadata"]["current-snapshot-id"]
    assert snapshot == table.snapshots()[0].snapshot_id
    assert catalog.data_locations(journal=True) == []
    secrets = [v for k, v in catalog.properties().items() if is_secret(k)]
    secrets += [m["password"] for v in catalog.properties().values() for m in URL.finditer(v)]
    assert secrets  # the REST catalog's credential and S3 keys; the SQL catalog's password
    for secret in secrets:
        assert secret.encode() not in briefs[0]["iceberg"]


def test_a_table_another_writer_changed_after_the_brief_is_caught_at_the_commit(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    """Another writer adds a column and appends rows after the driver briefed the tasks: the
    tasks write for the briefed schema; the driver's commit, which asserts that the main
    branch has not moved since its read, loses the race, reads the table again and commits
    the epoch once, on top of the other writer's rows (the new column null in the epoch's
    files, read by field id)."""
    from pyiceberg.types import StringType

    with_table(catalog)
    sink = build(catalog)()[0]
    job = Coordinator("orders", [sink], LocalDirectoryStore(tmp_path / "store"), executor_mode=True)
    job.start()

    def run(generation: int) -> list[CommitHandle]:
        given = job.task_briefs(0)
        table = catalog.catalog().load_table(catalog.identifier())
        with table.update_schema() as update:
            update.add_column("extra", StringType())
        table = catalog.catalog().load_table(catalog.identifier())
        other = {"id": [1000], "body": ["theirs"], "extra": ["x"]}
        table.append(pa.Table.from_pydict(other, schema=table.schema().as_arrow()))
        return prepare_part(
            "orders", generation, 0, "p0-t0", build(catalog), [events([1])], briefs=given
        )

    assert job.run_distributed_epoch(0, run).outcome is EpochOutcome.COMMITTED
    assert sink.metrics()["commit_conflicts"] == 1
    job.close()
    assert ids(catalog) == [1, 1000]
    assert {r["id"]: r["extra"] for r in catalog.rows()} == {1: None, 1000: "x"}


@pytest.mark.parametrize(
    "catalog", ["sql", pytest.param("rest", marks=pytest.mark.crash_tier)], indirect=True
)
def test_journal_entries_of_attempts_begun_after_their_epochs_sweeps_are_cleaned(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    """Two journal entries nobody deleted before: a task attempt of epoch 0 killed after its
    first entry (no handle, no data file) and a late attempt of epoch 0 that prepared after
    the epoch's commit deleted the journal in one batch, both after epoch 1's sweep. The
    running job rolls both back (the late attempt's file too) at epoch LATE_SWEEP_EPOCHS."""
    with_table(catalog)
    built = build(catalog)
    job = Coordinator(
        "orders", built(), LocalDirectoryStore(tmp_path / "store"), executor_mode=True
    )
    job.start()
    generation = job.generation
    assert generation is not None

    def run(epoch: int) -> None:
        job.run_distributed_epoch(
            epoch,
            lambda g: prepare_part(
                "orders",
                g,
                epoch,
                f"p0-t{epoch}",
                built,
                [events([epoch])],
                briefs=job.task_briefs(epoch),
            ),
        )

    run(0)
    run(1)
    # killed after its first journal entry
    (killed,) = built()
    assert isinstance(killed, IcebergSink)
    killed.open(OpenContext("orders", killed.name, generation, worker=True, part="p0-t90"))
    table = catalog.catalog().load_table(catalog.identifier())
    name = ParticipantName.build("orders", killed.name, 0, "p0-t90", generation, 1)
    journal.write(killed, table.io, table.location_provider().data_path, name, None)
    # a late attempt that prepared
    prepare_part("orders", generation, 0, "p0-t91", built, [events([91])])
    assert len(catalog.data_locations(journal=True)) == 2
    assert len(catalog.data_locations()) == 3
    for epoch in range(2, LATE_SWEEP_EPOCHS + 1):
        run(epoch)
    job.close()
    assert catalog.data_locations(journal=True) == []
    assert ids(catalog) == list(range(LATE_SWEEP_EPOCHS + 1))
    assert len(catalog.data_locations()) == LATE_SWEEP_EPOCHS + 1


def test_a_task_without_a_brief_still_writes_by_opening_the_catalog(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    """A driver of an older release (no brief): the task opens the catalog itself."""
    with_table(catalog)
    job = Coordinator(
        "orders", build(catalog)(), LocalDirectoryStore(tmp_path / "store"), executor_mode=True
    )
    job.start()
    job.run_distributed_epoch(
        0, lambda g: prepare_part("orders", g, 0, "p0-t0", build(catalog), [events([1, 2])])
    )
    job.close()
    assert ids(catalog) == [1, 2]
    rows = pa.Table.from_pylist(catalog.rows())
    assert rows.num_rows == 2
