"""An S3 prefix and a files path as dead-letter sinks, through the coordinator: a target
refusing rows (tests/support/refusing_sink.py) sends them to the dead letter in the same
epoch and decision, so every row is in exactly one place, also when the driver crashes after
pre_commit (a new coordinator rolls the epoch back and the replay lands it) or after the
decision (the new coordinator commits both); over the cap nothing of the epoch is visible in
either."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core import SinkConnector
from durable_sinks.core.bad_rows import BadRowCap, BadRowPolicy, TooManyBadRowsError, WritePolicy
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import folder as files_reader
from durable_sinks.sinks.folder import STAGING, Files, FolderSink
from durable_sinks.sinks.s3 import S3Sink, committed_dataset
from tests.services import S3Endpoint
from tests.support.refusing_sink import RefusingFileSink
from tests.support.s3_objects import incomplete_uploads
from tests.support.s3_target import s3_sink_config

DEAD_LETTERS = "dead_letters"


class DeadLetterPlace:
    """A dead-letter sink of one kind and how to read what it committed."""

    def __init__(self, make: Callable[[], SinkConnector], read: Callable[[], pa.Table]) -> None:
        self.make = make
        self.read = read

    def rows(self) -> list[dict[str, object]]:
        return [json.loads(text) for text in self.read().column("row_json").to_pylist()]


@pytest.fixture(params=["s3", "files"])
def dead_letters(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[DeadLetterPlace, Callable[[], list[str]]]:
    """The dead-letter sink under test, and what it left unfinished (uploads, staging)."""
    if request.param == "files":
        root = tmp_path / "dead"
        place = DeadLetterPlace(
            lambda: FolderSink(Files(path=str(root), name=DEAD_LETTERS, fsync=False)),
            lambda: files_reader.committed_dataset(root).to_table(),
        )
        return place, lambda: staged(root)
    s3: S3Endpoint = request.getfixturevalue("s3")
    prefix = request.getfixturevalue("s3_prefix")
    path = f"s3://{s3.bucket}/{prefix.rstrip('/')}"
    config = s3_sink_config(s3, path, name=DEAD_LETTERS)
    place = DeadLetterPlace(
        lambda: S3Sink(config), lambda: committed_dataset(path, config.connection).to_table()
    )
    return place, lambda: [u.key for u in incomplete_uploads(s3.client(), s3.bucket, prefix)]


def files_sink(root: Path, name: str) -> RefusingFileSink:
    return RefusingFileSink(Files(path=str(root), name=name, fsync=False))


def staged(root: Path) -> list[str]:
    return sorted(p.name for p in (root / STAGING).iterdir()) if (root / STAGING).exists() else []


def batch(ids: range) -> pa.RecordBatch:
    """Rows `id`, `v` = id, except every third row has v = -id - 1 (refused by the target)."""
    values = [-i - 1 if i % 3 == 0 else i for i in ids]
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "v": pa.array(values, pa.int64())})


def test_refused_rows_land_once_in_the_dead_letter_across_crashes_and_over_the_cap(
    dead_letters: tuple[DeadLetterPlace, Callable[[], list[str]]], tmp_path: Path
) -> None:
    place, unfinished = dead_letters
    target_root = tmp_path / "events"
    generation = 0

    def coordinator() -> Coordinator:
        nonlocal generation
        generation += 1
        made = Coordinator(
            "job",
            [files_sink(target_root, "events")],
            LocalDirectoryStore(tmp_path / "store"),
            policy=WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER),
            dead_letter=place.make(),
            bad_row_cap=BadRowCap(0.4),
        )
        made.start()
        return made

    def crash(job: Coordinator, epoch: int, ids: range, after: str) -> None:
        """Run the epoch until step `after`, then abandon it (no rollback, no close)."""
        steps = job.epoch_steps(epoch, [batch(ids)])
        while next(steps) != after:
            pass

    def where_each_row_is() -> dict[int, list[str]]:
        found: dict[int, list[str]] = {}
        for row in files_reader.committed_dataset(target_root).to_table().to_pylist():
            found.setdefault(int(row["id"]), []).append("target")
        for row in place.rows():
            assert isinstance(row["id"], int)
            assert row["v"] == -row["id"] - 1  # the whole original row
            found.setdefault(row["id"], []).append("dead letter")
        return found

    def expected(ids: range) -> dict[int, list[str]]:
        return {i: ["dead letter" if i % 3 == 0 else "target"] for i in ids}

    job = coordinator()
    assert job.run_epoch(0, [batch(range(0, 10))]).outcome is EpochOutcome.COMMITTED
    assert where_each_row_is() == expected(range(10))
    reasons = place.read().select(["epoch", "sink", "reason", "column_name"]).to_pylist()
    assert reasons == [{"epoch": 0, "sink": "events", "reason": "check", "column_name": "v"}] * 4

    # Crash after both participants prepared, before the decision: the next coordinator
    # rolls both back; Spark's replay lands the epoch once.
    crash(job, 1, range(10, 20), f"after-pre-commit:{DEAD_LETTERS}")
    assert len(unfinished()) == 1  # the dead letter's prepared participant
    assert len(staged(target_root)) == 1  # the target's
    job = coordinator()
    assert unfinished() == []
    assert staged(target_root) == []
    assert where_each_row_is() == expected(range(10))
    assert job.run_epoch(1, [batch(range(10, 20))]).outcome is EpochOutcome.COMMITTED
    assert where_each_row_is() == expected(range(20))

    # Crash after the decision: the next coordinator commits both participants.
    crash(job, 2, range(20, 30), "after-decision")
    job = coordinator()
    assert where_each_row_is() == expected(range(30))
    assert job.run_epoch(2, [batch(range(20, 30))]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert unfinished() == []

    # Over the cap (every row refused): nothing of the epoch anywhere.
    all_bad = pa.record_batch({"id": pa.array([30, 31], pa.int64()), "v": [-1, -2]})
    with pytest.raises(TooManyBadRowsError, match="refused 2 of 2 rows"):
        job.run_epoch(3, [all_bad])
    assert where_each_row_is() == expected(range(30))
    assert unfinished() == []
    assert staged(target_root) == []
    job.close()
