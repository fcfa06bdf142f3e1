"""The Delta sink on its own: refusals at start and bad batches (each names the problem and
the fix, and nothing becomes visible or stays behind), the table it creates (partitions,
statistics, types), and two jobs writing one table."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator
from durable_sinks.core.errors import CommittedEpochLostError, ConfigError, SchemaMismatchError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from tests.support.delta_target import folder_leftovers, log_epochs


def coordinator(tmp_path: Path, job: str | None = None, **options: Any) -> Coordinator:
    sink = create("delta", {"path": str(tmp_path / "table"), **options})
    job = job or f"delta-{uuid.uuid4().hex[:8]}"
    # Each job one stream: a replay with other rows is then a replay (test_stream_identity).
    return Coordinator(job, [sink], LocalDirectoryStore(tmp_path / f"store-{job}"), source=job)


def events(ids: list[int], **extra: Any) -> pa.RecordBatch:
    columns: dict[str, Any] = {
        "id": pa.array(ids, pa.int64()),
        "body": [f"row {i}" for i in ids],
        **extra,
    }
    return pa.record_batch(columns)


def rows(path: Path) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    table = pa.table(DeltaTable(str(path)).to_pyarrow_table())
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def test_a_missing_table_is_refused_at_start_unless_created_on_request(tmp_path: Path) -> None:
    job = coordinator(tmp_path)
    with pytest.raises(ConfigError, match="no Delta table") as refused:
        job.start()
    assert "create_table=True" in str(refused.value)
    assert not (tmp_path / "table").exists()


def test_batches_that_do_not_fit_are_refused_before_anything_is_visible(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("body", pa.string())])
    DeltaTable.create(str(tmp_path / "table"), schema=schema)
    job = coordinator(tmp_path)
    job.start()
    job.run_epoch(0, [events([1, 2])])
    bad = {
        "is not in the table": events([3], extra=pa.array([1])),
        "missing from the rows": pa.record_batch({"id": pa.array([3], pa.int64())}),
        "has type string, the table int64": pa.record_batch({"id": ["3"], "body": ["x"]}),
        "NOT NULL in the table but 1 rows hold null": events([3]).set_column(
            0, "id", pa.array([None], pa.int64())
        ),
    }
    for expected, batch in bad.items():
        with pytest.raises(SchemaMismatchError, match=expected) as refused:
            job.run_epoch(1, [events([5]), batch])
        assert "nothing of the epoch was committed" in str(refused.value)
        assert rows(tmp_path / "table") == [{"id": 1, "body": "row 1"}, {"id": 2, "body": "row 2"}]
        assert folder_leftovers(tmp_path / "table") == []
    # Widening and normalised types are taken: int32 ids, large strings.
    fitting = pa.record_batch(
        {"id": pa.array([3], pa.int32()), "body": pa.array(["row 3"], pa.large_string())}
    )
    job.run_epoch(1, [fitting])
    assert [r["id"] for r in rows(tmp_path / "table")] == [1, 2, 3]
    assert log_epochs(tmp_path / "table") == [0, 1]
    job.close()


def test_a_created_table_is_partitioned_with_statistics_and_delta_types(tmp_path: Path) -> None:
    job = coordinator(tmp_path, create_table=True, partition_by=["day"])
    job.start()
    day = pa.array([19000, 19000, 19001], pa.date32())
    stamps = pa.array([1_000, 2_000, 3_000], pa.timestamp("ns", "Europe/Paris"))
    job.run_epoch(0, [events([1, 2, 3], day=day, at=stamps)])
    job.run_epoch(1, [])  # an empty epoch: a commit of its own with no file
    job.close()
    from deltalake import DeltaTable

    table = DeltaTable(str(tmp_path / "table"))
    assert table.metadata().partition_columns == ["day"]
    assert pa.schema(table.schema().to_arrow()).field("at").type == pa.timestamp("us", "UTC")
    assert table.version() == 1
    assert table.transaction_version(f"durable-sinks:{job.job_id}:delta") == 1
    adds = [json.loads(line)["add"] for line in _log_lines(tmp_path / "table") if '"add"' in line]
    assert sorted(a["partitionValues"]["day"] for a in adds) == ["2022-01-08", "2022-01-09"]
    stats = [json.loads(a["stats"]) for a in adds]
    assert sorted(s["numRecords"] for s in stats) == [1, 2]
    assert all(s["minValues"]["id"] <= s["maxValues"]["id"] for s in stats)
    assert folder_leftovers(tmp_path / "table") == []


def test_a_nanosecond_fraction_is_refused_not_cut(tmp_path: Path) -> None:
    job = coordinator(tmp_path, create_table=True)
    job.start()
    stamps = pa.array([1_000_001], pa.timestamp("ns", "UTC"))
    with pytest.raises(SchemaMismatchError, match="column 'at'"):
        job.run_epoch(0, [events([1], at=stamps)])
    job.close()


def test_merge_refuses_null_keys_and_keeps_the_last_row_of_a_key(tmp_path: Path) -> None:
    job = coordinator(tmp_path, create_table=True, mode="upsert", key="id")
    job.start()
    job.run_epoch(0, [events([1, 2])])
    newer = pa.record_batch({"id": pa.array([2, 3, 2], pa.int64()), "body": ["b", "c", "last"]})
    job.run_epoch(1, [newer])
    assert rows(tmp_path / "table") == [
        {"id": 1, "body": "row 1"},
        {"id": 2, "body": "last"},
        {"id": 3, "body": "c"},
    ]
    with pytest.raises(SchemaMismatchError, match="key column 'id' holds null"):
        job.run_epoch(2, [events([4]).set_column(0, "id", pa.array([None], pa.int64()))])
    assert len(rows(tmp_path / "table")) == 3
    assert folder_leftovers(tmp_path / "table") == []
    job.close()


def test_settings_that_do_not_fit_the_table_are_refused_at_start(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    DeltaTable.create(str(tmp_path / "table"), schema=pa.schema([("id", pa.int64())]))
    with pytest.raises(ConfigError, match="partitioned by"):
        coordinator(tmp_path, partition_by=["id"]).start()
    with pytest.raises(ConfigError, match="key column 'nope'"):
        coordinator(tmp_path, mode="upsert", key="nope").start()
    with pytest.raises(ConfigError, match="needs the key columns"):
        create("delta", {"path": str(tmp_path / "table"), "mode": "upsert"})
    with pytest.raises(ConfigError, match="neither an absolute local path nor s3"):
        create("delta", {"path": "relative/table"})


def test_two_jobs_append_to_one_table_each_with_its_own_transaction(tmp_path: Path) -> None:
    first = coordinator(tmp_path, job="first", create_table=True)
    second = coordinator(tmp_path, job="second", create_table=True)
    first.start()
    first.run_epoch(0, [events([1])])
    second.start()
    second.run_epoch(0, [events([2])])
    first.run_epoch(1, [events([3])])
    second.run_epoch(0, [events([99])])  # a replay: already committed for this job
    from deltalake import DeltaTable

    table = DeltaTable(str(tmp_path / "table"))
    assert table.transaction_version("durable-sinks:first:delta") == 1
    assert table.transaction_version("durable-sinks:second:delta") == 0
    assert [r["id"] for r in rows(tmp_path / "table")] == [1, 2, 3]
    first.close()
    second.close()


def test_a_table_replaced_between_epochs_is_read_afresh(tmp_path: Path) -> None:
    """The epoch's commit starts from the table the last one committed to, caught up with the
    log; when the version it was at is gone (the table deleted and made again by someone
    else), the log is read afresh and the epoch appended to the table that is there now."""
    import shutil

    from deltalake import DeltaTable, write_deltalake

    job = coordinator(tmp_path, create_table=True)
    job.start()
    for epoch in range(3):  # versions 0 to 2
        job.run_epoch(epoch, [events([epoch])])
    shutil.rmtree(tmp_path / "table")
    write_deltalake(str(tmp_path / "table"), pa.Table.from_batches([events([10])]))
    job.run_epoch(3, [events([3])])
    table = DeltaTable(str(tmp_path / "table"))
    assert table.version() == 1  # not 3, after a gap
    assert table.transaction_version("durable-sinks:" + job.job_id + ":delta") == 3
    assert [r["id"] for r in rows(tmp_path / "table")] == [3, 10]
    job.close()


def _log_lines(table: Path) -> list[str]:
    return [
        line
        for p in sorted((table / "_delta_log").glob("*.json"))
        for line in p.read_text().split("\n")
    ]


@pytest.mark.parametrize("retention", [None, "interval 7 days"])
def test_a_table_replaced_while_the_job_was_stopped_is_a_lost_epoch_unless_its_txn_expires(
    tmp_path: Path, retention: str | None
) -> None:
    """The sink's commit record is the table's transaction identifier: a table made again
    without it lost every epoch, and the next start says so; a table whose identifiers expire
    (`delta.setTransactionRetentionDuration`) cannot tell, and is not asked."""
    import shutil

    from deltalake import write_deltalake

    from durable_sinks.coordinator import EpochOutcome
    from durable_sinks.sinks.delta.sink import TXN_RETENTION

    first = coordinator(tmp_path, "replaced", create_table=True)
    first.start()
    for epoch in range(2):
        first.run_epoch(epoch, [events([epoch])])
    first.close()
    shutil.rmtree(tmp_path / "table")
    settings = {TXN_RETENTION: retention} if retention else None
    write_deltalake(
        str(tmp_path / "table"), pa.Table.from_batches([events([10])]), configuration=settings
    )
    restarted = coordinator(tmp_path, "replaced", create_table=True)
    if retention is None:
        with pytest.raises(CommittedEpochLostError, match="shows no committed epoch") as raised:
            restarted.start()
        assert (raised.value.first_lost, raised.value.last_lost) == (0, 1)
        assert [r["id"] for r in rows(tmp_path / "table")] == [10]
    else:
        restarted.start()
        assert restarted.run_epoch(2, [events([2])]).outcome is EpochOutcome.COMMITTED
        assert [r["id"] for r in rows(tmp_path / "table")] == [2, 10]
    restarted.close()


def test_a_start_removes_the_emptied_journal_folders_and_keeps_a_prepared_one(
    tmp_path: Path,
) -> None:
    """Each epoch's commit empties its journal folder; the next start removes those of
    epochs the table records (so no listing grows with the history), never one that holds
    a prepared participant."""
    first = coordinator(tmp_path, job="job", create_table=True)
    first.start()
    for epoch in range(3):
        first.run_epoch(epoch, [events([epoch])])
    steps = first.epoch_steps(3, [events([3])])
    for step in steps:
        if step == "after-pre-commit:delta":
            break  # the driver dies with epoch 3 prepared, undecided
    journals = tmp_path / "table" / "_durable_sinks" / "job" / "delta"
    assert sorted(p.name for p in journals.iterdir()) == [f"e{e:012d}" for e in range(4)]

    second = coordinator(tmp_path, job="job")
    report = second.start()
    assert [h.epoch for h in report.rolled_back] == [3]
    # Epoch 3 is not in the table yet: its folder stays until a start after its commit.
    assert sorted(p.name for p in journals.iterdir()) == ["e000000000003"]
    second.run_epoch(3, [events([3])])
    second.close()
    third = coordinator(tmp_path, job="job")
    third.start()
    assert list(journals.iterdir()) == []
    assert [r["id"] for r in rows(tmp_path / "table")] == [0, 1, 2, 3]
    third.close()


def test_the_live_path_commits_as_the_handle_says_and_recovery_checks_every_file(
    tmp_path: Path,
) -> None:
    """A participant of the coordinator's own generation is committed with no request per
    file (a file deleted meanwhile is not seen: readers then fail on it); one read back by
    a newer generation (recovery) is checked file by file: a gone file is data loss."""
    from deltalake import DeltaTable

    from durable_sinks.core.errors import ParticipantLostError
    from durable_sinks.core.protocol import CommitOutcome, OpenContext
    from durable_sinks.sinks.delta.handles import paths_of

    DeltaTable.create(str(tmp_path / "table"), schema=events([0]).schema)

    def opened(generation: int) -> Any:
        sink = create("delta", {"path": str(tmp_path / "table")})
        sink.open(OpenContext("orders", sink.name, generation))
        return sink

    live = opened(1)
    handles = []
    for epoch in (0, 1):
        live.begin_epoch(epoch)
        live.write_batch(events([epoch]))
        handles.append(live.pre_commit(epoch))
    for handle in handles:  # someone deletes the prepared files (VACUUM with zero retention)
        for path in paths_of(handle):
            (tmp_path / "table" / path).unlink()
    with pytest.raises(ParticipantLostError, match="data loss"):
        opened(2).commit_epoch(0, handles[0])  # recovery's view: checked
    assert live.commit_epoch(1, handles[1]) is CommitOutcome.COMMITTED  # live: trusted
    live.publish_epoch(1, [handles[1]])
    with pytest.raises(OSError, match=r"not found|No such file"):
        DeltaTable(str(tmp_path / "table")).to_pyarrow_table()  # readers fail, naming it
