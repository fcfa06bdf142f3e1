"""Which stream a job writes: a decided epoch given again is a replay only when the job can
show it comes from the stream that decided it (coordinator/_decisions.py `same_stream`,
coordinator/_replay.py). A stream whose checkpoint was reset starts its batch ids again: its
batches must never be taken for replays of the old stream's decided epochs; told its
`first_epoch` (the job's newest epoch + 1), it continues the job (coordinator/_streams.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, RetryPolicy, prepare_part
from durable_sinks.core import CommitHandle
from durable_sinks.core.errors import ConfigError, EpochOrderError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink

FAST = RetryPolicy(attempts=3, first_wait_s=0.001, max_wait_s=0.01)


def ids(first: int, n: int = 10) -> pa.RecordBatch:
    return pa.record_batch({"id": list(range(first, first + n))})


def coordinator(
    tmp_path: Path,
    source: str | None,
    *,
    check: str = "warn",
    executor_mode: bool = False,
    first_epoch: int = 0,
) -> Coordinator:
    started = Coordinator(
        "job",
        [files(tmp_path)],
        LocalDirectoryStore(tmp_path / "store"),
        commit_retry=FAST,
        replay_check=check,
        source=source,
        executor_mode=executor_mode,
        first_epoch=first_epoch,
    )
    started.start()
    return started


def landed(tmp_path: Path, epoch: int = 0) -> list[int]:
    """The ids epoch `epoch` published (driver mode's file, or executor mode's parts)."""
    found: list[int] = []
    for file in (tmp_path / "out" / f"epoch={epoch}").rglob("*.parquet"):
        found.extend(pq.read_table(file).column("id").to_pylist())
    return sorted(found)


@pytest.mark.parametrize("check", ["warn", "fail", "off"])
def test_a_new_stream_of_an_unknown_identity_is_refused_not_dropped(
    tmp_path: Path, check: str
) -> None:
    """A job that cannot tell its stream commits epoch 0 (ids 0-9); its checkpoint is reset and
    the new stream's batch 0 holds ids 100-109: a typed error, the old rows untouched, never an
    "already committed" that drops the new rows, whatever replay_check says."""
    coordinator(tmp_path, None, check=check).run_epoch(0, [ids(0)])
    restarted = coordinator(tmp_path, None, check=check)
    with pytest.raises(EpochOrderError, match="cannot tell which stream") as raised:
        restarted.run_epoch(0, [ids(100)])
    assert "checkpoint_location" in (raised.value.fix or "")
    assert "nothing of this batch was written" in str(raised.value)
    assert landed(tmp_path) == list(range(10))


def test_a_replay_of_an_unknown_stream_with_the_same_rows_is_a_replay(tmp_path: Path) -> None:
    coordinator(tmp_path, None, check="off").run_epoch(0, [ids(0)])
    restarted = coordinator(tmp_path, None, check="off")
    replay = [ids(5, 5), ids(0, 5)]  # the same rows, in another order
    assert restarted.run_epoch(0, replay).outcome is EpochOutcome.ALREADY_COMMITTED
    assert landed(tmp_path) == list(range(10))


def test_a_decision_that_names_no_stream_is_proven_by_its_rows(tmp_path: Path) -> None:
    """A decision recorded without a stream (its job did not know it) and a job that knows
    its own: the rows decide, as if neither knew."""
    coordinator(tmp_path, None).run_epoch(0, [ids(0)])
    knowing = coordinator(tmp_path, "query-2")
    with pytest.raises(EpochOrderError, match="cannot tell which stream"):
        knowing.run_epoch(0, [ids(100)])
    assert coordinator(tmp_path, "query-2").run_epoch(0, [ids(0)]).outcome is (
        EpochOutcome.ALREADY_COMMITTED
    )


def test_another_known_stream_is_refused_before_anything(tmp_path: Path) -> None:
    coordinator(tmp_path, "query-1").run_epoch(0, [ids(0)])
    with pytest.raises(EpochOrderError, match="stream 'query-2', which the job has not") as raised:
        coordinator(tmp_path, "query-2").run_epoch(0, [ids(0)])
    assert "first_epoch=1" in (raised.value.fix or "")
    assert "own job_id" in (raised.value.fix or "")
    assert landed(tmp_path) == list(range(10))


def test_a_new_stream_told_its_first_epoch_continues_the_job(tmp_path: Path) -> None:
    """Stream 1 commits epochs 0-2; its checkpoint is lost. Stream 2 is refused at its batch 0
    until told first_epoch=3 (other values too), then its batch b is epoch 3 + b, its own
    restarts replay its epochs, and neither stream's rows are lost or written twice."""
    old = coordinator(tmp_path, "query-1")
    for epoch in range(3):
        old.run_epoch(epoch, [ids(epoch * 10)])
    for wrong in (0, 2, 4):
        with pytest.raises(EpochOrderError, match="which the job has not seen") as raised:
            coordinator(tmp_path, "query-2", first_epoch=wrong).run_epoch(wrong, [ids(100)])
        assert "first_epoch=3" in (raised.value.fix or "")
    new = coordinator(tmp_path, "query-2", first_epoch=3)
    assert new.run_epoch(3, [ids(100)]).outcome is EpochOutcome.COMMITTED
    assert new.run_epoch(4, [ids(110)]).outcome is EpochOutcome.COMMITTED
    record = new.decision(4)
    assert record is not None
    assert (record.source, record.first_epoch) == ("query-2", 3)
    restarted = coordinator(tmp_path, "query-2", first_epoch=3)
    assert restarted.run_epoch(4, [ids(110)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert restarted.run_epoch(5, [ids(120)]).outcome is EpochOutcome.COMMITTED
    assert [landed(tmp_path, e) for e in range(6)] == [
        list(range(first, first + 10)) for first in (0, 10, 20, 100, 110, 120)
    ]


def test_a_stream_must_keep_its_first_epoch(tmp_path: Path) -> None:
    coordinator(tmp_path, "query-1").run_epoch(0, [ids(0)])
    coordinator(tmp_path, "query-2", first_epoch=1).run_epoch(1, [ids(100)])
    with pytest.raises(ConfigError, match="stream 'query-2' started at epoch 1") as raised:
        coordinator(tmp_path, "query-2").run_epoch(1, [ids(110)])
    assert "keep first_epoch=1" in (raised.value.fix or "")
    with pytest.raises(EpochOrderError, match="stream 'query-1', which the job has not"):
        coordinator(tmp_path, "query-1").run_epoch(1, [ids(10)])  # its old checkpoint back
    assert [landed(tmp_path, e) for e in range(3)] == [list(range(10)), list(range(100, 110)), []]


def test_a_new_stream_continues_an_executor_mode_job(tmp_path: Path) -> None:
    first = coordinator(tmp_path, "query-1", executor_mode=True)
    first.run_distributed_epoch(0, on_executors(0, tmp_path))
    with pytest.raises(EpochOrderError, match="first_epoch=1"):
        coordinator(tmp_path, "query-2", executor_mode=True).run_distributed_epoch(
            0, on_executors(100, tmp_path)
        )
    moved = coordinator(tmp_path, "query-2", executor_mode=True, first_epoch=1)
    moved.run_distributed_epoch(1, on_executors(100, tmp_path, epoch=1))
    assert (landed(tmp_path, 0), landed(tmp_path, 1)) == (list(range(10)), list(range(100, 110)))


def test_first_epoch_is_a_non_negative_integer(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="first_epoch must be >= 0"):
        coordinator(tmp_path, "query-1", first_epoch=-1)


def test_the_same_known_stream_replays_with_other_rows_under_the_replay_check(
    tmp_path: Path,
) -> None:
    """A known stream that replays other rows is a non-deterministic query, not a new
    stream: the replay check's mode decides (warn: counted, the committed rows stay)."""
    coordinator(tmp_path, "query-1").run_epoch(0, [ids(0)])
    again = coordinator(tmp_path, "query-1")
    assert again.run_epoch(0, [ids(100)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert again.totals.replay_mismatches == 1
    assert landed(tmp_path) == list(range(10))


def files(tmp_path: Path) -> FolderSink:
    return FolderSink(Files(str(tmp_path / "out"), name="out"))


def on_executors(
    first: int, tmp_path: Path, epoch: int = 0
) -> Callable[[int], Sequence[CommitHandle]]:
    """Executor mode's `prepare`: one task's part of `epoch` holding ids first..first+9."""

    def prepare(generation: int) -> Sequence[CommitHandle]:
        return prepare_part(
            "job", generation, epoch, "p0-t1", lambda: [files(tmp_path)], [ids(first)]
        )

    return prepare


def test_executor_mode_refuses_a_decided_epoch_of_an_unknown_stream(tmp_path: Path) -> None:
    """Executor mode: the rows never reach the driver, so nothing can prove a replay of an
    unknown stream: refused, typed, after finishing the decided epoch; `prepare` (the new
    batch's tasks) never runs."""
    first = coordinator(tmp_path, None, executor_mode=True)
    first.run_distributed_epoch(0, on_executors(0, tmp_path))
    restarted = coordinator(tmp_path, None, executor_mode=True)

    def prepare(generation: int) -> Sequence[CommitHandle]:
        raise AssertionError("a decided epoch's batch was prepared again")

    with pytest.raises(EpochOrderError, match="executor mode"):
        restarted.run_distributed_epoch(0, prepare)
    assert landed(tmp_path) == list(range(10))


class DriverKilledError(Exception):
    """The driver dies at a step."""


def test_a_new_stream_killed_after_its_first_decision_finishes_it_at_its_restart(
    tmp_path: Path,
) -> None:
    """The new stream's first epoch is decided and the driver dies before any commit: its
    restart (same stream, same first_epoch) finds the decision its own, finishes the epoch
    and replays it as committed; the old stream's rows and the new one's are each there once."""
    coordinator(tmp_path, "query-1").run_epoch(0, [ids(0)])

    def die(step: str) -> None:
        if step == "after-decision":
            raise DriverKilledError(step)

    dying = Coordinator(
        "job",
        [files(tmp_path)],
        LocalDirectoryStore(tmp_path / "store"),
        commit_retry=FAST,
        source="query-2",
        first_epoch=1,
        on_step=die,
    )
    dying.start()
    with pytest.raises(DriverKilledError):
        dying.run_epoch(1, [ids(100)])
    assert landed(tmp_path, 1) == []
    restarted = coordinator(tmp_path, "query-2", first_epoch=1)
    assert restarted.run_epoch(1, [ids(100)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert (landed(tmp_path, 0), landed(tmp_path, 1)) == (list(range(10)), list(range(100, 110)))
