"""The base every built-in sink stands on: the lifecycle before and after `open`, fresh
participant names per attempt, and the one idiom that turns client failures into typed
errors."""

from __future__ import annotations

import errno
from dataclasses import dataclass

import pytest

from durable_sinks.core.errors import (
    DurableSinkError,
    InDoubtError,
    SchemaMismatchError,
    TransientError,
    UsageError,
)
from durable_sinks.core.protocol import CommitHandle, CommitOutcome, OpenContext
from durable_sinks.core.sink_base import SinkBase, Step, guarded


@dataclass(frozen=True)
class Config:
    name: str = "t"


class ClientFailureError(Exception):
    pass


class Sink(SinkBase[Config]):
    def __init__(self) -> None:
        super().__init__(Config(), counters=("files",))

    def _target(self) -> str:
        return "path='/x'"

    def _read_last_committed(self) -> int | None:
        return 7

    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        if not isinstance(exc, ClientFailureError):
            return None
        kind = InDoubtError if step.in_doubt else TransientError
        return kind(f"could not {step.action}: {exc}", **self.where(step.epoch), fix="retry")

    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        return CommitOutcome.COMMITTED

    @guarded("commit the epoch", in_doubt="the decision")
    def commit(self, epoch: int, failure: Exception | None) -> str:
        if failure is not None:
            raise failure
        return "done"


def test_a_sink_used_before_open_is_a_usage_error_naming_it() -> None:
    sink = Sink()
    with pytest.raises(UsageError, match=r"Sink\(name='t', path='/x'\) is not open"):
        _ = sink.context
    assert sink.where(3) == {"job": None, "sink": "t", "epoch": 3}


def test_every_attempt_at_an_epoch_gets_a_participant_of_its_own() -> None:
    sink = Sink()
    sink._opening(OpenContext("job", "t", generation=5))
    first, second, other = (sink._next_participant(e) for e in (7, 7, 8))
    assert (first.attempt, second.attempt, other.attempt) == (0, 1, 0)
    assert first.generation == 5
    assert first.epoch == 7
    assert first != second
    assert sink.where() == {"job": "job", "sink": "t", "epoch": None}


def test_counters_are_the_common_ones_and_the_sinks_own() -> None:
    sink = Sink()
    sink._count("rows", 3)
    sink._count("files")
    assert sink.metrics() == {
        "rows": 3.0,
        "bytes": 0.0,
        "epochs_committed": 0.0,
        "rollbacks": 0.0,
        "refused_rows": 0.0,
        "files": 1.0,
    }


def test_client_failures_leave_typed_with_the_step_and_their_cause() -> None:
    sink = Sink()
    sink._opening(OpenContext("job", "t", generation=1))
    failing = sink.translated("write a file", 4)
    with pytest.raises(TransientError, match="could not write a file: disk") as raised, failing:
        raise ClientFailureError("disk")
    assert raised.value.epoch == 4
    assert isinstance(raised.value.__cause__, ClientFailureError)
    with pytest.raises(InDoubtError, match="could not commit the epoch"):
        sink.commit(9, ClientFailureError("lost"))
    assert sink.commit(9, None) == "done"


def test_own_errors_and_foreign_exceptions_pass_unchanged() -> None:
    sink = Sink()
    own = SchemaMismatchError("bad column")
    with pytest.raises(SchemaMismatchError) as raised:
        sink.commit(1, own)
    assert raised.value is own
    with pytest.raises(KeyError), sink.translated(Step("read", 1)):
        raise KeyError("bug")


def test_an_os_error_no_translation_names_is_typed_never_raw() -> None:
    """An OSError the sink's own translation leaves (a local disk's EIO) is TransientError,
    or InDoubtError for a call whose outcome it leaves unknown: never a raw OSError."""
    sink = Sink()
    sink._opening(OpenContext("job", "t", generation=1))
    failure = OSError(errno.EIO, "Input/output error", "/data/x")
    with pytest.raises(InDoubtError, match=r"commit the epoch: EIO .* at /data/x") as hit:
        sink.commit(3, failure)
    assert hit.value.fix == "the decision"
    with pytest.raises(TransientError, match="EIO") as plain, sink.translated("write a file", 3):
        raise failure
    assert type(plain.value) is TransientError
    assert plain.value.epoch == 3


def test_a_sink_reads_its_committed_epoch_again_on_request() -> None:
    sink = Sink()
    sink._opening(OpenContext("job", "t", generation=1))
    assert sink.last_committed_epoch() is None
    assert sink.reread_last_committed_epoch() == 7
    assert sink.last_committed_epoch() == 7
