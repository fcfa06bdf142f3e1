"""The Iceberg sink on pyiceberg's SQL catalog (a schema of its own in the test bed's Postgres,
a local warehouse): each epoch one commit, exactly once, whatever is replayed, crashes or
races; refusals at start with nothing written; rollbacks leave no file of the epoch. Read
back with pyiceberg scans."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
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
from durable_sinks.core.protocol import CommitHandle, CommitOutcome, OpenContext
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


def committed(sink: IcebergSink, epoch: int, handle: CommitHandle) -> CommitOutcome:
    """The participant's commit, then the epoch's (what the coordinator does for one)."""
    sink.commit_epoch(epoch, handle)
    return sink.publish_epoch(epoch, [handle])


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
    assert [(f.rows, f.size > 0, f.path.startswith("file://")) for f in files] == [(2, True, True)]
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
    catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)
    sink = opened(catalog)
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    sink.write_batch(events([2]))
    handle = sink.pre_commit(0)
    assert len(catalog.data_files()) == 2
    sink.rollback_epoch(0, handle)
    sink.rollback_epoch(0, handle)  # again: the files are gone already
    assert catalog.data_files() == []
    sink.begin_epoch(1)
    sink.write_batch(events([3]))
    sink.rollback_epoch(1, None)  # never prepared
    assert catalog.data_files() == []
    assert ids(catalog) == []


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
    committed(sink, 0, winner)
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

    def racing(self: IcebergSink, table: Any, epoch: int, files: Any, names: Any) -> None:
        if not raced:  # another writer appends between our read and our commit
            raced.append(epoch)
            catalog.catalog().load_table(("ds", "events")).append(pa.table(events([100])))
        commit(self, table, epoch, files, names)

    monkeypatch.setattr(IcebergSink, "_commit", racing)
    assert committed(sink, 0, handle) is CommitOutcome.COMMITTED
    assert sink.metrics()["commit_conflicts"] == 1
    assert ids(catalog) == [1, 100]

    # The race is with our own epoch committed by another process: the retry skips it.
    sink.begin_epoch(1)
    sink.write_batch(events([2]))
    handle = sink.pre_commit(1)
    raced.clear()

    def replayed(self: IcebergSink, table: Any, epoch: int, files: Any, names: Any) -> None:
        if not raced:
            raced.append(epoch)
            assert committed(opened(catalog, generation=2), 1, handle) is CommitOutcome.COMMITTED
        commit(self, table, epoch, files, names)

    monkeypatch.setattr(IcebergSink, "_commit", replayed)
    assert committed(sink, 1, handle) is CommitOutcome.ALREADY_COMMITTED
    assert ids(catalog) == [1, 2, 100]


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
    committed(sink, 0, winner)
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

    def lost_answer(self: IcebergSink, table: Any, epoch: int, files: Any, names: Any) -> None:
        commit(self, table, epoch, files, names)  # the catalog took it, the answer never came
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(IcebergSink, "_commit", lost_answer)
    with pytest.raises(InDoubtError):
        committed(sink, 0, handle)
    monkeypatch.setattr(IcebergSink, "_commit", commit)
    assert len(catalog.data_files()) == 1
    assert committed(opened(catalog, generation=2), 0, handle) is (CommitOutcome.ALREADY_COMMITTED)
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
    committed(sink, 0, handle)
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

    def always_raced(self: IcebergSink, table: Any, epoch: int, files: Any, names: Any) -> None:
        catalog.catalog().load_table(("ds", "events")).append(pa.table(events([next(others)])))
        commit(self, table, epoch, files, names)

    monkeypatch.setattr(IcebergSink, "_commit", always_raced)
    with pytest.raises(CommitConflictError, match="lost the race with other writers 3 times"):
        committed(sink, 0, handle)
    assert sink.metrics()["commit_conflicts"] == 3
    assert ids(catalog) == [100, 101, 102]  # nothing of the epoch
    monkeypatch.setattr(IcebergSink, "_commit", commit)
    assert committed(sink, 0, handle) is CommitOutcome.COMMITTED  # the retry of the epoch
    assert ids(catalog) == [1, 100, 101, 102]


def test_executor_parts_are_one_commit_and_losing_attempts_are_deleted(
    catalog: IcebergCatalog, tmp_path: Path
) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)

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
    table = catalog.catalog().load_table(("ds", "events"))
    summaries = [s.summary for s in table.snapshots() if s.summary is not None]
    assert [s.get("durable-sinks.epoch") for s in summaries] == ["0", "1"]
    assert len(json.loads(summaries[0]["durable-sinks.participants"])) == 2
    assert len(catalog.data_files()) == 3  # the losing twin's file is gone

    # A driver that dies after its tasks prepared: the next start rolls the parts back, and
    # the replayed epoch lands once.
    steps = job.distributed_epoch_steps(2, prepare(2, {"p0-t4": [5], "p1-t5": [6]}, {}))
    while next(steps) != "after-prepare":
        pass
    assert len(catalog.data_files()) == 5
    again = Coordinator("orders", build(), LocalDirectoryStore(store), executor_mode=True)
    report = again.start()
    assert len(report.rolled_back) == 2
    assert len(catalog.data_files()) == 3
    again.run_distributed_epoch(2, prepare(2, {"p0-t6": [5], "p1-t7": [6]}, {}))
    again.close()
    assert ids(catalog) == [1, 2, 3, 4, 5, 6]
    assert len(catalog.data_files()) == 5


def test_a_handle_is_typed_json_that_appends_to_a_partitioned_table(
    catalog: IcebergCatalog,
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
    made = catalog.catalog().create_table(("ds", "events"), schema=schema)
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
    table = catalog.catalog().load_table(("ds", "events"))
    assert table.scan().to_arrow().num_rows == 3
    assert table.scan(row_filter="kind == 'a'").to_arrow().column("id").to_pylist() == [1, 3]
    nulls = table.scan(row_filter="kind is null").to_arrow()
    assert nulls.column("id").to_pylist() == [2]
    planned = {str(t.file.file_path) for t in table.scan(row_filter="id == 2").plan_files()}
    assert len(planned) == 1  # the bounds and the partition tuple prune the other files


def test_a_decided_participant_whose_file_is_gone_is_data_loss_not_a_commit(
    catalog: IcebergCatalog,
) -> None:
    catalog.create_namespace()
    catalog.catalog().create_table(("ds", "events"), schema=events([]).schema)
    sink = opened(catalog)
    sink.begin_epoch(0)
    sink.write_batch(events([1]))
    handle = sink.pre_commit(0)
    (path,) = paths_of(handle)
    Path(path.removeprefix("file://")).unlink()  # e.g. an orphan-file cleanup ran meanwhile
    with pytest.raises(ParticipantLostError, match="data loss"):
        opened(catalog, generation=2).commit_epoch(0, handle)
    table = catalog.catalog().load_table(("ds", "events"))
    assert table.current_snapshot() is None  # nothing was committed
