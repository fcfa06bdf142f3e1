"""The replay check (coordinator/_replay.py): a replay of a decided epoch is compared with the
rows the epoch committed; a difference is logged and counted, or raised after the epoch is
finished; the committed rows never change."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_sinks import ReplayMismatchError
from durable_sinks.coordinator import Coordinator, EpochOutcome, JobTotals, RetryPolicy
from durable_sinks.coordinator._replay import ReplayCheck
from durable_sinks.core import SinkConnector
from durable_sinks.core.content import ContentSummary, summarise
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.manifest import DecisionRecord, LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from tests.support.journal_sink import JournalSink

FAST = RetryPolicy(attempts=3, first_wait_s=0.001, max_wait_s=0.01)


def rows(epoch: int, n: int = 6, body: str = "row") -> pa.RecordBatch:
    return pa.record_batch(
        {"key": [f"{epoch}:{i}" for i in range(n)], "v": list(range(n)), "body": [body] * n}
    )


def files(tmp_path: Path, name: str = "a") -> FolderSink:
    return FolderSink(Files(str(tmp_path / name), name=name))


def coordinator(
    tmp_path: Path, *sinks: SinkConnector, check: str = "warn", store: str = "store"
) -> Coordinator:
    """A started coordinator of one known stream (tests/unit/test_stream_identity.py has
    those that do not know theirs)."""
    started = Coordinator(
        "job",
        list(sinks) or [files(tmp_path)],
        LocalDirectoryStore(tmp_path / store),
        commit_retry=FAST,
        replay_check=check,
        source="query-1",
    )
    started.start()
    return started


def keys(tmp_path: Path, epoch: int, name: str = "a") -> list[str]:
    return sorted(pq.read_table(tmp_path / name / f"epoch={epoch}").column("key").to_pylist())


def mismatches(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "with other rows than it committed" in r.getMessage()]


def test_the_decision_records_what_the_epoch_was_given(tmp_path: Path) -> None:
    batches = [rows(0, 4), rows(0, 3, "more")]
    result = coordinator(tmp_path).run_epoch(0, batches)
    assert result.decision.content == summarise(batches)
    stored = LocalDirectoryStore(tmp_path / "store")
    stored.open("job")
    decision = stored.get(0)
    assert decision is not None
    assert decision.content == summarise(batches)  # (durable, through to_bytes/from_bytes)


def test_a_replay_with_the_same_rows_in_another_order_passes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    coord = coordinator(tmp_path)
    first = pa.Table.from_batches([rows(0, 5), rows(0, 5, "b")])
    coord.run_epoch(0, first.to_batches())
    caplog.set_level(logging.INFO, logger="durable_sinks")
    replay = first.take([9, 3, 0, 1, 2, 8, 7, 6, 5, 4]).to_batches(max_chunksize=3)
    result = coord.run_epoch(0, replay)
    assert result.outcome is EpochOutcome.ALREADY_COMMITTED
    assert coord.totals.replay_mismatches == 0
    assert mismatches(caplog) == []
    assert any("the replay gave the rows the epoch committed" in r.message for r in caplog.records)


def test_a_replay_with_other_rows_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    coord = coordinator(tmp_path)
    coord.run_epoch(0, [rows(0)])
    caplog.set_level(logging.WARNING, logger="durable_sinks")
    changed = [rows(0, 6, "changed")]  # same count, other values
    result = coord.run_epoch(0, changed)
    assert result.outcome is EpochOutcome.ALREADY_COMMITTED
    assert coord.totals.replay_mismatches == 1
    (warning,) = mismatches(caplog)
    assert warning.levelno == logging.WARNING
    text = warning.getMessage()
    assert "job=job" in text
    assert "epoch=0" in text
    assert f"committed {summarise([rows(0)])}" in text
    assert f"replayed {summarise(changed)}" in text
    assert "not deterministic" in text
    assert "rand()" in text
    # fewer rows: counted again; the committed rows never change
    coord.run_epoch(0, [rows(0, 2)])
    assert coord.totals.replay_mismatches == 2
    assert keys(tmp_path, 0) == [f"0:{i}" for i in range(6)]
    body = pq.read_table(tmp_path / "a" / "epoch=0").column("body").to_pylist()
    assert set(body) == {"row"}
    # the next epoch goes on as usual
    assert coord.run_epoch(1, [rows(1)]).outcome is EpochOutcome.COMMITTED


def test_fail_raises_after_the_epoch_is_finished(tmp_path: Path) -> None:
    coord = coordinator(tmp_path, files(tmp_path, "a"), files(tmp_path, "b"), check="fail")
    coord.run_epoch(0, [rows(0)])
    with pytest.raises(ReplayMismatchError, match="not deterministic") as raised:
        coord.run_epoch(0, [rows(0, 7)])
    error = raised.value
    assert (error.job, error.epoch) == ("job", 0)
    assert "replay_check='warn'" in (error.fix or "")
    assert "committed 6 rows" in str(error)
    assert "replayed 7 rows" in str(error)
    assert not error.retriable
    assert coord.totals.replay_mismatches == 1
    assert coord.store.is_finished(0)
    assert (keys(tmp_path, 0, "a"), keys(tmp_path, 0, "b")) == ([f"0:{i}" for i in range(6)],) * 2
    # the same rows pass; the next epoch is written
    assert coord.run_epoch(0, [rows(0)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert coord.run_epoch(1, [rows(1)]).outcome is EpochOutcome.COMMITTED


def test_a_restarted_coordinator_checks_a_replay_of_the_last_run(tmp_path: Path) -> None:
    coordinator(tmp_path).run_epoch(0, [rows(0)])
    restarted = coordinator(tmp_path, check="fail")
    with pytest.raises(ReplayMismatchError):
        restarted.run_epoch(0, [rows(0, 6, "other")])


def test_the_summary_travels_in_a_last_resources_commit(tmp_path: Path) -> None:
    """A Kafka-like last resource carries the decision (with its summary) in its commit; a
    coordinator whose store lost its cache reads it from there and still checks."""
    journal = JournalSink(tmp_path / "journal")
    coordinator(tmp_path, journal).run_epoch(0, [rows(0)])
    carried = journal.read_decision(0)
    assert carried is not None
    assert DecisionRecord.from_json(carried).content == summarise([rows(0)])
    fresh = coordinator(tmp_path, JournalSink(tmp_path / "journal"), store="other-store")
    assert fresh.run_epoch(0, [rows(0, 3)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert fresh.totals.replay_mismatches == 1


def test_off_records_no_summary_and_reads_no_replay(tmp_path: Path) -> None:
    coord = coordinator(tmp_path, check="off")
    assert coord.run_epoch(0, [rows(0)]).decision.content is None

    def unreadable() -> Iterator[pa.RecordBatch]:
        raise AssertionError("the replay was read")
        yield rows(0)  # pragma: no cover

    assert coord.run_epoch(0, unreadable()).outcome is EpochOutcome.ALREADY_COMMITTED
    # a later coordinator that checks finds no summary: nothing to compare
    checking = coordinator(tmp_path, check="fail")
    assert checking.run_epoch(0, [rows(0, 1)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert checking.totals.replay_mismatches == 0


def test_a_replay_that_cannot_be_read_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    coord = coordinator(tmp_path, check="fail")
    coord.run_epoch(0, [rows(0)])

    def broken() -> Iterator[pa.RecordBatch]:
        yield rows(0, 2)
        raise RuntimeError("executor lost")

    caplog.set_level(logging.WARNING, logger="durable_sinks")
    assert coord.run_epoch(0, broken()).outcome is EpochOutcome.ALREADY_COMMITTED
    assert coord.totals.replay_mismatches == 0
    assert any(
        "could not be read" in r.message and "executor lost" in r.message for r in caplog.records
    )


@pytest.mark.parametrize(
    "committed", [ContentSummary(6, None), ContentSummary(6, "0123456789abcdef", "older-1")]
)
def test_without_a_comparable_digest_the_counts_are_compared(committed: ContentSummary) -> None:
    """A summary with no digest, or a digest of another algorithm, is compared by its row
    count alone."""
    check, totals, log = ReplayCheck("job", "warn"), JobTotals(), JobLogger("job", epoch=0)
    decided = DecisionRecord("job", 0, 1, (), content=committed)
    check.check(decided, [rows(0, 6, "other")], totals, log)
    assert totals.replay_mismatches == 0
    check.check(decided, [rows(0, 5)], totals, log)
    assert totals.replay_mismatches == 1


def test_an_unknown_replay_check_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="replay_check 'strict'") as raised:
        Coordinator("job", [files(tmp_path)], LocalDirectoryStore(tmp_path), replay_check="strict")
    assert "'warn'" in (raised.value.fix or "")


def test_the_job_option_reaches_the_coordinator(tmp_path: Path) -> None:
    from durable_sinks.spark import JobOptions
    from durable_sinks.spark._build import build_coordinator

    assert JobOptions("job").replay_check == "warn"
    options, rest = JobOptions.split(
        {"job_id": "job", "replay_check": "fail", "decision_store": str(tmp_path / "store")}
    )
    assert rest == {}
    assert build_coordinator([files(tmp_path)], options).replay.mode == "fail"
    with pytest.raises(ConfigError, match="replay_check 'warning'") as raised:
        JobOptions.split({"job_id": "job", "replay_check": "warning"})
    assert raised.value.job == "job"
    assert "'fail'" in (raised.value.fix or "")
