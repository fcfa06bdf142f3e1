"""Which stream a job writes: a decided epoch given again is a replay only when the job can
show it comes from the stream that decided it (coordinator/_decisions.py `same_stream`,
coordinator/_replay.py). A stream whose checkpoint was reset starts its batch ids again: its
batches must never be taken for replays of the old stream's decided epochs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, RetryPolicy, prepare_part
from durable_sinks.core import CommitHandle
from durable_sinks.core.errors import EpochOrderError
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
) -> Coordinator:
    started = Coordinator(
        "job",
        [files(tmp_path)],
        LocalDirectoryStore(tmp_path / "store"),
        commit_retry=FAST,
        replay_check=check,
        source=source,
        executor_mode=executor_mode,
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
    with pytest.raises(EpochOrderError, match="now writes stream 'query-2'") as raised:
        coordinator(tmp_path, "query-2").run_epoch(0, [ids(0)])
    assert "new job_id" in (raised.value.fix or "")


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


def on_executors(first: int, tmp_path: Path) -> Callable[[int], Sequence[CommitHandle]]:
    """Executor mode's `prepare`: one task's part holding ids first..first+9."""

    def prepare(generation: int) -> Sequence[CommitHandle]:
        return prepare_part("job", generation, 0, "p0-t1", lambda: [files(tmp_path)], [ids(first)])

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
