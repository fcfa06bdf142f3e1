"""Executor mode's protocol without Spark: workers prepare parts (`prepare_part`), the
coordinator decides the winning attempts, commits them and rolls back every other attempt."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, prepare_part
from durable_sinks.core import CommitHandle, SinkConnector
from durable_sinks.core.errors import CapabilityError, FencedError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import STAGING, Files, FolderSink
from tests.support.journal_sink import JournalSink


def rows(n: int, start: int = 0) -> list[pa.RecordBatch]:
    return [pa.record_batch({"id": list(range(start, start + n))})]


def files(tmp_path: Path, name: str = "a") -> FolderSink:
    return FolderSink(Files(str(tmp_path / name), name=name))


def coordinator(tmp_path: Path, *names: str) -> Coordinator:
    sinks: list[SinkConnector] = [files(tmp_path, n) for n in names]
    c = Coordinator(
        "job", sinks, LocalDirectoryStore(tmp_path / "store"), executor_mode=True, source="query-1"
    )
    c.start()
    return c


def worker(
    tmp_path: Path,
    names: tuple[str, ...],
    generation: int,
    epoch: int,
    part: str,
    batches: Iterable[pa.RecordBatch],
) -> list[CommitHandle]:
    return prepare_part(
        "job", generation, epoch, part, lambda: [files(tmp_path, n) for n in names], batches
    )


def published_ids(tmp_path: Path, name: str) -> list[int]:
    import pyarrow.parquet as pq

    ids: list[int] = []
    for file in (tmp_path / name).glob("epoch=*/part=*/*.parquet"):
        ids.extend(pq.read_table(file).column("id").to_pylist())
    return sorted(ids)


def staged(tmp_path: Path, name: str) -> list[str]:
    return sorted(p.name for p in (tmp_path / name / STAGING).iterdir())


def test_winning_attempts_commit_and_every_other_attempt_is_rolled_back(tmp_path: Path) -> None:
    c = coordinator(tmp_path, "a", "b")
    g = c.generation
    assert g is not None
    names = ("a", "b")

    def prepare(generation: int) -> list[CommitHandle]:
        first = worker(tmp_path, names, generation, 0, "p0-t1", rows(5))
        # partition 1: attempt t2 prepared, then its task "failed"; t3 is the one Spark kept
        worker(tmp_path, names, generation, 0, "p1-t2", rows(7, 100))
        kept = worker(tmp_path, names, generation, 0, "p1-t3", rows(7, 100))
        empty = worker(tmp_path, names, generation, 0, "p2-t4", [])
        assert empty == []
        return first + kept

    result = c.run_distributed_epoch(0, prepare)
    assert result.outcome is EpochOutcome.COMMITTED
    assert result.decision.rows() == {"a": 12, "b": 12}
    assert {h.participant.split(":")[4] for h in result.decision.handles} == {"p0-t1", "p1-t3"}
    for name in names:
        assert published_ids(tmp_path, name) == [*range(5), *range(100, 107)]
        assert staged(tmp_path, name) == []  # the losing attempt p1-t2 was rolled back

    # Spark replays the batch: nothing is prepared again, nothing changes.
    def must_not_run(generation: int) -> list[CommitHandle]:
        raise AssertionError("a decided epoch was prepared again")

    assert c.run_distributed_epoch(0, must_not_run).outcome is EpochOutcome.ALREADY_COMMITTED
    assert published_ids(tmp_path, "a") == [*range(5), *range(100, 107)]


def test_a_failed_distributed_epoch_leaves_nothing_prepared(tmp_path: Path) -> None:
    c = coordinator(tmp_path, "a")

    def prepare(generation: int) -> list[CommitHandle]:
        worker(tmp_path, ("a",), generation, 3, "p0-t1", rows(5))
        raise RuntimeError("stage failed: executor lost")

    with pytest.raises(RuntimeError, match="executor lost"):
        c.run_distributed_epoch(3, prepare)
    assert staged(tmp_path, "a") == []
    assert c.store.get(3) is None
    result = c.run_distributed_epoch(3, lambda g: worker(tmp_path, ("a",), g, 3, "p0-t9", rows(2)))
    assert result.outcome is EpochOutcome.COMMITTED
    assert published_ids(tmp_path, "a") == [0, 1]


def test_a_worker_that_fails_rolls_back_its_own_part(tmp_path: Path) -> None:
    c = coordinator(tmp_path, "a")
    assert c.generation is not None

    def failing() -> Iterator[pa.RecordBatch]:
        yield from rows(3)
        raise OSError("partition recomputation failed")

    with pytest.raises(OSError, match="recomputation"):
        worker(tmp_path, ("a",), c.generation, 0, "p0-t1", failing())
    assert staged(tmp_path, "a") == []


def test_a_newer_generations_attempts_are_never_touched_by_a_zombie(tmp_path: Path) -> None:
    zombie = coordinator(tmp_path, "a")
    newer = coordinator(tmp_path, "a")
    assert newer.generation is not None
    theirs = worker(tmp_path, ("a",), newer.generation, 0, "p0-t1", rows(4))
    with pytest.raises(FencedError):
        zombie.run_distributed_epoch(
            0, lambda g: worker(tmp_path, ("a",), g, 0, "p0-t2", rows(4, 50))
        )
    assert [h.participant for h in prepared_in(tmp_path, "a", newer.generation)] == [
        theirs[0].participant
    ]
    result = newer.run_distributed_epoch(0, lambda g: theirs)
    assert result.outcome is EpochOutcome.COMMITTED
    assert published_ids(tmp_path, "a") == [0, 1, 2, 3]


def prepared_in(tmp_path: Path, name: str, generation: int) -> list[CommitHandle]:
    from durable_sinks.core import OpenContext

    sink = files(tmp_path, name)
    sink.open(OpenContext("job", name, generation))
    return sink.prepared_participants(0)


def test_executor_mode_refuses_sinks_without_distributed_prepare(tmp_path: Path) -> None:
    c = Coordinator(
        "job",
        [files(tmp_path, "a"), JournalSink(tmp_path / "j")],
        LocalDirectoryStore(tmp_path / "store"),
        executor_mode=True,
    )
    with pytest.raises(CapabilityError, match="distributed_prepare"):
        c.start()


def test_an_attempt_prepared_after_its_epochs_decision_is_swept_at_the_next_epoch(
    tmp_path: Path,
) -> None:
    """A late (or speculative) task prepares a part of epoch 0 after epoch 0 was decided and
    its losers discarded: it is rolled back at the end of epoch 1, while the job runs (it
    held a staging folder, a prepared transaction or an open upload until the next start)."""
    c = coordinator(tmp_path, "a")
    g = c.generation
    assert g is not None
    c.run_distributed_epoch(0, lambda gen: worker(tmp_path, ("a",), gen, 0, "p0-t1", rows(3)))
    late = worker(tmp_path, ("a",), g, 0, "p0-t9", rows(3))
    assert [h.participant for h in late] == staged(tmp_path, "a")
    result = c.run_distributed_epoch(
        1, lambda gen: worker(tmp_path, ("a",), gen, 1, "p0-t2", rows(2, 10))
    )
    assert result.outcome is EpochOutcome.COMMITTED
    assert staged(tmp_path, "a") == []
    assert published_ids(tmp_path, "a") == [0, 1, 2, 10, 11]
