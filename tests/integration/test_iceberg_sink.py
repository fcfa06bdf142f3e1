"""The Iceberg sink on pyiceberg's SQL catalog (a schema of its own in the test bed's Postgres,
a local warehouse) and on the test bed's SeaweedFS Iceberg REST catalog (a namespace of its
own, data files on S3): each epoch one commit, exactly once, whatever is replayed, crashes or
races; refusals at start with nothing written; rollbacks leave no file of the epoch. Read
back with pyiceberg scans."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, prepare_part
from durable_sinks.core.errors import (
    ConfigError,
    InDoubtError,
    ParticipantLostError,
    SchemaMismatchError,
    UnreachableError,
)
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle, CommitOutcome, OpenContext
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from durable_sinks.sinks.iceberg import Iceberg, partitioning
from durable_sinks.sinks.iceberg import committer as iceberg_committer
from durable_sinks.sinks.iceberg.errors import CommitConflictError
from durable_sinks.sinks.iceberg.handles import IcebergHandleDetails, paths_of
from durable_sinks.sinks.iceberg.sink import IcebergSink
from durable_sinks.sinks.iceberg.table import IcebergTable
from tests.services import IcebergRestEndpoint, PostgresEndpoint
from tests.support.iceberg_target import CatalogUnderTest, IcebergCatalog, RestIcebergCatalog


def made_catalog(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> CatalogUnderTest:
    if kind == "sql":
        return IcebergCatalog(request.getfixturevalue("postgres"), tmp_path)
    return RestIcebergCatalog(request.getfixturevalue("iceberg_rest"))


@pytest.fixture(params=["sql", "rest"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CatalogUnderTest]:
    """Each catalog kind: a SQL catalog with a local warehouse, the REST catalog on S3."""
    made = made_catalog(request.param, request, tmp_path)
    try:
        yield made
    finally:
        made.drop()


@pytest.fixture
def sql_catalog(postgres: PostgresEndpoint, tmp_path: Path) -> Iterator[IcebergCatalog]:
    made = IcebergCatalog(postgres, tmp_path)
    try:
        yield made
    finally:
        made.drop()


def events(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "body": pa.array([f"row {i}" for i in ids], pa.string())}
    )


def ids(catalog: CatalogUnderTest) -> list[int]:
    return sorted(r["id"] for r in catalog.rows())


def coordinator(
    catalog: CatalogUnderTest, tmp_path: Path, job: str = "orders", **options: Any
) -> Coordinator:
    sink = create("iceberg", catalog.sink_options(**options))
    made = Coordinator(job, [sink], LocalDirectoryStore(tmp_path / f"store-{job}"))
    made.start()
    return made


def committed(sink: IcebergSink, epoch: int, handle: CommitHandle) -> CommitOutcome:
    """The participant's commit, then the epoch's (what the coordinator does for one)."""
    sink.commit_epoch(epoch, handle)
    return sink.publish_epoch(epoch, [handle])


def with_table(catalog: CatalogUnderTest) -> None:
    """The catalog's namespace and an empty table of `events`' columns in it."""
    catalog.create_namespace()
    catalog.catalog().create_table(catalog.identifier(), schema=events([]).schema)


def prepared(sink: IcebergSink, epoch: int, batch: pa.RecordBatch) -> CommitHandle:
    """One participant of `epoch` holding `batch`, prepared."""
    sink.begin_epoch(epoch)
    sink.write_batch(batch)
    return sink.pre_commit(epoch)


def opened(catalog: CatalogUnderTest, job: str = "orders", generation: int = 1) -> IcebergSink:
    sink = create("iceberg", catalog.sink_options())
    assert isinstance(sink, IcebergSink)
    sink.open(OpenContext(job, sink.name, generation))
    return sink


def test_each_epoch_is_one_commit_with_the_epoch_property_and_summary(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    catalog.create_namespace()
    job = coordinator(catalog, tmp_path, create_table=True)
    job.run_epoch(0, [events([1, 2]), events([3])])
    job.run_epoch(1, [events([4])])
    job.run_epoch(2, [])
    job.close()
    assert ids(catalog) == [1, 2, 3, 4]
    table = catalog.catalog().load_table(catalog.identifier())
    assert table.properties["durable-sinks.orders.iceberg.epoch"] == "2"
    summaries = [s.summary for s in table.snapshots() if s.summary is not None]
    epochs = [s.get("durable-sinks.epoch") for s in summaries]
    assert epochs == ["0", "1", "2"]
    assert {s.get("durable-sinks.job") for s in summaries} == {"orders"}
    # Pyiceberg's own retries stay as the table had them: off only in memory for our commits.
    assert "commit.retry.num-retries" not in table.properties


def test_a_replayed_commit_and_a_replayed_epoch_are_no_ops(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    with_table(catalog)
    sink = opened(catalog)
    handle = prepared(sink, 0, events([1, 2]))
    files = IcebergHandleDetails.of(handle).files
    scheme = "file://" if catalog.kind == "sql" else "s3://"
    assert [(f.rows, f.size > 0, f.path.startswith(scheme)) for f in files] == [(2, True, True)]
    assert committed(sink, 0, handle) is CommitOutcome.COMMITTED
    assert committed(sink, 0, handle) is CommitOutcome.ALREADY_COMMITTED
    other = opened(catalog, generation=2)  # another process, from the handle alone
    assert committed(other, 0, handle) is CommitOutcome.ALREADY_COMMITTED
    assert other.last_committed_epoch() == 0
    assert ids(catalog) == [1, 2]
    first = coordinator(catalog, tmp_path, job="replayed")
    first.run_epoch(0, [events([3])])
    first.close()
    again = coordinator(catalog, tmp_path, job="replayed")
    again.run_epoch(0, [events([3])])  # Spark replays the batch after a restart
    again.run_epoch(1, [events([4])])
    again.close()
    assert ids(catalog) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("crash_after", "committed"),
    [("after-pre-commit:iceberg", False), ("after-decision", True)],
)
def test_a_crash_after_prepare_is_settled_by_the_next_start(
    catalog: CatalogUnderTest, tmp_path: Path, crash_after: str, committed: bool
) -> None:
    catalog.create_namespace()
    first = coordinator(catalog, tmp_path, create_table=True)
    first.run_epoch(0, [events([1])])
    for step in first.epoch_steps(1, [events([2, 3])]):
        if step == crash_after:
            break  # the driver dies here: nothing cleaned up
    else:
        raise AssertionError(f"the epoch never reached {crash_after}")
    assert ids(catalog) == [1]
    files_before = catalog.data_locations()
    second = coordinator(catalog, tmp_path, create_table=True)
    assert ids(catalog) == ([1, 2, 3] if committed else [1])
    if not committed:  # rolled back: the epoch's files are gone
        assert len(catalog.data_locations()) < len(files_before)
    second.run_epoch(1, [events([2, 3])])
    second.run_epoch(2, [events([4])])
    second.close()
    assert ids(catalog) == [1, 2, 3, 4]
    table = catalog.catalog().load_table(catalog.identifier())
    referenced = {str(t.file.file_path) for t in table.scan().plan_files()}
    assert set(catalog.data_locations()) == referenced  # no orphan is left


def test_a_rollback_leaves_no_file_of_the_epoch(catalog: CatalogUnderTest) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(  # each record batch a row group: the file exists at once
        catalog.identifier(),
        schema=events([]).schema,
        properties={"write.parquet.row-group-limit": "1"},
    )
    sink = opened(catalog)
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    sink.write_batch(events([2]))
    handle = sink.pre_commit(0)
    assert len(catalog.data_locations()) == 1  # the epoch's record batches are one data file
    assert [f.rows for f in IcebergHandleDetails.of(handle).files] == [2]
    sink.rollback_epoch(0, handle)
    sink.rollback_epoch(0, handle)  # again: the files are gone already
    assert catalog.data_locations() == []
    sink.begin_epoch(1)
    sink.write_batch(events([3]))
    if catalog.kind == "sql":  # (on S3 an object is there once its upload completes)
        assert len(catalog.data_locations()) == 1  # still being written
    sink.rollback_epoch(1, None)  # never prepared
    assert catalog.data_locations() == []
    sink.begin_epoch(2)
    sink.write_batch(events([4]))
    sink.begin_epoch(2)  # the attempt before was neither prepared nor rolled back
    assert catalog.data_locations() == []
    sink.close()
    assert ids(catalog) == []


def test_an_epochs_data_file_is_the_one_pyicebergs_writer_makes_of_its_rows(
    catalog: CatalogUnderTest,
) -> None:
    import itertools

    import pyarrow.parquet as pq

    from durable_sinks.sinks.iceberg import _pyiceberg
    from durable_sinks.sinks.iceberg.handles import data_files_of

    catalog.create_namespace()
    table = catalog.catalog().create_table(catalog.identifier(), schema=events([]).schema)
    batches = [events(list(range(at, at + 500))) for at in range(0, 1500, 500)]
    sink = opened(catalog)
    sink.begin_epoch(0)
    for batch in batches:
        sink.write_batch(batch)
    handle = sink.pre_commit(0)
    [ours] = data_files_of(handle, table)
    [theirs] = _pyiceberg.write_data_files(
        table, pa.Table.from_batches(batches), uuid.uuid4(), itertools.count(0)
    )
    try:
        fields = ["record_count", "value_counts", "null_value_counts", "lower_bounds"]
        fields += ["upper_bounds", "column_sizes", "file_format", "split_offsets"]
        assert {f: getattr(ours, f) for f in fields} == {f: getattr(theirs, f) for f in fields}
        assert ours.file_size_in_bytes == theirs.file_size_in_bytes
        with table.io.new_input(str(ours.file_path)).open() as stream:
            assert pq.ParquetFile(stream).metadata.num_row_groups == 1
    finally:
        table.io.delete(str(theirs.file_path))
        sink.rollback_epoch(0, handle)


def test_a_data_file_ends_at_the_tables_target_file_size(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(
        catalog.identifier(),
        schema=events([]).schema,
        properties={"write.target-file-size-bytes": "1"},
    )
    job = coordinator(catalog, tmp_path)
    job.run_epoch(0, [events([1, 2]), events([3]), events([4])])
    job.close()
    assert ids(catalog) == [1, 2, 3, 4]
    table = catalog.catalog().load_table(catalog.identifier())
    rows = sorted(t.file.record_count for t in table.scan().plan_files())
    assert rows == [1, 1, 2]
    assert len(catalog.data_locations()) == 3


def test_a_commit_of_a_committed_epoch_never_deletes_its_files(catalog: CatalogUnderTest) -> None:
    with_table(catalog)
    sink = opened(catalog)
    winner = prepared(sink, 0, events([1]))
    loser = prepared(sink, 0, events([1]))
    committed(sink, 0, winner)
    sink.rollback_epoch(0, winner)  # a wrong rollback of the committed participant: refused
    sink.rollback_epoch(0, loser)  # the losing attempt's files go
    assert ids(catalog) == [1]
    assert len(catalog.data_locations()) == 1


def test_a_stale_writer_is_retried_after_rechecking_the_epoch(
    catalog: CatalogUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_table(catalog)
    sink = opened(catalog)
    handle = prepared(sink, 0, events([1]))
    commit = iceberg_committer._commit
    raced: list[int] = []

    def racing(
        sink: IcebergSink, tables: Any, table: Any, epoch: int, files: Any, names: Any
    ) -> None:
        if not raced:  # another writer appends between our read and our commit
            raced.append(epoch)
            catalog.catalog().load_table(catalog.identifier()).append(pa.table(events([100])))
        commit(sink, tables, table, epoch, files, names)

    monkeypatch.setattr(iceberg_committer, "_commit", racing)
    assert committed(sink, 0, handle) is CommitOutcome.COMMITTED
    assert sink.metrics()["commit_conflicts"] == 1
    assert ids(catalog) == [1, 100]

    # The race is with our own epoch committed by another process: the retry skips it.
    handle = prepared(sink, 1, events([2]))
    raced.clear()

    def replayed(
        sink: IcebergSink, tables: Any, table: Any, epoch: int, files: Any, names: Any
    ) -> None:
        if not raced:
            raced.append(epoch)
            assert committed(opened(catalog, generation=2), 1, handle) is CommitOutcome.COMMITTED
        commit(sink, tables, table, epoch, files, names)

    monkeypatch.setattr(iceberg_committer, "_commit", replayed)
    assert committed(sink, 1, handle) is CommitOutcome.ALREADY_COMMITTED
    assert ids(catalog) == [1, 2, 100]

    # Committed by another process after this one last read the table (at the epoch's start):
    # the commit from that read loses the race, and the fresh read shows the epoch.
    monkeypatch.setattr(iceberg_committer, "_commit", commit)
    handle = prepared(sink, 2, events([3]))
    assert committed(opened(catalog, generation=3), 2, handle) is CommitOutcome.COMMITTED
    assert committed(sink, 2, handle) is CommitOutcome.ALREADY_COMMITTED
    assert sink.metrics()["commit_conflicts"] == 3
    assert ids(catalog) == [1, 2, 3, 100]


def test_a_bad_catalog_uri_is_refused_at_start_with_nothing_written(
    sql_catalog: IcebergCatalog, tmp_path: Path
) -> None:
    catalog = sql_catalog
    catalog.create_namespace()
    closed = {**catalog.sink_options(create_table=True)}
    closed["catalog"] = {**closed["catalog"], "uri": catalog.uri(port=1)}
    job = Coordinator("orders", [create("iceberg", closed)], LocalDirectoryStore(tmp_path / "s"))
    with pytest.raises(UnreachableError) as refused:
        job.start()
    assert catalog.postgres.password not in str(refused.value)
    unknown = {**closed, "catalog": {**closed["catalog"], "uri": "nosuchdb://x/y"}}
    job = Coordinator("orders", [create("iceberg", unknown)], LocalDirectoryStore(tmp_path / "t"))
    with pytest.raises(ConfigError):
        job.start()
    assert catalog.data_locations() == []
    assert catalog.postgres.password not in repr(create("iceberg", closed))


def test_a_missing_namespace_or_table_is_refused_at_start(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    job = Coordinator(
        "orders",
        [create("iceberg", catalog.sink_options(create_table=True))],
        LocalDirectoryStore(tmp_path / "s"),
    )
    with pytest.raises(ConfigError, match=f"no namespace '{catalog.namespace}'") as refused:
        job.start()
    assert "create_namespace" in str(refused.value)
    catalog.create_namespace()
    job = Coordinator(
        "orders", [create("iceberg", catalog.sink_options())], LocalDirectoryStore(tmp_path / "t")
    )
    with pytest.raises(ConfigError, match="no Iceberg table") as refused:
        job.start()
    assert "create_table=True" in str(refused.value)
    assert catalog.data_locations() == []


def test_rows_that_do_not_fit_the_table_are_refused_with_nothing_written(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    with_table(catalog)
    job = coordinator(catalog, tmp_path, job=f"j{uuid.uuid4().hex[:6]}")
    job.run_epoch(0, [events([1])])
    bad = {
        "column 'extra' is not in the table": events([2]).append_column("extra", pa.array([1])),
        "column 'body' is missing": pa.record_batch({"id": pa.array([2], pa.int64())}),
        "column 'id' is string": pa.record_batch({"id": ["2"], "body": ["x"]}),
    }
    before = catalog.data_locations()
    for expected, batch in bad.items():
        with pytest.raises(SchemaMismatchError, match=expected) as refused:
            job.run_epoch(1, [events([5]), batch])
        assert "nothing of the epoch was committed" in str(refused.value)
        assert ids(catalog) == [1]
        assert catalog.data_locations() == before
    narrow = pa.record_batch({"id": pa.array([2], pa.int32()), "body": pa.array(["x"])})
    job.run_epoch(1, [narrow])
    job.close()
    assert ids(catalog) == [1, 2]


def test_recovery_hands_back_only_what_the_table_does_not_hold(
    catalog: CatalogUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which participants an epoch committed is read from its snapshot's summary: the
    table's manifests (one more per epoch) are not read at start."""
    with_table(catalog)
    sink = opened(catalog)
    loser = prepared(sink, 0, events([1]))
    winner = prepared(sink, 0, events([1]))
    committed(sink, 0, winner)
    pending = prepared(sink, 1, events([2]))

    def unread(self: IcebergTable, table: Any) -> set[str]:
        raise AssertionError("recovery read every manifest of the table")

    with monkeypatch.context() as patched:
        patched.setattr(IcebergTable, "referenced", unread)
        later = opened(catalog, generation=2)
        found = later.recover_prepared()
    assert sorted(h.participant for h in found) == sorted([loser.participant, pending.participant])
    for handle in found:
        later.rollback_epoch(handle.epoch, handle)
    assert later.recover_prepared() == []
    assert ids(catalog) == [1]
    assert len(catalog.data_locations()) == 1


def journal_left(table: Any) -> list[str]:
    """Everything under the sink's journal folder, folders included."""
    from pyarrow.fs import FileSelector
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from durable_sinks.sinks.iceberg import journal
    from durable_sinks.sinks.iceberg.layout import Layout

    folder = journal.sink_folder(table.location_provider().data_path, Layout("orders", "iceberg"))
    scheme, netloc, path = PyArrowFileIO.parse_location(folder, table.io.properties)
    selector = FileSelector(path, recursive=True, allow_not_found=True)
    return [i.path for i in table.io.fs_by_scheme(scheme, netloc).get_file_info(selector)]


def test_a_start_with_nothing_left_lists_the_journal_alone(
    catalog: CatalogUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commit sets the journal property; a start then finds what is left prepared in the
    journal: with nothing there it neither reads the table again nor lists its data folder,
    whatever the table's history."""
    with_table(catalog)
    sink = opened(catalog)
    for epoch in range(3):
        committed(sink, epoch, prepared(sink, epoch, events([epoch])))
    table = catalog.catalog().load_table(catalog.identifier())
    assert journal_left(table) == []  # each commit deleted its entry and the epoch's folder
    assert table.properties["durable-sinks.orders.iceberg.journal"] == "1"

    def unread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the start read the table or its data folder")

    with monkeypatch.context() as patched:
        patched.setattr(IcebergTable, "listed", unread)
        patched.setattr(IcebergTable, "reload", unread)
        patched.setattr(IcebergTable, "appended", unread)
        assert opened(catalog, generation=2).recover_prepared() == []


def test_a_driver_stopped_mid_epoch_is_found_by_its_journal_entry(
    catalog: CatalogUnderTest,
) -> None:
    """The driver's entry is written before its first data file and names no handle (the
    decision record holds it): a start finds the participant by the entry and its files by
    their names, and the rollback removes both; a participant stopped before any file was
    written leaves only its entry, removed too."""
    with_table(catalog)
    sink = opened(catalog)
    committed(sink, 0, prepared(sink, 0, events([0])))
    pending = prepared(sink, 1, events([1]))
    sink.begin_epoch(2)
    sink.write_batch(events([2]))  # one data file begun, never finished
    sink.close()
    assert len(catalog.data_locations(journal=True)) == 2
    later = opened(catalog, generation=2)
    found = later.recover_prepared()
    assert [h.epoch for h in found] == [1, 2]
    assert found[0].participant == pending.participant
    assert sorted(paths_of(found[0])) == sorted(paths_of(pending))
    for handle in found:
        later.rollback_epoch(handle.epoch, handle)
    assert later.recover_prepared() == []
    assert journal_left(catalog.catalog().load_table(catalog.identifier())) == []
    assert ids(catalog) == [0]
    assert len(catalog.data_locations()) == 1


def test_an_entry_left_by_a_commit_that_stopped_is_deleted_not_handed_back(
    catalog: CatalogUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that stopped after the table took the epoch and before it deleted the
    epoch's entries: the next start reads the epoch's snapshot summary, deletes the entry,
    and hands back nothing."""
    from durable_sinks.sinks.iceberg import journal

    with_table(catalog)
    sink = opened(catalog)
    with monkeypatch.context() as patched:
        patched.setattr(journal, "delete", lambda *args: None)
        committed(sink, 0, prepared(sink, 0, events([0])))
    assert len(catalog.data_locations(journal=True)) == 1
    later = opened(catalog, generation=2)
    assert later.recover_prepared() == []
    assert catalog.data_locations(journal=True) == []
    assert ids(catalog) == [0]


def test_a_table_without_the_journal_property_is_recovered_from_its_data_folder(
    catalog: CatalogUnderTest,
) -> None:
    """A table whose commits were made by a release that journaled only tasks: a driver's
    participant left prepared there has files and no entry, found by listing the data
    folder until a commit of this release sets the property."""
    with_table(catalog)
    sink = opened(catalog)
    committed(sink, 0, prepared(sink, 0, events([0])))
    pending = prepared(sink, 1, events([1]))
    table = catalog.catalog().load_table(catalog.identifier())
    with table.transaction() as tx:
        tx.remove_properties("durable-sinks.orders.iceberg.journal")
    entries = catalog.data_locations(journal=True)
    assert len(entries) == 1
    table.io.delete(entries[0])  # an older release wrote no entry for the driver
    later = opened(catalog, generation=2)
    found = later.recover_prepared()
    assert [h.participant for h in found] == [pending.participant]
    later.rollback_epoch(1, found[0])
    assert len(catalog.data_locations()) == 1
    assert ids(catalog) == [0]


def test_recovery_finds_the_files_where_the_table_writes_them(sql_catalog: IcebergCatalog) -> None:
    """A table whose `write.data.path` is not `<location>/data`: recovery lists that folder."""
    catalog = sql_catalog
    catalog.create_namespace()
    elsewhere = f"file://{catalog.warehouse}/elsewhere"
    catalog.catalog().create_table(
        catalog.identifier(), schema=events([]).schema, properties={"write.data.path": elsewhere}
    )
    sink = opened(catalog)
    pending = prepared(sink, 0, events([1]))
    assert all(p.startswith(elsewhere) for p in paths_of(pending))
    later = opened(catalog, generation=2)
    found = later.recover_prepared()
    assert [h.participant for h in found] == [pending.participant]
    later.rollback_epoch(0, found[0])
    assert catalog.data_locations() == []


def test_a_commit_whose_outcome_is_unknown_is_in_doubt_and_keeps_its_files(
    catalog: CatalogUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_table(catalog)
    sink = opened(catalog)
    handle = prepared(sink, 0, events([1]))
    commit = iceberg_committer._commit

    def lost_answer(
        sink: IcebergSink, tables: Any, table: Any, epoch: int, files: Any, names: Any
    ) -> None:
        commit(
            sink, tables, table, epoch, files, names
        )  # the catalog took it, the answer never came
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(iceberg_committer, "_commit", lost_answer)
    with pytest.raises(InDoubtError):
        committed(sink, 0, handle)
    monkeypatch.setattr(iceberg_committer, "_commit", commit)
    assert len(catalog.data_locations()) == 1
    assert committed(opened(catalog, generation=2), 0, handle) is (CommitOutcome.ALREADY_COMMITTED)
    assert ids(catalog) == [1]


def test_a_partitioned_table_gets_files_per_partition(catalog: CatalogUnderTest) -> None:
    from pyiceberg.transforms import IdentityTransform

    catalog.create_namespace()
    schema = pa.schema([("id", pa.int64()), ("body", pa.string()), ("day", pa.string())])
    made = catalog.catalog().create_table(catalog.identifier(), schema=schema)
    day = made.schema().find_field("day").field_id
    with made.update_spec() as spec:
        spec.add_field("day", IdentityTransform(), "day")
    sink = opened(catalog)
    sink.begin_epoch(0)
    batch = pa.record_batch(
        {"id": [1, 2, 3], "body": ["a", "b", "c"], "day": ["d1", "d2", "d1"]}, schema=schema
    )
    sink.write_batch(batch)
    handle = sink.pre_commit(0)
    assert sorted("day=" in p for p in paths_of(handle)) == [True, True]
    committed(sink, 0, handle)
    table = catalog.catalog().load_table(catalog.identifier())
    assert table.spec().fields[0].source_id == day
    d1 = table.scan(row_filter="day == 'd1'").to_arrow()
    assert sorted(d1.column("id").to_pylist()) == [1, 3]


def stamped(ids: list[int], countries: list[str]) -> pa.RecordBatch:
    """Rows of a day each (2026-11-01 + id % 3), in `countries`."""
    import datetime

    days = [datetime.datetime(2026, 11, 1 + i % 3, 10, tzinfo=datetime.timezone.utc) for i in ids]
    return pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "country": pa.array(countries, pa.string()),
            "ts": pa.array(days, pa.timestamp("us", tz="UTC")),
        }
    )


def test_a_created_table_is_partitioned_by_partition_by_and_scans_prune(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    catalog.create_namespace()
    fields = ["day(ts)", "bucket(4, id)", "country"]
    job = coordinator(catalog, tmp_path, create_table=True, partition_by=fields)
    job.run_epoch(0, [stamped([0, 1, 2, 3], ["fr", "de", "fr", "de"])])
    job.run_epoch(1, [stamped([4, 5], ["fr", "fr"]), stamped([6], ["it"])])
    job.close()
    table = catalog.catalog().load_table(catalog.identifier())
    spec = [(f.column, f.transform) for f in partitioning.fields_of(table)]
    assert spec == [("ts", "day"), ("id", "bucket[4]"), ("country", "identity")]
    assert [f.name for f in table.spec().fields] == ["ts_day", "id_bucket_4", "country"]
    assert ids(catalog) == list(range(7))
    every = list(table.scan().plan_files())
    assert len(every) >= 5  # a file per partition the rows fall in, per epoch
    assert all(len(task.file.partition) == 3 for task in every)
    french = list(table.scan(row_filter="country == 'fr'").plan_files())
    assert 0 < len(french) < len(every)  # files of other countries pruned by their partition
    rows = table.scan(row_filter="country == 'fr'").to_arrow().column("id").to_pylist()
    assert sorted(rows) == [0, 2, 4, 5]


def test_partition_by_that_does_not_fit_is_refused_with_nothing_written(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    catalog.create_namespace()
    refusals = {
        "does not fit the rows: 'day\\(created\\)': the rows have no column": "day(created)",
        "'day\\(country\\)': day does not take column 'country' of type string": "day(country)",
    }
    for n, (expected, field) in enumerate(refusals.items()):
        job = coordinator(catalog, tmp_path, job=f"j{n}", create_table=True, partition_by=[field])
        with pytest.raises(ConfigError, match=expected):
            job.run_epoch(0, [stamped([1], ["fr"])])
        job.close()
        assert catalog.data_locations() == []
    # An existing table partitioned otherwise (here: not at all) is refused at start.
    catalog.catalog().create_table(catalog.identifier(), schema=stamped([], []).schema)
    refused = Coordinator(
        "other",
        [create("iceberg", catalog.sink_options(partition_by=["country"]))],
        LocalDirectoryStore(tmp_path / "s"),
    )
    with pytest.raises(ConfigError, match="is partitioned by nothing") as caught:
        refused.start()
    assert "partition_by only shapes a table the sink creates" in str(caught.value)
    assert catalog.data_locations() == []


def test_a_commit_that_keeps_losing_races_stops_at_the_bound(
    catalog: CatalogUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_table(catalog)
    sink = create("iceberg", catalog.sink_options(commit_retries=2))
    assert isinstance(sink, IcebergSink)
    sink.open(OpenContext("orders", sink.name, 1))
    handle = prepared(sink, 0, events([1]))
    commit = iceberg_committer._commit
    others = iter(range(100, 200))

    def always_raced(
        sink: IcebergSink, tables: Any, table: Any, epoch: int, files: Any, names: Any
    ) -> None:
        catalog.catalog().load_table(catalog.identifier()).append(pa.table(events([next(others)])))
        commit(sink, tables, table, epoch, files, names)

    monkeypatch.setattr(iceberg_committer, "_commit", always_raced)
    with pytest.raises(CommitConflictError, match="lost the race with other writers 3 times"):
        committed(sink, 0, handle)
    assert sink.metrics()["commit_conflicts"] == 3
    assert ids(catalog) == [100, 101, 102]  # nothing of the epoch
    monkeypatch.setattr(iceberg_committer, "_commit", commit)
    assert committed(sink, 0, handle) is CommitOutcome.COMMITTED  # the retry of the epoch
    assert ids(catalog) == [1, 100, 101, 102]


def test_executor_parts_are_one_commit_and_losing_attempts_are_deleted(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    with_table(catalog)

    def build() -> list[Any]:
        return [create("iceberg", catalog.sink_options())]

    def prepare(epoch: int, parts: dict[str, list[int]], losers: dict[str, list[int]]) -> Any:
        def run(generation: int) -> list[CommitHandle]:
            winners = []
            for part, rows in parts.items():
                winners += prepare_part("orders", generation, epoch, part, build, [events(rows)])
            for part, rows in losers.items():  # a failed or speculative twin of a part
                prepare_part("orders", generation, epoch, part, build, [events(rows)])
            return winners

        return run

    store = tmp_path / "store"
    job = Coordinator("orders", build(), LocalDirectoryStore(store), executor_mode=True)
    job.start()
    job.run_distributed_epoch(0, prepare(0, {"p0-t0": [1, 2], "p1-t1": [3]}, {"p1-t2": [3]}))
    job.run_distributed_epoch(1, prepare(1, {"p0-t3": [4]}, {}))
    assert ids(catalog) == [1, 2, 3, 4]
    table = catalog.catalog().load_table(catalog.identifier())
    summaries = [s.summary for s in table.snapshots() if s.summary is not None]
    assert [s.get("durable-sinks.epoch") for s in summaries] == ["0", "1"]
    assert len(json.loads(summaries[0]["durable-sinks.participants"])) == 2
    assert len(catalog.data_locations()) == 3  # the losing twin's file is gone

    # A driver that dies after its tasks prepared: the next start rolls the parts back, and
    # the replayed epoch lands once.
    steps = job.distributed_epoch_steps(2, prepare(2, {"p0-t4": [5], "p1-t5": [6]}, {}))
    while next(steps) != "after-prepare":
        pass
    assert len(catalog.data_locations()) == 5
    again = Coordinator("orders", build(), LocalDirectoryStore(store), executor_mode=True)
    report = again.start()
    assert len(report.rolled_back) == 2
    assert len(catalog.data_locations()) == 3
    again.run_distributed_epoch(2, prepare(2, {"p0-t6": [5], "p1-t7": [6]}, {}))
    again.close()
    assert ids(catalog) == [1, 2, 3, 4, 5, 6]
    assert len(catalog.data_locations()) == 5
    assert catalog.data_locations(journal=True) == []  # epoch 2's entries went in one batch


def test_a_handle_is_typed_json_that_appends_to_a_partitioned_table(
    catalog: CatalogUnderTest,
) -> None:
    from decimal import Decimal

    from pyiceberg.transforms import IdentityTransform

    catalog.create_namespace()
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("at", pa.timestamp("us")),
            ("kind", pa.string()),
            ("price", pa.decimal128(9, 2)),
            ("day", pa.date32()),
        ]
    )
    made = catalog.catalog().create_table(catalog.identifier(), schema=schema)
    with made.update_spec() as spec:
        spec.add_field("at", IdentityTransform(), "at")
        spec.add_field("kind", IdentityTransform(), "kind")
        spec.add_field("price", IdentityTransform(), "price")
        spec.add_field("day", IdentityTransform(), "day")
    rows = pa.table(
        {
            "id": [1, 2, 3],
            "at": pa.array(
                [1_700_000_000_000_000, 1_700_100_000_000_000, None], pa.timestamp("us")
            ),
            "kind": ["a", None, "a"],
            "price": pa.array([Decimal("1.50"), Decimal("2.00"), Decimal("1.50")], schema[3].type),
            "day": pa.array([19000, 19001, 19000], pa.date32()),
        },
        schema=schema,
    )
    sink = opened(catalog)
    sink.begin_epoch(0)
    sink.write_batch(rows.to_batches()[0])
    handle = CommitHandle.from_json(
        json.loads(sink.pre_commit(0).dumps())
    )  # through JSON, as a task returns it
    assert "record" not in handle.dumps()
    later = opened(catalog, generation=2)  # another process commits from the handle alone
    assert committed(later, 0, handle) is CommitOutcome.COMMITTED
    table = catalog.catalog().load_table(catalog.identifier())
    assert table.scan().to_arrow().num_rows == 3
    assert table.scan(row_filter="kind == 'a'").to_arrow().column("id").to_pylist() == [1, 3]
    nulls = table.scan(row_filter="kind is null").to_arrow()
    assert nulls.column("id").to_pylist() == [2]
    planned = {str(t.file.file_path) for t in table.scan(row_filter="id == 2").plan_files()}
    assert len(planned) == 1  # the bounds and the partition tuple prune the other files


def test_a_decided_participant_whose_file_is_gone_is_data_loss_not_a_commit(
    catalog: CatalogUnderTest,
) -> None:
    with_table(catalog)
    sink = opened(catalog)
    handle = prepared(sink, 0, events([1]))
    (path,) = paths_of(handle)
    # e.g. an orphan-file cleanup ran meanwhile
    catalog.catalog().load_table(catalog.identifier()).io.delete(path)
    with pytest.raises(ParticipantLostError, match="data loss"):
        opened(catalog, generation=2).commit_epoch(0, handle)
    table = catalog.catalog().load_table(catalog.identifier())
    assert table.current_snapshot() is None  # nothing was committed


def stale_transaction(catalog: CatalogUnderTest, key: str) -> Any:
    """A transaction on the table as read now that appends a row and sets a property, with
    pyiceberg's own retries off: committed later, its base may be stale."""
    from durable_sinks.sinks.iceberg import _pyiceberg

    table = _pyiceberg.without_commit_retries(catalog.catalog().load_table(catalog.identifier()))
    tx = table.transaction()
    tx.set_properties({"writer": key})
    tx.append(pa.table(events([int(key)])))
    return tx


@pytest.mark.parametrize("first_snapshot", [True, False], ids=["empty-table", "with-snapshot"])
def test_the_catalog_refuses_every_commit_but_one_from_the_same_base(
    catalog: CatalogUnderTest, first_snapshot: bool
) -> None:
    """What exactly-once rests on: of commits racing from one snapshot (each asserting the
    branch's head it read, or that there is none yet), the catalog takes one and refuses the
    others with CommitFailedException (HTTP 409 from a REST catalog), at the same moment."""
    from pyiceberg.exceptions import CommitFailedException

    with_table(catalog)
    if not first_snapshot:
        catalog.catalog().load_table(catalog.identifier()).append(pa.table(events([0])))
    racers = [stale_transaction(catalog, str(n)) for n in range(1, 5)]
    start = threading.Barrier(len(racers))
    outcomes: list[str] = [""] * len(racers)

    def commit(n: int) -> None:
        start.wait(timeout=30)
        try:
            racers[n].commit_transaction()
            outcomes[n] = "committed"
        except CommitFailedException:
            outcomes[n] = "refused"

    threads = [threading.Thread(target=commit, args=(n,)) for n in range(len(racers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["committed", "refused", "refused", "refused"]
    winner = str(outcomes.index("committed") + 1)
    table = catalog.catalog().load_table(catalog.identifier())
    assert table.properties["writer"] == winner
    assert ids(catalog) == sorted([int(winner)] + ([] if first_snapshot else [0]))
    assert len(table.snapshots()) == (1 if first_snapshot else 2)


def test_two_processes_committing_one_epoch_at_once_land_it_once(
    catalog: CatalogUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay and a zombie of the same epoch, each with its own files, commit at the same
    moment from the same table state: one commits, the other loses the race, re-reads the
    table, finds the epoch committed and stands down; its files are rolled back."""
    with_table(catalog)
    sinks = [opened(catalog, generation=g) for g in (1, 2)]
    handles = []
    for sink in sinks:
        sink.begin_epoch(0)
        sink.write_batch(events([1, 2]))
        handles.append(sink.pre_commit(0))
    commit = iceberg_committer._commit
    together = threading.Barrier(2)
    waited: set[int] = set()

    def at_once(
        sink: IcebergSink, tables: Any, table: Any, epoch: int, files: Any, names: Any
    ) -> None:
        if id(sink) not in waited:  # both read the table before either commits
            waited.add(id(sink))
            together.wait(timeout=30)
        commit(sink, tables, table, epoch, files, names)

    monkeypatch.setattr(iceberg_committer, "_commit", at_once)
    outcomes: dict[int, CommitOutcome] = {}

    def run(n: int) -> None:
        outcomes[n] = committed(sinks[n], 0, handles[n])

    threads = [threading.Thread(target=run, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(o.name for o in outcomes.values()) == ["ALREADY_COMMITTED", "COMMITTED"]
    assert sum(s.metrics()["commit_conflicts"] for s in sinks) == 1
    loser = next(n for n, o in outcomes.items() if o is CommitOutcome.ALREADY_COMMITTED)
    sinks[loser].rollback_epoch(0, handles[loser])
    assert ids(catalog) == [1, 2]
    table = catalog.catalog().load_table(catalog.identifier())
    referenced = {str(t.file.file_path) for t in table.scan().plan_files()}
    assert set(catalog.data_locations()) == referenced == set(paths_of(handles[1 - loser]))


@pytest.fixture
def rest_catalog(iceberg_rest: IcebergRestEndpoint) -> Iterator[RestIcebergCatalog]:
    made = RestIcebergCatalog(iceberg_rest)
    made.create_namespace()
    try:
        yield made
    finally:
        made.drop()


@pytest.mark.parametrize(
    ("setting", "refusal", "fix"),
    [
        ("unreachable uri", UnreachableError, "catalog's server answers"),
        ("not a catalog", ConfigError, "does not answer as an Iceberg REST catalog"),
        ("not a catalog, nor its tokens", ConfigError, "does not answer as an Iceberg REST"),
        ("wrong credential", ConfigError, "catalog's credentials"),
        ("no credential", ConfigError, "catalog's credentials"),
        ("wrong S3 secret", ConfigError, "s3.secret-access-key"),
    ],
)
def test_bad_rest_catalog_settings_are_refused_at_start_with_nothing_written(
    rest_catalog: RestIcebergCatalog,
    tmp_path: Path,
    setting: str,
    refusal: type[Exception],
    fix: str,
) -> None:
    endpoint = rest_catalog.endpoint
    rest_catalog.catalog().create_table(rest_catalog.identifier(), schema=events([]).schema)
    options = rest_catalog.sink_options()
    settings: dict[str, dict[str, str | None]] = {
        "unreachable uri": {"uri": "http://127.0.0.1:1"},
        "not a catalog": {"uri": endpoint.s3.endpoint_url},
        "not a catalog, nor its tokens": {
            "uri": endpoint.s3.endpoint_url,
            "oauth2-server-uri": f"{endpoint.s3.endpoint_url}/v1/oauth/tokens",
        },
        "wrong credential": {"credential": f"{endpoint.s3.access_key_id}:not-the-secret"},
        "no credential": {"credential": None},
        "wrong S3 secret": {"s3.secret-access-key": "not-the-secret"},
    }
    wrong = settings[setting]
    options["catalog"] = {k: v for k, v in {**options["catalog"], **wrong}.items() if v is not None}
    job = Coordinator("orders", [create("iceberg", options)], LocalDirectoryStore(tmp_path / "s"))
    with pytest.raises(refusal) as refused:
        job.start()
    text = str(refused.value)
    assert fix in text
    assert endpoint.s3.secret_access_key not in text
    assert endpoint.credential not in text
    assert rest_catalog.data_locations() == []
    assert rest_catalog.catalog().load_table(rest_catalog.identifier()).snapshots() == []


def test_the_live_path_commits_as_the_handle_says_and_verify_reports_a_missing_file(
    catalog: CatalogUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A participant of the coordinator's own generation is committed with no request to the
    storage per file; a file deleted meanwhile by someone outside the job is then reported by
    the epoch's holdings (`durable-sinks verify`), and a handle read back by a newer
    generation is checked file by file (test above: data loss)."""
    from pyiceberg.io.pyarrow import PyArrowFile

    with_table(catalog)
    sink = opened(catalog)
    handle = prepared(sink, 0, events([1, 2]))
    asked: list[str] = []
    exists = PyArrowFile.exists

    def counted(self: PyArrowFile) -> bool:
        asked.append(self.location)
        return exists(self)

    monkeypatch.setattr(PyArrowFile, "exists", counted)
    assert sink.commit_epoch(0, handle) is CommitOutcome.COMMITTED
    assert asked == []  # the live path asks nothing per file
    assert opened(catalog, generation=2).commit_epoch(0, handle) is CommitOutcome.COMMITTED
    assert asked == paths_of(handle)  # a newer generation's (recovery's) view checks each
    (path,) = paths_of(handle)
    catalog.catalog().load_table(catalog.identifier()).io.delete(path)
    assert sink.publish_epoch(0, [handle]) is CommitOutcome.COMMITTED
    held = sink.holdings(0, 0)[0]
    assert held.problems == (f"{path} is in the table but missing",)


def test_an_epochs_losing_attempts_are_found_in_its_journal_without_listing_the_table(
    catalog: CatalogUnderTest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a distributed epoch the driver lists the epoch's journal folder only, never the
    table's data folder, unless an entry is of a task that stopped before it prepared (then
    its files are found by their names). Every loser's files and entry are gone after the
    epoch, and the winners' entries too."""
    from durable_sinks.sinks.iceberg import _pyiceberg, journal

    with_table(catalog)

    def build() -> list[Any]:
        return [create("iceberg", catalog.sink_options())]

    def stopped_task(generation: int, epoch: int, part: str, rows: list[int]) -> str:
        """A task that wrote its data file and died before its prepare: its entry holds no
        handle. Its file's path."""
        (sink,) = build()
        sink.open(OpenContext("orders", sink.name, generation, worker=True, part=part))
        handle = prepared(sink, epoch, events(rows))
        table = catalog.catalog().load_table(catalog.identifier())
        name = ParticipantName.parse(handle.participant)
        assert name is not None
        journal.write(sink, table.io, table.location_provider().data_path, name, None)
        (path,) = paths_of(handle)
        return path

    listed: list[str] = []
    list_files = _pyiceberg.list_files

    def recorded(table: Any, folder: str) -> Any:
        listed.append(folder.rstrip("/"))
        return list_files(table, folder)

    def run(epoch: int, stopped: bool) -> Any:
        def prepare(generation: int) -> list[CommitHandle]:
            winners = prepare_part("orders", generation, epoch, "p0-t0", build, [events([epoch])])
            prepare_part("orders", generation, epoch, "p0-t1", build, [events([epoch])])
            if stopped:
                dead.append(stopped_task(generation, epoch, "p1-t2", [100 + epoch]))
            return winners

        return prepare

    dead: list[str] = []
    job = Coordinator(
        "orders", build(), LocalDirectoryStore(tmp_path / "store"), executor_mode=True
    )
    job.start()
    data = catalog.catalog().load_table(catalog.identifier()).location_provider().data_path
    monkeypatch.setattr(_pyiceberg, "list_files", recorded)
    job.run_distributed_epoch(0, run(0, stopped=False))
    assert data.rstrip("/") not in listed
    assert all(f"/{journal.FOLDER}/" in folder for folder in listed)
    job.run_distributed_epoch(1, run(1, stopped=True))
    assert data.rstrip("/") in listed  # the stopped task's files, found by their names
    job.close()
    assert ids(catalog) == [0, 1]
    locations = catalog.data_locations()
    assert len(locations) == 2
    assert dead[0] not in locations
    assert catalog.data_locations(journal=True) == []


def test_keep_snapshots_bounds_the_tables_snapshots_and_keeps_every_row(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    """With keep_snapshots=2, once a commit leaves more than 3 snapshots, all but the newest
    2 are expired (a tag's snapshot is kept); the rows, and the epoch property that makes a
    replay a no-op, stay."""
    with_table(catalog)
    catalog.catalog().load_table(catalog.identifier()).append(pa.table(events([100])))
    tagged = catalog.catalog().load_table(catalog.identifier())
    first = tagged.current_snapshot()
    assert first is not None
    tagged.manage_snapshots().create_tag(first.snapshot_id, "audit").commit()
    job = coordinator(catalog, tmp_path, keep_snapshots=2)
    counts = []
    for epoch in range(7):
        job.run_epoch(epoch, [events([epoch])])
        table = catalog.catalog().load_table(catalog.identifier())
        counts.append(len(table.snapshots()))
    assert job.run_epoch(6, [events([6])]).outcome.name == "ALREADY_COMMITTED"
    expired = job.sinks[0].metrics()["snapshots_expired"]
    job.close()
    assert max(counts) <= 4  # the newest 2, the tag's, and one more before the expiry
    assert expired > 0
    assert ids(catalog) == [0, 1, 2, 3, 4, 5, 6, 100]
    table = catalog.catalog().load_table(catalog.identifier())
    kept = {s.snapshot_id for s in table.snapshots()}
    assert first.snapshot_id in kept  # the tag's
    found = [s.summary.get("durable-sinks.epoch") for s in table.snapshots() if s.summary]
    epochs = sorted(int(e) for e in found if e is not None)
    assert epochs == [5, 6]


class HeldIceberg(IcebergSink):
    """The Iceberg sink, its epochs' commits held at `gate` once begun (holding the table)."""

    def __init__(self, config: Iceberg) -> None:
        super().__init__(config)
        self.gate = threading.Event()
        self.gate.set()
        self.publishing = threading.Event()

    def publish_epoch(self, epoch: int, handles: Sequence[CommitHandle]) -> CommitOutcome:
        with self._table_lock:
            self.publishing.set()
            assert self.gate.wait(timeout=30)
            return super().publish_epoch(epoch, handles)


def test_epochs_written_beside_the_previous_epochs_commit_each_land_once(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    """background_commits: epoch 2 is begun, written and prepared while epoch 1's commit
    runs (held); it begins without reading the table (the running commit does), and its
    own commit then starts from the table that commit left: no lost race, one snapshot per
    epoch, every row once."""
    catalog.create_namespace()
    sink = HeldIceberg(Iceberg(**catalog.sink_options(create_table=True)))
    job = Coordinator(
        "orders", [sink], LocalDirectoryStore(tmp_path / "store"), background_commits=True
    )
    job.start()
    job.run_epoch(0, [events([1, 2])])
    sink.gate.clear()
    job.run_epoch(1, [events([3])])
    assert sink.publishing.wait(timeout=10)
    threading.Timer(0.5, sink.gate.set).start()
    job.run_epoch(2, [events([4, 5])])  # written beside epoch 1's commit, decided after it
    job.run_epoch(3, [events([6])])
    job.close()
    assert ids(catalog) == [1, 2, 3, 4, 5, 6]
    table = catalog.catalog().load_table(catalog.identifier())
    epochs = [s.summary.get("durable-sinks.epoch") for s in table.snapshots() if s.summary]
    assert epochs == ["0", "1", "2", "3"]
    assert sink.metrics()["commit_conflicts"] == 0


def test_the_drivers_open_reads_the_newest_snapshot_only(
    catalog: CatalogUnderTest, tmp_path: Path
) -> None:
    """The REST catalog answers the open with the snapshots branches point at (one here);
    the open still knows the committed epoch and schema, recovery lists the journal alone
    (nothing is left in it: the table is not read again), the next epoch reads every
    snapshot, and the job goes on exactly once. A SQL catalog loads every snapshot."""
    catalog.create_namespace()
    first = coordinator(catalog, tmp_path, create_table=True)
    for epoch in range(4):
        first.run_epoch(epoch, [events([epoch])])
    first.close()

    sink = opened(catalog, generation=9)
    current = sink._t().current
    assert current is not None
    rest = isinstance(catalog, RestIcebergCatalog)
    assert len(current.metadata.snapshots) == (1 if rest else 4)
    assert sink.last_committed_epoch() == 3
    schema = sink.schema()
    assert schema is not None
    assert schema.names == ["id", "body"]
    assert "snapshot-loading-mode" not in sink._t().catalog.properties  # for the open only
    assert sink.recover_prepared() == []
    assert sink._t().current is current
    sink.begin_epoch(4)
    reread = sink._t().current
    assert reread is not None
    assert len(reread.metadata.snapshots) == 4  # the epoch reads them all
    sink.close()

    again = coordinator(catalog, tmp_path)
    again.run_epoch(3, [events([3])])  # a replay: already there
    again.run_epoch(4, [events([4])])
    again.close()
    assert ids(catalog) == [0, 1, 2, 3, 4]
