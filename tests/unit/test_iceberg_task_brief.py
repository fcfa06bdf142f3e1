"""The Iceberg sink's task brief (sinks/iceberg/task_brief.py), on pyiceberg's SQL catalog in
a SQLite file with a local warehouse: what the driver gives tasks rebuilds the table without
a catalog, holds no secret of the sink's configuration, and a task given none, or one it
cannot read, opens the catalog as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks.core import OpenContext, TaskBriefing
from durable_sinks.sinks import create
from durable_sinks.sinks.iceberg import task_brief
from durable_sinks.sinks.iceberg.config import Iceberg
from durable_sinks.sinks.iceberg.handles import paths_of
from durable_sinks.sinks.iceberg.sink import IcebergSink

#: Secrets the sink's configuration holds: none may be in a brief.
SECRETS = {
    "s3.secret-access-key": "brief-test-secret-key-0123",
    "s3.access-key-id": "brief-test-access-id-4567",
    "token": "brief-test-token-89ab",
}


def events(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "body": pa.array([f"row {i}" for i in ids], pa.string()),
        }
    )


def catalog_properties(tmp_path: Path) -> dict[str, str]:
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": f"file://{tmp_path / 'warehouse'}",
        "s3.endpoint": "http://127.0.0.1:1",
        **SECRETS,
    }


def options(tmp_path: Path) -> dict[str, Any]:
    return {
        "catalog": catalog_properties(tmp_path),
        "catalog_name": "briefs",
        "namespace": "analytics",
        "table": "events",
    }


@pytest.fixture
def table(tmp_path: Path) -> Any:
    """A table with a history: two schemas, two snapshots."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.types import StringType

    catalog = load_catalog("briefs", **catalog_properties(tmp_path))
    catalog.create_namespace("analytics")
    made = catalog.create_table(("analytics", "events"), schema=events([]).schema)
    made.append(pa.Table.from_batches([events([1])]))
    with made.update_schema() as update:
        update.add_column("extra", StringType())
    with made.transaction() as tx:
        tx.set_properties({"write.parquet.compression-level": "3"})
    made = catalog.load_table(("analytics", "events"))
    made.append(
        pa.Table.from_pydict(
            {"id": [2], "body": ["row 2"], "extra": ["x"]},
            schema=made.schema().as_arrow(),
        )
    )
    return catalog.load_table(("analytics", "events"))


def driver(tmp_path: Path) -> IcebergSink:
    sink = create("iceberg", options(tmp_path))
    assert isinstance(sink, IcebergSink)
    sink.open(OpenContext("orders", sink.name, 1))
    return sink


def worker(tmp_path: Path, brief: bytes | None, part: str = "p0-t0") -> IcebergSink:
    sink = create("iceberg", options(tmp_path))
    assert isinstance(sink, IcebergSink)
    sink.open(OpenContext("orders", sink.name, 1, worker=True, part=part, task_brief=brief))
    return sink


def test_the_brief_rebuilds_the_table_trimmed_to_what_a_writer_reads(
    tmp_path: Path, table: Any
) -> None:
    sink = driver(tmp_path)
    assert isinstance(sink, TaskBriefing)
    brief = sink.task_brief(4)
    assert brief is not None
    found = task_brief.table_of(brief, Iceberg(**options(tmp_path)))
    assert found is not None
    epoch, rebuilt = found
    assert epoch == 4
    assert rebuilt.schema() == table.schema()
    assert rebuilt.spec() == table.spec()
    assert rebuilt.location() == table.location()
    assert rebuilt.metadata.current_snapshot_id == table.metadata.current_snapshot_id
    assert len(table.metadata.schemas) == 2
    assert len(rebuilt.metadata.schemas) == 1  # the current one only
    assert len(table.snapshots()) == 2
    assert [s.snapshot_id for s in rebuilt.snapshots()] == [table.metadata.current_snapshot_id]
    assert rebuilt.metadata.properties["write.parquet.compression-level"] == "3"
    assert rebuilt.io.properties["s3.secret-access-key"] == SECRETS["s3.secret-access-key"]


def test_the_brief_holds_no_secret_of_the_sinks_configuration(tmp_path: Path, table: Any) -> None:
    brief = driver(tmp_path).task_brief(0)
    assert brief is not None
    for secret in SECRETS.values():
        assert secret.encode() not in brief
    content = json.loads(brief)
    assert content["io"]["s3.endpoint"] == "http://127.0.0.1:1"  # what is not secret travels


def test_no_brief_when_the_catalog_vended_credentials_the_configuration_lacks(
    tmp_path: Path, table: Any
) -> None:
    """Credentials in the table's FileIO that the sink's configuration does not hold (what a
    REST catalog vends with the table) cannot be rebuilt by a task: no brief, and the tasks
    open the catalog themselves."""
    table.io.properties["s3.session-token"] = "vended-0123"
    assert task_brief.of(table, 0, Iceberg(**options(tmp_path))) is None


def test_no_brief_when_a_table_property_holds_a_secret(tmp_path: Path, table: Any) -> None:
    """A table property whose name looks secret is never in a brief, and as the catalog
    hands table properties to the table's FileIO too, a task could not rebuild that FileIO
    without it: no brief then."""
    with table.transaction() as tx:
        tx.set_properties({"s3.secret-access-key": "from-the-table-cdef"})
    assert driver(tmp_path).task_brief(0) is None


def test_a_task_with_the_brief_writes_without_opening_the_catalog(
    tmp_path: Path, table: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    brief = driver(tmp_path).task_brief(7)
    import pyiceberg.catalog

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a briefed task loaded the catalog")

    monkeypatch.setattr(pyiceberg.catalog, "load_catalog", refused)
    sink = worker(tmp_path, brief)
    sink.begin_epoch(7)
    sink.write_batch(
        pa.record_batch({"id": [10], "body": ["row 10"], "extra": ["e"]}),
    )
    handle = sink.pre_commit(7)
    (path,) = paths_of(handle)
    assert path.startswith(table.location())
    assert handle.rows == 1


@pytest.mark.parametrize(
    "brief",
    [
        None,
        b"not json",
        json.dumps({"v": 999, "epoch": 7, "io": {}, "metadata": {}}).encode(),
        json.dumps({"v": 1, "epoch": 7, "io": {}, "metadata": {"nonsense": 1}}).encode(),
    ],
    ids=["none", "not-json", "other-version", "bad-metadata"],
)
def test_without_a_brief_it_reads_the_task_opens_the_catalog(
    tmp_path: Path, table: Any, brief: bytes | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No brief (a driver of an older release, or a sink that gave none) or one the task
    cannot read: the task opens the catalog and loads the table itself, and writes."""
    import pyiceberg.catalog

    loads: list[str] = []
    load_catalog = pyiceberg.catalog.load_catalog

    def counted(name: str, **properties: Any) -> Any:
        loads.append(name)
        return load_catalog(name, **properties)

    monkeypatch.setattr(pyiceberg.catalog, "load_catalog", counted)
    sink = worker(tmp_path, brief)
    assert loads == ["briefs"]
    sink.begin_epoch(7)
    sink.write_batch(pa.record_batch({"id": [10], "body": ["row 10"], "extra": ["e"]}))
    assert sink.pre_commit(7).rows == 1


def test_a_brief_of_another_epoch_is_read_again(
    tmp_path: Path, table: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker begun for another epoch than its brief's reads the table through the
    catalog (the brief is the table as the driver saw it for that epoch only)."""
    sink = worker(tmp_path, driver(tmp_path).task_brief(3))
    loads: list[Any] = []
    from durable_sinks.sinks.iceberg.table import IcebergTable

    reload = IcebergTable.reload

    def counted(self: IcebergTable, epoch: int | None = None) -> Any:
        loads.append(epoch)
        return reload(self, epoch)

    monkeypatch.setattr(IcebergTable, "reload", counted)
    sink.begin_epoch(4)
    assert loads == [4]


def test_without_a_table_there_is_no_brief(tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog

    load_catalog("briefs", **catalog_properties(tmp_path)).create_namespace("analytics")
    sink = create("iceberg", {**options(tmp_path), "create_table": True})
    sink.open(OpenContext("orders", sink.name, 1))
    assert isinstance(sink, IcebergSink)
    assert sink.task_brief(0) is None
