"""The Iceberg sink on pyiceberg's SQL catalog (a schema of its own in the test bed's Postgres,
a local warehouse): each epoch one commit, exactly once, whatever is replayed, crashes or
races; refusals at start with nothing written; rollbacks leave no file of the epoch. Read
back with pyiceberg scans."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator
from durable_sinks.core.errors import (
    ConfigError,
    InDoubtError,
    SchemaMismatchError,
    UnreachableError,
)
from durable_sinks.core.protocol import CommitOutcome, OpenContext
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from durable_sinks.sinks.iceberg.handles import IcebergHandleDetails, paths_of
from durable_sinks.sinks.iceberg.sink import CommitConflictError, IcebergSink
from tests.services import PostgresEndpoint
from tests.support.iceberg_target import IcebergCatalog


@pytest.fixture
def catalog(postgres: PostgresEndpoint, tmp_path: Path) -> Iterator[IcebergCatalog]:
    made = IcebergCatalog(postgres, tmp_path)
    try:
        yield made
    finally:
        made.drop()


def events(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "body": pa.array([f"row {i}" for i in ids], pa.string())}
    )


def ids(catalog: IcebergCatalog) -> list[int]:
    return sorted(r["id"] for r in catalog.rows())


def coordinator(
    catalog: IcebergCatalog, tmp_path: Path, job: str = "orders", **options: Any
) -> Coordinator:
    sink = create("iceberg", catalog.sink_options(**options))
    made = Coordinator(job, [sink], LocalDirectoryStore(tmp_path / f"store-{job}"))
    made.start()
    return made


def opened(catalog: IcebergCatalog, job: str = "orders", generation: int = 1) -> IcebergSink:
    sink = create("iceberg", catalog.sink_options())
    assert isinstance(sink, IcebergSink)
    sink.open(OpenContext(job, sink.name, generation))
    return sink


def test_each_epoch_is_one_commit_with_the_epoch_property_and_summary(
    catalog: IcebergCatalog, tmp_path: Path
) -> None:
    catalog.create_namespace()
    job = coordinator(catalog, tmp_path, create_table=True)
    job.run_epoch(0, [events([1, 2]), events([3])])
    job.run_epoch(1, [events([4])])
    job.run_epoch(2, [])
    job.close()
    assert ids(catalog) == [1, 2, 3, 4]
    table = catalog.catalog().load_table(("ds", "events"))
    assert table.properties["durable-sinks.orders.iceberg.epoch"] == "2"
    summaries = [s.summary for s in table.snapshots() if s.summary is not None]
    epochs = [s.get("durable-sinks.epoch") for s in summaries]
    assert epochs == ["0", "1", "2"]
    assert {s.get("durable-sinks.job") for s in summaries} == {"orders"}
    # Pyiceberg's own retries stay as the table had them: off only in memory for our commits.
    assert "commit.retry.num-retries" not in table.properties


def test_a_replayed_commit_and_a_replayed_epoch_are_no_ops(
    catalog: IcebergCatalog, tmp_path: Path
) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)
    sink = opened(catalog)
    sink.begin_epoch(0)
    sink.write_batch(events([1, 2]))
    handle = sink.pre_commit(0)
    files = IcebergHandleDetails.of(handle).files
    assert [(f["rows"], f["size"] > 0, f["path"].startswith("file://")) for f in files] == [
        (2, True, True)
    ]
    assert sink.commit_epoch(0, handle) is CommitOutcome.COMMITTED
    assert sink.commit_epoch(0, handle) is CommitOutcome.ALREADY_COMMITTED
    other = opened(catalog, generation=2)  # another process, from the handle alone
    assert other.commit_epoch(0, handle) is CommitOutcome.ALREADY_COMMITTED
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
    catalog: IcebergCatalog, tmp_path: Path, crash_after: str, committed: bool
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
    files_before = catalog.data_files()
    second = coordinator(catalog, tmp_path, create_table=True)
    assert ids(catalog) == ([1, 2, 3] if committed else [1])
    if not committed:  # rolled back: the epoch's files are gone
        assert len(catalog.data_files()) < len(files_before)
    second.run_epoch(1, [events([2, 3])])
    second.run_epoch(2, [events([4])])
    second.close()
    assert ids(catalog) == [1, 2, 3, 4]
    table = catalog.catalog().load_table(("ds", "events"))
    referenced = {str(t.file.file_path).removeprefix("file://") for t in table.scan().plan_files()}
    assert {str(p) for p in catalog.data_files()} == referenced  # no orphan is left


def test_a_rollback_leaves_no_file_of_the_epoch(catalog: IcebergCatalog) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(  # each record batch a row group: the file exists at once
        ("ds", "events"),
        schema=events([]).schema,
        properties={"write.parquet.row-group-limit": "1"},
    )
    sink = opened(catalog)
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    sink.write_batch(events([2]))
    handle = sink.pre_commit(0)
    assert len(catalog.data_files()) == 1  # the epoch's record batches are one data file
    assert [f["rows"] for f in IcebergHandleDetails.of(handle).files] == [2]
    sink.rollback_epoch(0, handle)
    sink.rollback_epoch(0, handle)  # again: the files are gone already
    assert catalog.data_files() == []
    sink.begin_epoch(1)
    sink.write_batch(events([3]))
    assert len(catalog.data_files()) == 1  # still being written
    sink.rollback_epoch(1, None)  # never prepared
    assert catalog.data_files() == []
    sink.begin_epoch(2)
    sink.write_batch(events([4]))
    sink.begin_epoch(2)  # the attempt before was neither prepared nor rolled back
    assert catalog.data_files() == []
    sink.close()
    assert ids(catalog) == []


def test_an_epochs_data_file_is_the_one_pyicebergs_writer_makes_of_its_rows(
    catalog: IcebergCatalog,
) -> None:
    import itertools

    import pyarrow.parquet as pq

    from durable_sinks.sinks.iceberg import _pyiceberg
    from durable_sinks.sinks.iceberg.handles import data_files_of

    catalog.create_namespace()
    table = catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)
    batches = [events(list(range(at, at + 500))) for at in range(0, 1500, 500)]
    sink = opened(catalog)
    sink.begin_epoch(0)
    for batch in batches:
        sink.write_batch(batch)
    [ours] = data_files_of(sink.pre_commit(0))
    [theirs] = _pyiceberg.write_data_files(
        table, pa.Table.from_batches(batches), uuid.uuid4(), itertools.count(0)
    )
    fields = ["record_count", "value_counts", "null_value_counts", "lower_bounds"]
    fields += ["upper_bounds", "column_sizes", "file_format", "split_offsets"]
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(theirs, f) for f in fields}
    assert ours.file_size_in_bytes == theirs.file_size_in_bytes
    path = str(ours.file_path).removeprefix("file://")
    assert pq.ParquetFile(path).metadata.num_row_groups == 1


def test_a_data_file_ends_at_the_tables_target_file_size(
    catalog: IcebergCatalog, tmp_path: Path
) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(
        ("ds", "events"),
        schema=events([]).schema,
        properties={"write.target-file-size-bytes": "1"},
    )
    job = coordinator(catalog, tmp_path)
    job.run_epoch(0, [events([1, 2]), events([3]), events([4])])
    job.close()
    assert ids(catalog) == [1, 2, 3, 4]
    table = catalog.catalog().load_table(("ds", "events"))
    rows = sorted(t.file.record_count for t in table.scan().plan_files())
    assert rows == [1, 1, 2]
    assert len(catalog.data_files()) == 3


def test_a_commit_of_a_committed_epoch_never_deletes_its_files(catalog: IcebergCatalog) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)
    sink = opened(catalog)
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    winner = sink.pre_commit(0)
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    loser = sink.pre_commit(0)
    sink.commit_epoch(0, winner)
    sink.rollback_epoch(0, winner)  # a wrong rollback of the committed participant: refused
    sink.rollback_epoch(0, loser)  # the losing attempt's files go
    assert ids(catalog) == [1]
    assert len(catalog.data_files()) == 1


def test_a_stale_writer_is_retried_after_rechecking_the_epoch(
    catalog: IcebergCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)
    sink = opened(catalog)
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    handle = sink.pre_commit(0)
    commit = IcebergSink._commit
    raced: list[int] = []

    def racing(self: IcebergSink, table: Any, epoch: int, files: Any) -> None:
        if not raced:  # another writer appends between our read and our commit
            raced.append(epoch)
            catalog.catalog().load_table(("ds", "events")).append(pa.table(events([100])))
        commit(self, table, epoch, files)

    monkeypatch.setattr(IcebergSink, "_commit", racing)
    assert sink.commit_epoch(0, handle) is CommitOutcome.COMMITTED
    assert sink.metrics()["commit_conflicts"] == 1
    assert ids(catalog) == [1, 100]

    # The race is with our own epoch committed by another process: the retry skips it.
    sink.begin_epoch(1)
    sink.write_batch(events([2]))
    handle = sink.pre_commit(1)
    raced.clear()

    def replayed(self: IcebergSink, table: Any, epoch: int, files: Any) -> None:
        if not raced:
            raced.append(epoch)
            assert opened(catalog, generation=2).commit_epoch(1, handle) is CommitOutcome.COMMITTED
        commit(self, table, epoch, files)

    monkeypatch.setattr(IcebergSink, "_commit", replayed)
    assert sink.commit_epoch(1, handle) is CommitOutcome.ALREADY_COMMITTED
    assert ids(catalog) == [1, 2, 100]

    # Committed by another process after this one last read the table (at the epoch's start):
    # the commit from that read loses the race, and the fresh read shows the epoch.
    monkeypatch.setattr(IcebergSink, "_commit", commit)
    sink.begin_epoch(2)
    sink.write_batch(events([3]))
    handle = sink.pre_commit(2)
    assert opened(catalog, generation=3).commit_epoch(2, handle) is CommitOutcome.COMMITTED
    assert sink.commit_epoch(2, handle) is CommitOutcome.ALREADY_COMMITTED
    assert sink.metrics()["commit_conflicts"] == 3
    assert ids(catalog) == [1, 2, 3, 100]


def test_a_bad_catalog_uri_is_refused_at_start_with_nothing_written(
    catalog: IcebergCatalog, tmp_path: Path
) -> None:
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
    assert catalog.data_files() == []
    assert catalog.postgres.password not in repr(create("iceberg", closed))


def test_a_missing_namespace_or_table_is_refused_at_start(
    catalog: IcebergCatalog, tmp_path: Path
) -> None:
    job = Coordinator(
        "orders",
        [create("iceberg", catalog.sink_options(create_table=True))],
        LocalDirectoryStore(tmp_path / "s"),
    )
    with pytest.raises(ConfigError, match="no namespace 'ds'") as refused:
        job.start()
    assert "create_namespace" in str(refused.value)
    catalog.create_namespace()
    job = Coordinator(
        "orders", [create("iceberg", catalog.sink_options())], LocalDirectoryStore(tmp_path / "t")
    )
    with pytest.raises(ConfigError, match="no Iceberg table") as refused:
        job.start()
    assert "create_table=True" in str(refused.value)
    assert catalog.data_files() == []


def test_rows_that_do_not_fit_the_table_are_refused_with_nothing_written(
    catalog: IcebergCatalog, tmp_path: Path
) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)
    job = coordinator(catalog, tmp_path, job=f"j{uuid.uuid4().hex[:6]}")
    job.run_epoch(0, [events([1])])
    bad = {
        "column 'extra' is not in the table": events([2]).append_column("extra", pa.array([1])),
        "column 'body' is missing": pa.record_batch({"id": pa.array([2], pa.int64())}),
        "column 'id' is string": pa.record_batch({"id": ["2"], "body": ["x"]}),
    }
    before = catalog.data_files()
    for expected, batch in bad.items():
        with pytest.raises(SchemaMismatchError, match=expected) as refused:
            job.run_epoch(1, [events([5]), batch])
        assert "nothing of the epoch was committed" in str(refused.value)
        assert ids(catalog) == [1]
        assert catalog.data_files() == before
    narrow = pa.record_batch({"id": pa.array([2], pa.int32()), "body": pa.array(["x"])})
    job.run_epoch(1, [narrow])
    job.close()
    assert ids(catalog) == [1, 2]


def test_recovery_hands_back_only_what_the_table_does_not_hold(catalog: IcebergCatalog) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)
    sink = opened(catalog)
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    loser = sink.pre_commit(0)
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    winner = sink.pre_commit(0)
    sink.commit_epoch(0, winner)
    sink.begin_epoch(1)
    sink.write_batch(events([2]))
    pending = sink.pre_commit(1)
    later = opened(catalog, generation=2)
    found = later.recover_prepared()
    assert sorted(h.participant for h in found) == sorted([loser.participant, pending.participant])
    for handle in found:
        later.rollback_epoch(handle.epoch, handle)
    assert later.recover_prepared() == []
    assert ids(catalog) == [1]
    assert len(catalog.data_files()) == 1


def test_a_commit_whose_outcome_is_unknown_is_in_doubt_and_keeps_its_files(
    catalog: IcebergCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)
    sink = opened(catalog)
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    handle = sink.pre_commit(0)
    commit = IcebergSink._commit

    def lost_answer(self: IcebergSink, table: Any, epoch: int, files: Any) -> None:
        commit(self, table, epoch, files)  # the catalog took it, the answer never came
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(IcebergSink, "_commit", lost_answer)
    with pytest.raises(InDoubtError):
        sink.commit_epoch(0, handle)
    monkeypatch.setattr(IcebergSink, "_commit", commit)
    assert len(catalog.data_files()) == 1
    assert opened(catalog, generation=2).commit_epoch(0, handle) is (
        CommitOutcome.ALREADY_COMMITTED
    )
    assert ids(catalog) == [1]


def test_a_partitioned_table_gets_files_per_partition(catalog: IcebergCatalog) -> None:
    from pyiceberg.transforms import IdentityTransform

    catalog.create_namespace()
    schema = pa.schema([("id", pa.int64()), ("body", pa.string()), ("day", pa.string())])
    made = catalog.catalog().create_table(("ds", "events"), schema=schema)
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
    sink.commit_epoch(0, handle)
    table = catalog.catalog().load_table(("ds", "events"))
    assert table.spec().fields[0].source_id == day
    d1 = table.scan(row_filter="day == 'd1'").to_arrow()
    assert sorted(d1.column("id").to_pylist()) == [1, 3]


def test_a_commit_that_keeps_losing_races_stops_at_the_bound(
    catalog: IcebergCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)
    sink = create("iceberg", catalog.sink_options(commit_retries=2))
    assert isinstance(sink, IcebergSink)
    sink.open(OpenContext("orders", sink.name, 1))
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    handle = sink.pre_commit(0)
    commit = IcebergSink._commit
    others = iter(range(100, 200))

    def always_raced(self: IcebergSink, table: Any, epoch: int, files: Any) -> None:
        catalog.catalog().load_table(("ds", "events")).append(pa.table(events([next(others)])))
        commit(self, table, epoch, files)

    monkeypatch.setattr(IcebergSink, "_commit", always_raced)
    with pytest.raises(CommitConflictError, match="lost the race with other writers 3 times"):
        sink.commit_epoch(0, handle)
    assert sink.metrics()["commit_conflicts"] == 3
    assert ids(catalog) == [100, 101, 102]  # nothing of the epoch
    monkeypatch.setattr(IcebergSink, "_commit", commit)
    assert sink.commit_epoch(0, handle) is CommitOutcome.COMMITTED  # the retry of the epoch
    assert ids(catalog) == [1, 100, 101, 102]
