"""A job's sinks changed between runs (coordinator/_participants.py `commit_decided`,
coordinator/_decisions.py): a replayed epoch decided with a sink the job no longer has is
already committed when the epoch finished, and refused, naming the sink, when it did not."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, RetryPolicy
from durable_sinks.core import SinkConnector
from durable_sinks.core.errors import CommitIncompleteError, TransientError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from tests.support.faulty import Faulty

ONCE = RetryPolicy(attempts=1)
ROWS = pa.record_batch({"id": [1, 2, 3]})


def job(tmp_path: Path, *sinks: SinkConnector) -> Coordinator:
    made = Coordinator(
        "orders",
        list(sinks),
        LocalDirectoryStore(tmp_path / "store"),
        source="q",
        commit_retry=ONCE,
    )
    made.start(recover=False)
    return made


def files(tmp_path: Path, name: str) -> FolderSink:
    return FolderSink(Files(str(tmp_path / name), name=name))


def test_a_removed_sinks_unfinished_epoch_is_refused_and_a_finished_one_passes(
    tmp_path: Path,
) -> None:
    # Epoch 0 decided with a and b, b's commit failing: the epoch is not finished.
    failing = Faulty(files(tmp_path, "b"), commit_epoch=[TransientError("b is down")])
    first = job(tmp_path, files(tmp_path, "a"), failing)
    with pytest.raises(CommitIncompleteError):
        first.run_epoch(0, [ROWS])
    first.close()

    alone = job(tmp_path, files(tmp_path, "a"))
    with pytest.raises(
        CommitIncompleteError, match="names sink 'b', which this job no longer"
    ) as raised:
        alone.run_epoch(0, [ROWS])
    assert raised.value.fix is not None
    assert "run the job once more with sink 'b'" in raised.value.fix
    alone.close()

    both = job(tmp_path, files(tmp_path, "a"), files(tmp_path, "b"))
    assert both.run_epoch(0, [ROWS]).outcome is EpochOutcome.ALREADY_COMMITTED  # finished now
    both.close()

    again = job(tmp_path, files(tmp_path, "a"))
    assert again.run_epoch(0, [ROWS]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert again.run_epoch(1, [ROWS]).outcome is EpochOutcome.COMMITTED
    again.close()
