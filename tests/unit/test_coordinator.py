"""The coordinator's paths that the conformance suite does not aim at: failures before and
after the decision, retries of transient errors only, order errors, logs and metrics."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, RetryPolicy
from durable_sinks.core import DeliveryGuarantee, SinkConnector
from durable_sinks.core.errors import (
    CommitIncompleteError,
    ConfigError,
    EpochOrderError,
    FencedError,
    SchemaMismatchError,
    TransientError,
    UsageError,
)
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import STAGING, Files, FolderSink
from tests.support.faulty import Faulty

FAST = RetryPolicy(attempts=3, first_wait_s=0.001, max_wait_s=0.01)


def batch(epoch: int, n: int = 4) -> pa.RecordBatch:
    return pa.record_batch({"key": [f"{epoch}:{i}" for i in range(n)], "v": list(range(n))})


def files(tmp_path: Path, name: str) -> FolderSink:
    return FolderSink(Files(str(tmp_path / name), name=name))


#: The stream the tests' coordinators write (a replay of a decided epoch is then told from a
#: new stream by its name: tests/unit/test_stream_identity.py).
SOURCE = "query-1"


def started(tmp_path: Path, *sinks: SinkConnector) -> Coordinator:
    coordinator = Coordinator(
        "job",
        list(sinks),
        LocalDirectoryStore(tmp_path / "store"),
        commit_retry=FAST,
        source=SOURCE,
    )
    coordinator.start()
    return coordinator


def published(tmp_path: Path, name: str) -> int:
    return len(list((tmp_path / name).glob("epoch=*/part=*/_EPOCH.json")))


def staged(tmp_path: Path, name: str) -> int:
    return len(list((tmp_path / name / STAGING).iterdir()))


def test_failure_before_the_decision_rolls_back_every_sink(tmp_path: Path) -> None:
    bad = Faulty(files(tmp_path, "b"), pre_commit=[OSError("disk full")])
    coordinator = started(tmp_path, files(tmp_path, "a"), bad)
    with pytest.raises(OSError, match="disk full"):
        coordinator.run_epoch(0, [batch(0)])
    assert (staged(tmp_path, "a"), staged(tmp_path, "b")) == (0, 0)
    assert coordinator.store.get(0) is None
    result = coordinator.run_epoch(0, [batch(0)])  # Spark's replay writes it afresh
    assert result.outcome is EpochOutcome.COMMITTED
    assert (published(tmp_path, "a"), published(tmp_path, "b")) == (1, 1)


def test_transient_commit_errors_are_retried(tmp_path: Path) -> None:
    flaky = Faulty(
        files(tmp_path, "a"), commit_epoch=[TransientError("blip"), TransientError("blip")]
    )
    coordinator = started(tmp_path, flaky)
    assert coordinator.run_epoch(0, [batch(0)]).outcome is EpochOutcome.COMMITTED
    assert flaky.calls["commit_epoch"] == 3


def test_after_the_decision_nothing_is_rolled_back(tmp_path: Path) -> None:
    broken = Faulty(files(tmp_path, "b"), commit_epoch=[TransientError("down")] * 5)
    coordinator = started(tmp_path, files(tmp_path, "a"), broken)
    with pytest.raises(CommitIncompleteError, match="replaying the epoch") as raised:
        coordinator.run_epoch(0, [batch(0)])
    assert raised.value.sink == "b"
    assert coordinator.store.get(0) is not None  # decided
    assert published(tmp_path, "a") == 1
    assert staged(tmp_path, "b") == 1  # still prepared, not rolled back
    broken.faults.clear()
    # Spark replays the epoch (any data): the decided participants are committed.
    result = coordinator.run_epoch(0, [batch(99)])
    assert result.outcome is EpochOutcome.ALREADY_COMMITTED
    assert (published(tmp_path, "a"), published(tmp_path, "b")) == (1, 1)
    keys = pq.read_table(tmp_path / "b" / "epoch=0").column("key").to_pylist()
    assert sorted(keys) == [f"0:{i}" for i in range(4)]  # the decided data, not the replay's


def test_non_transient_commit_errors_are_not_retried(tmp_path: Path) -> None:
    broken = Faulty(files(tmp_path, "a"), commit_epoch=[ConfigError("bad")])
    coordinator = started(tmp_path, broken)
    with pytest.raises(CommitIncompleteError):
        coordinator.run_epoch(0, [batch(0)])
    assert broken.calls["commit_epoch"] == 1


def test_restart_finishes_a_decided_epoch(tmp_path: Path) -> None:
    broken = Faulty(files(tmp_path, "a"), commit_epoch=[TransientError("down")] * 3)
    with pytest.raises(CommitIncompleteError):
        started(tmp_path, broken).run_epoch(0, [batch(0)])
    fresh = Coordinator("job", [files(tmp_path, "a")], LocalDirectoryStore(tmp_path / "store"))
    recovery = fresh.start()
    assert [h.epoch for h in recovery.committed] == [0]
    assert published(tmp_path, "a") == 1


def test_an_older_epoch_after_a_newer_one_is_refused(tmp_path: Path) -> None:
    coordinator = started(tmp_path, files(tmp_path, "a"))
    for epoch in range(3):
        coordinator.run_epoch(epoch, [batch(epoch)])
    coordinator.store.expire(before_epoch=2)  # epoch 0 and 1 records gone
    with pytest.raises(EpochOrderError, match="epoch 2 is already committed") as raised:
        coordinator.run_epoch(1, [batch(1)])
    assert "checkpoint was reset" in (raised.value.fix or "")


def test_sink_data_without_a_decision_is_refused(tmp_path: Path) -> None:
    started(tmp_path / "one", files(tmp_path, "a")).run_epoch(0, [batch(0)])
    other_store = started(tmp_path / "two", files(tmp_path, "a"))  # same sink, new store
    with pytest.raises(EpochOrderError, match="already holds epoch 0") as raised:
        other_store.run_epoch(0, [batch(0)])
    assert raised.value.sink == "a"


def test_input_must_be_record_batches(tmp_path: Path) -> None:
    coordinator = started(tmp_path, files(tmp_path, "a"))
    with pytest.raises(SchemaMismatchError, match=r"expected pyarrow\.RecordBatch, got Table"):
        coordinator.run_epoch(0, [pa.table({"x": [1]})])
    assert staged(tmp_path, "a") == 0


def test_epochs_need_start_and_start_happens_once(tmp_path: Path) -> None:
    coordinator = Coordinator("job", [files(tmp_path, "a")], LocalDirectoryStore(tmp_path))
    with pytest.raises(UsageError, match="call start"):
        coordinator.run_epoch(0, [])
    coordinator.start()
    with pytest.raises(UsageError, match="already started"):
        coordinator.start()


def test_every_log_line_names_job_sink_and_epoch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="durable_sinks")
    bad = Faulty(
        files(tmp_path, "a"), rollback_epoch=[OSError("gone")], pre_commit=[OSError("boom")]
    )
    coordinator = started(tmp_path, bad)
    with pytest.raises(OSError, match="boom"):
        coordinator.run_epoch(0, [batch(0)])
    coordinator.run_epoch(0, [batch(0)])
    assert caplog.records
    for record in caplog.records:
        message = record.getMessage()
        assert message.startswith("job=job sink="), message
        assert " epoch=" in message
    assert any("sink=a epoch=0" in r.getMessage() for r in caplog.records)


def test_metrics_per_phase(tmp_path: Path) -> None:
    coordinator = started(tmp_path, files(tmp_path, "a"), files(tmp_path, "b"))
    result = coordinator.run_epoch(0, [batch(0, 10), batch(0, 5)])
    metrics = result.metrics
    assert metrics.rows == {"a": 15, "b": 15}
    assert metrics.batches == 2
    assert all(
        metrics.seconds[p] > 0 for p in ("begin", "write", "pre_commit", "decision", "commit")
    )
    assert metrics.protocol_seconds < metrics.total_seconds
    assert coordinator.totals.epochs_committed == 1
    assert coordinator.totals.rows == 30


def test_a_decided_epoch_replayed_from_another_source_is_refused(tmp_path: Path) -> None:
    first = started(tmp_path, files(tmp_path, "a"))
    first.source = "query-1"
    assert first.run_epoch(0, [batch(0)]).decision.source == "query-1"
    first.close()
    second = started(tmp_path, files(tmp_path, "a"))
    second.source = "query-2"
    with pytest.raises(EpochOrderError, match="another query writes under the same job id"):
        second.run_epoch(0, [batch(0, n=9)])
    assert published(tmp_path, "a") == 1
    second.source = "query-1"  # the same query replaying its own batch is fine
    assert second.run_epoch(0, [batch(0)]).outcome is EpochOutcome.ALREADY_COMMITTED


def test_at_least_once_commits_each_sink_on_its_own_and_replays_skip_landed_sinks(
    tmp_path: Path,
) -> None:
    def make() -> Coordinator:
        c = Coordinator(
            "job",
            [files(tmp_path, "a"), files(tmp_path, "b")],
            LocalDirectoryStore(tmp_path / "store"),
            guarantee=DeliveryGuarantee.AT_LEAST_ONCE,
        )
        c.start()
        return c

    first = make()
    steps = first.epoch_steps(0, [batch(0)])
    for step in steps:
        if step == "after-commit:a":
            break  # crash between the two sinks' commits
    assert (published(tmp_path, "a"), published(tmp_path, "b")) == (1, 0)
    assert first.store.get(0) is None  # no decision record in at-least-once mode

    second = make()  # recovery rolls back b's leftover; Spark replays epoch 0
    result = second.run_epoch(0, [batch(0)])
    assert result.outcome is EpochOutcome.COMMITTED
    assert (published(tmp_path, "a"), published(tmp_path, "b")) == (1, 1)
    assert set(result.metrics.rows) == {"b"}  # a already had the epoch: skipped
    assert second.run_epoch(0, [batch(0)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert (staged(tmp_path, "a"), staged(tmp_path, "b")) == (0, 0)


def test_a_ride_out_takes_over_only_while_no_other_driver_started(tmp_path: Path) -> None:
    """A driver riding out an outage starts its next coordinator as the successor of its own
    generation: it takes the job back only if no other driver claimed it meanwhile."""

    def coordinator() -> Coordinator:
        store = LocalDirectoryStore(tmp_path / "store")
        return Coordinator("job", [files(tmp_path, "a")], store, commit_retry=FAST)

    first = coordinator()
    first.start()
    assert first.generation == 1
    first.close()
    again = coordinator()
    again.start(successor_of=1)  # nobody started meanwhile: the ride-out goes on
    assert again.generation == 2
    again.close()

    other = coordinator()
    other.start()  # another driver of the job (generation 3)
    zombie = coordinator()
    with pytest.raises(FencedError, match="another driver of the job claimed generation 3"):
        zombie.start(successor_of=2)
    assert zombie.claimed_generation is None  # it claimed nothing: the other is not fenced
    other.run_epoch(0, [batch(0)])
    assert published(tmp_path, "a") == 1
