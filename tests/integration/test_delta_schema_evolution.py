"""Schema evolution and dead letters with the Delta sink, on local tables: with
schema_evolution='add_columns' a new nullable column joins the table's schema in the epoch's
own commit (one log version holds the metaData, add and txn actions), so a rolled-back epoch
leaves the schema as it was; widening a column is refused with the fix; and a Delta table
created from the dead-letter schema takes a files target's dead letters."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_sinks.coordinator import Coordinator, prepare_part
from durable_sinks.core import CommitHandle, CommitOutcome, SinkConnector
from durable_sinks.core.bad_rows import (
    BadRowCap,
    BadRowPolicy,
    SchemaEvolution,
    WritePolicy,
    dead_letter_schema,
)
from durable_sinks.core.errors import SchemaMismatchError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from durable_sinks.sinks.delta import Delta, DeltaSink
from durable_sinks.sinks.folder import Files
from tests.support.delta_target import folder_leftovers, log_epochs
from tests.support.refusing_sink import RefusingFileSink

ADD_COLUMNS = WritePolicy(schema_evolution=SchemaEvolution.ADD_COLUMNS)


def job(tmp_path: Path, policy: WritePolicy = ADD_COLUMNS, **options: Any) -> Coordinator:
    sink = create("delta", {"path": str(tmp_path / "table"), "create_table": True, **options})
    name = f"delta-{uuid.uuid4().hex[:8]}"
    coordinator = Coordinator(name, [sink], LocalDirectoryStore(tmp_path / "store"), policy=policy)
    coordinator.start()
    return coordinator


def table_rows(path: Path, key: str = "id") -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return sorted(
        pa.table(DeltaTable(str(path)).to_pyarrow_table()).to_pylist(), key=lambda r: r[key]
    )


def columns(path: Path) -> list[str]:
    from deltalake import DeltaTable

    return list(pa.schema(DeltaTable(str(path)).schema().to_arrow()).names)


def commit_actions(path: Path, epoch: int) -> list[str]:
    """The kinds of action in the log version that committed `epoch`."""
    for version in sorted((path / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in version.read_text().split("\n") if line.strip()]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        if info.get("durable_sinks.epoch") == str(epoch):
            return sorted({kind for a in actions for kind in a})
    raise AssertionError(f"no log version commits epoch {epoch}")


def test_a_new_column_joins_the_schema_in_the_epochs_own_commit(tmp_path: Path) -> None:
    table = tmp_path / "table"
    coordinator = job(tmp_path, partition_by=["day"])
    coordinator.run_epoch(0, [pa.record_batch({"id": [1], "day": ["a"]})])
    # The epoch's first batch lacks the column, its second has it: both land.
    coordinator.run_epoch(
        1,
        [
            pa.record_batch({"id": [2], "day": ["a"]}),
            pa.record_batch({"id": [3, 4], "day": ["a", "b"], "note": ["x", None]}),
        ],
    )
    assert columns(table) == ["id", "day", "note"]
    assert commit_actions(table, 1) == ["add", "commitInfo", "metaData", "txn"]
    assert table_rows(table) == [
        {"id": 1, "day": "a", "note": None},
        {"id": 2, "day": "a", "note": None},
        {"id": 3, "day": "a", "note": "x"},
        {"id": 4, "day": "b", "note": None},
    ]
    # Later epochs without the column still fit (an append fills it with nulls).
    coordinator.run_epoch(2, [pa.record_batch({"id": [5], "day": ["b"]})])
    coordinator.close()
    assert len(table_rows(table)) == 5
    assert log_epochs(table) == [0, 1, 2]
    assert folder_leftovers(table) == []


def test_a_rolled_back_epoch_leaves_the_schema_as_it_was(tmp_path: Path) -> None:
    table = tmp_path / "table"
    coordinator = job(tmp_path)
    coordinator.run_epoch(0, [pa.record_batch({"id": [1], "body": ["one"]})])
    added = pa.record_batch({"id": [2], "body": ["two"], "extra": [2.5]})
    wrong = pa.record_batch({"id": ["three"], "body": ["three"]})
    with pytest.raises(SchemaMismatchError, match="column 'id' has type string"):
        coordinator.run_epoch(1, [added, wrong])
    assert columns(table) == ["id", "body"]
    assert folder_leftovers(table) == []
    # The replay without the column keeps the table's schema.
    coordinator.run_epoch(1, [pa.record_batch({"id": [2], "body": ["two"]})])
    coordinator.close()
    assert columns(table) == ["id", "body"]
    assert [r["id"] for r in table_rows(table)] == [1, 2]


def test_upsert_adds_the_column_in_its_merge(tmp_path: Path) -> None:
    table = tmp_path / "table"
    coordinator = job(tmp_path, mode="upsert", key="id")
    coordinator.run_epoch(0, [pa.record_batch({"id": [1, 2], "body": ["one", "two"]})])
    coordinator.run_epoch(1, [pa.record_batch({"id": [2, 3], "body": ["b", "c"], "n": [20, 30]})])
    coordinator.close()
    assert commit_actions(table, 1) == ["add", "commitInfo", "metaData", "remove", "txn"]
    assert table_rows(table) == [
        {"id": 1, "body": "one", "n": None},
        {"id": 2, "body": "b", "n": 20},
        {"id": 3, "body": "c", "n": 30},
    ]


def test_widening_and_new_columns_without_add_columns_are_refused_with_the_fix(
    tmp_path: Path,
) -> None:
    coordinator = job(tmp_path)
    coordinator.run_epoch(0, [pa.record_batch({"id": pa.array([1], pa.int32())})])
    with pytest.raises(SchemaMismatchError, match="column 'id' has type int64, the table int32"):
        coordinator.run_epoch(1, [pa.record_batch({"id": pa.array([2], pa.int64())})])
    coordinator.close()
    strict = job(tmp_path, WritePolicy())
    with pytest.raises(SchemaMismatchError, match="column 'new' is not in the table") as raised:
        strict.run_epoch(1, [pa.record_batch({"id": pa.array([2], pa.int32()), "new": [1]})])
    strict.close()
    assert "schema_evolution='add_columns'" in (raised.value.fix or "")
    assert columns(tmp_path / "table") == ["id"]


def test_a_delta_table_created_from_the_dead_letter_schema_takes_dead_letters(
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable

    letters = tmp_path / "letters"
    dead = create("delta", {"path": str(letters), "create_table": True, "name": "dead"})
    target = RefusingFileSink(Files(str(tmp_path / "target"), name="target"))
    coordinator = Coordinator(
        "delta-dead-letters",
        [target],
        LocalDirectoryStore(tmp_path / "store"),
        policy=WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER),
        dead_letter=dead,
        bad_row_cap=BadRowCap(10),
    )
    coordinator.start()
    coordinator.run_epoch(0, [pa.record_batch({"id": [1, 2, 3], "v": [1, -2, -3]})])
    coordinator.run_epoch(1, [pa.record_batch({"id": [4], "v": [4]})])  # no dead letter
    coordinator.run_epoch(2, [pa.record_batch({"id": [5], "v": [-5]})])
    coordinator.close()
    schema = pa.schema(DeltaTable(str(letters)).schema().to_arrow())
    assert schema.names == dead_letter_schema().names
    assert [f.nullable for f in schema] == [f.nullable for f in dead_letter_schema()]
    found = table_rows(letters, key="row_json")
    assert [(r["epoch"], r["sink"], r["row_number"], r["reason"]) for r in found] == [
        (0, "target", 1, "check"),
        (0, "target", 2, "check"),
        (2, "target", 0, "check"),
    ]
    assert [json.loads(r["row_json"])["id"] for r in found] == [2, 3, 5]
    # epoch 1 had no dead letter: the dead-letter table has no commit of it
    assert sorted(set(log_epochs(letters))) == [0, 2]
    assert folder_leftovers(letters) == []
    landed = pq.read_table(tmp_path / "target").column("id").to_pylist()
    assert sorted(landed) == [1, 4]


@pytest.mark.parametrize(
    ("crash_after", "added"), [("after-pre-commit:delta", False), ("after-decision", True)]
)
def test_a_crash_in_an_epoch_that_adds_a_column(
    tmp_path: Path, crash_after: str, added: bool
) -> None:
    """Undecided, the next start rolls it back and the schema stays; decided, the next start
    commits it (the column with it) from the participant's files, then deletes them."""
    table = tmp_path / "table"

    def coordinator() -> Coordinator:
        sink = create("delta", {"path": str(table), "create_table": True})
        store = LocalDirectoryStore(tmp_path / "store")
        made = Coordinator("delta-crash", [sink], store, policy=ADD_COLUMNS)
        made.start()
        return made

    first = coordinator()
    first.run_epoch(0, [pa.record_batch({"id": [1]})])
    steps = first.epoch_steps(1, [pa.record_batch({"id": [2], "extra": ["x"]})])
    for step in steps:
        if step == crash_after:
            break  # the driver dies here: nothing cleaned up
    else:
        raise AssertionError(f"the epoch never reached {crash_after}")
    second = coordinator()
    assert columns(table) == (["id", "extra"] if added else ["id"])
    second.run_epoch(1, [pa.record_batch({"id": [2], "extra": ["x"]})])
    second.run_epoch(2, [pa.record_batch({"id": [3]})])
    second.close()
    assert columns(table) == ["id", "extra"]
    assert table_rows(table) == [
        {"id": 1, "extra": None},
        {"id": 2, "extra": "x"},
        {"id": 3, "extra": None},
    ]
    assert log_epochs(table) == [0, 1, 2]
    assert folder_leftovers(table) == []


class HeldDelta(DeltaSink):
    """The Delta sink, its epochs' log commits held at `gate` (commits beside writes)."""

    def __init__(self, config: Delta) -> None:
        super().__init__(config)
        self.gate = threading.Event()
        self.gate.set()
        self.publishing = threading.Event()

    def publish_epoch(self, epoch: int, handles: Sequence[CommitHandle]) -> CommitOutcome:
        self.publishing.set()
        assert self.gate.wait(timeout=30)
        return super().publish_epoch(epoch, handles)


def held_job(tmp_path: Path) -> tuple[Coordinator, HeldDelta]:
    sink = HeldDelta(Delta(path=str(tmp_path / "table"), create_table=True))
    coordinator = Coordinator(
        f"delta-{uuid.uuid4().hex[:8]}",
        [sink],
        LocalDirectoryStore(tmp_path / "store"),
        policy=ADD_COLUMNS,
        background_commits=True,
    )
    coordinator.start()
    return coordinator, sink


def test_the_next_epoch_written_beside_a_commit_that_adds_a_column_lands_with_it(
    tmp_path: Path,
) -> None:
    """background_commits: epoch 1 adds `note` and its log commit is held while epoch 2 is
    written (in the table's shape before epoch 1) with `note` of the same type: both land,
    each in its own commit, `note` in the schema once."""
    table = tmp_path / "table"
    coordinator, sink = held_job(tmp_path)
    coordinator.run_epoch(0, [pa.record_batch({"id": [1, 2]})])
    sink.gate.clear()
    coordinator.run_epoch(1, [pa.record_batch({"id": [3], "note": ["a"]})])
    assert sink.publishing.wait(timeout=10)
    sink.begin_epoch(2)  # the shape it begins in: the table's before epoch 1's commit
    began = sink.schema()
    assert began is not None
    assert began.names == ["id"]
    sink.rollback_epoch(2, None)
    threading.Timer(0.3, sink.gate.set).start()
    coordinator.run_epoch(2, [pa.record_batch({"id": [4], "note": ["b"]})])
    coordinator.close()
    assert columns(table) == ["id", "note"]
    assert table_rows(table) == [
        {"id": 1, "note": None},
        {"id": 2, "note": None},
        {"id": 3, "note": "a"},
        {"id": 4, "note": "b"},
    ]
    assert log_epochs(table) == [0, 1, 2]


def test_a_column_added_again_with_another_type_beside_the_commit_is_refused_before_the_decision(
    tmp_path: Path,
) -> None:
    """The same, but epoch 2 adds `note` as a number while epoch 1's commit (held) adds it
    as text: epoch 2 is refused before its decision, with the conflict named, and nothing
    of it lands; the query's retry, in the table's new shape, does."""
    table = tmp_path / "table"
    coordinator, sink = held_job(tmp_path)
    coordinator.run_epoch(0, [pa.record_batch({"id": [1]})])
    sink.gate.clear()
    coordinator.run_epoch(1, [pa.record_batch({"id": [2], "note": ["a"]})])
    assert sink.publishing.wait(timeout=10)
    threading.Timer(0.3, sink.gate.set).start()
    with pytest.raises(SchemaMismatchError, match="column 'note' is long in some files"):
        coordinator.run_epoch(2, [pa.record_batch({"id": [3], "note": [7]})])
    assert coordinator.decision(2) is None
    assert log_epochs(table) == [0, 1]
    with pytest.raises(SchemaMismatchError, match="'note'"):  # the retry, in the new shape
        coordinator.run_epoch(2, [pa.record_batch({"id": [3], "note": [7]})])
    coordinator.run_epoch(2, [pa.record_batch({"id": [3], "note": ["c"]})])
    coordinator.close()
    assert table_rows(table) == [
        {"id": 1, "note": None},
        {"id": 2, "note": "a"},
        {"id": 3, "note": "c"},
    ]
    assert folder_leftovers(table) == []


def test_parts_of_one_epoch_that_add_a_column_with_different_types_are_refused_before_the_decision(
    tmp_path: Path,
) -> None:
    """Executor mode: two tasks each add `note`, one as text, one as a number. The epoch
    is refused before its decision (one column cannot hold both), nothing of it lands."""
    table = tmp_path / "table"
    job_id = f"delta-{uuid.uuid4().hex[:8]}"

    def build() -> list[SinkConnector]:
        return [DeltaSink(Delta(path=str(table), create_table=True))]

    coordinator = Coordinator(
        job_id,
        build(),
        LocalDirectoryStore(tmp_path / "store"),
        executor_mode=True,
        policy=ADD_COLUMNS,
        source="q",
    )
    coordinator.start()
    parts = {
        "p0-t0": pa.record_batch({"id": [1], "note": ["a"]}),
        "p1-t1": pa.record_batch({"id": [2], "note": [7]}),
    }

    def prepare(generation: int) -> list[CommitHandle]:
        return [
            handle
            for part, rows in parts.items()
            for handle in prepare_part(
                job_id, generation, 0, part, build, [rows], policy=ADD_COLUMNS
            )
        ]

    with pytest.raises(SchemaMismatchError, match="column 'note' is"):
        coordinator.run_distributed_epoch(0, prepare)
    assert coordinator.decision(0) is None
    coordinator.close()
    assert not (table / "_delta_log").exists() or log_epochs(table) == []
    assert folder_leftovers(table) == []
