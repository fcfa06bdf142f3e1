"""Executor mode's protocol without Spark: workers prepare parts (`prepare_part`), the
coordinator decides the winning attempts, commits them and rolls back every other attempt."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, prepare_part
from durable_sinks.coordinator._coordinator import LATE_SWEEP_EPOCHS
from durable_sinks.core import CommitHandle, OpenContext, SinkConnector, TaskBriefing
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


def test_an_attempt_that_lingers_past_the_next_epoch_is_swept_ten_epochs_later(
    tmp_path: Path,
) -> None:
    """A task attempt of epoch 0 that prepares only after epoch 1's sweep (it lingered, or
    was killed after it began) is rolled back by the running job at the end of epoch
    LATE_SWEEP_EPOCHS, not left to the next start."""
    c = coordinator(tmp_path, "a")
    g = c.generation
    assert g is not None

    def run(epoch: int) -> None:
        c.run_distributed_epoch(
            epoch, lambda gen: worker(tmp_path, ("a",), gen, epoch, f"p0-t{epoch}", rows(1, epoch))
        )

    run(0)
    run(1)
    late = worker(tmp_path, ("a",), g, 0, "p0-t99", rows(3, 100))
    for epoch in range(2, LATE_SWEEP_EPOCHS):
        run(epoch)
    assert staged(tmp_path, "a") == [h.participant for h in late]  # not yet
    run(LATE_SWEEP_EPOCHS)
    assert staged(tmp_path, "a") == []
    assert published_ids(tmp_path, "a") == list(range(LATE_SWEEP_EPOCHS + 1))


def test_after_a_restart_the_far_sweep_reads_the_previous_runs_decisions(
    tmp_path: Path,
) -> None:
    """The previous run's last epochs are swept too: their decisions come from the store in
    the first LATE_SWEEP_EPOCHS epochs after a start (a late attempt of the previous run's
    last epoch, prepared after the new start's recovery, is rolled back)."""
    first = coordinator(tmp_path, "a")
    first.run_distributed_epoch(0, lambda gen: worker(tmp_path, ("a",), gen, 0, "p0-t0", rows(1)))
    first.close()
    again = coordinator(tmp_path, "a")
    old = first.generation
    assert old is not None
    late = worker(tmp_path, ("a",), old, 0, "p0-t99", rows(3, 100))
    assert staged(tmp_path, "a") == [h.participant for h in late]

    def prepare(epoch: int) -> Callable[[int], list[CommitHandle]]:
        return lambda gen: worker(tmp_path, ("a",), gen, epoch, f"p0-t{epoch}", rows(1, epoch))

    for epoch in range(1, LATE_SWEEP_EPOCHS + 1):
        again.run_distributed_epoch(epoch, prepare(epoch))
    assert staged(tmp_path, "a") == []


class BriefingFiles(FolderSink):
    """A folder sink that gives a task brief and records the one each open received."""

    received: ClassVar[list[bytes | None]] = []

    def task_brief(self, epoch: int) -> bytes | None:
        return f"brief of {self.name} for {epoch}".encode()

    def open(self, context: OpenContext) -> None:
        BriefingFiles.received.append(context.task_brief)
        super().open(context)


def test_each_sinks_task_brief_reaches_its_workers_open(tmp_path: Path) -> None:
    BriefingFiles.received.clear()

    def built() -> list[SinkConnector]:
        return [BriefingFiles(Files(str(tmp_path / "a"), name="a")), files(tmp_path, "b")]

    c = Coordinator(
        "job", built(), LocalDirectoryStore(tmp_path / "store"), executor_mode=True, source="q"
    )
    c.start()
    assert isinstance(c.sinks[0], TaskBriefing)
    BriefingFiles.received.clear()  # the driver's own open
    assert c.task_briefs(3) == {"a": b"brief of a for 3"}

    def prepare(generation: int) -> list[CommitHandle]:
        briefs = c.task_briefs(0)
        return prepare_part("job", generation, 0, "p0-t0", built, rows(2), briefs=briefs)

    assert c.run_distributed_epoch(0, prepare).outcome is EpochOutcome.COMMITTED
    assert BriefingFiles.received == [b"brief of a for 0"]  # the worker's; "b" gives none
    assert published_ids(tmp_path, "a") == [0, 1]
