"""The job's first start, at `durable_sink(...)`: a server that answered but is mid-fault is
attempted again like a batch (up to `outage_tolerance_s`); a server not reached at all, and
any error that is not retriable, fails the start at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_sinks.core.errors import (
    CommitIncompleteError,
    ConfigError,
    OutageError,
    TransientError,
    UnreachableError,
)
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.spark import DurableBatchWriter, durable_sink
from tests.support.faulty import Faulty


def files(tmp_path: Path) -> FolderSink:
    return FolderSink(Files(str(tmp_path / "out"), name="files"))


def start(tmp_path: Path, sink: Faulty, tolerance_s: float = 30.0) -> DurableBatchWriter:
    return durable_sink(
        [sink],
        job_id="orders",
        decision_store=str(tmp_path / "decisions"),
        outage_tolerance_s=tolerance_s,
    )


@pytest.mark.parametrize(
    "fault",
    [
        TransientError("FENCED_LEADER_EPOCH reading the progress topic"),
        TransientError("the Postgres session was lost listing prepared transactions"),
        CommitIncompleteError("the participant restarting while recovery committed it"),
    ],
)
def test_a_start_that_meets_a_server_mid_fault_is_attempted_again(
    tmp_path: Path, fault: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    sink = Faulty(files(tmp_path), open=[fault, fault])
    writer = start(tmp_path, sink)
    assert sink.calls["open"] == 3
    assert writer.recovery is not None
    assert "riding out a failure starting the job" in caplog.text
    assert "rode out the outage: succeeded after 2 failed attempts" in caplog.text
    writer.close()


@pytest.mark.parametrize(
    "fault",
    [
        UnreachableError("connection refused", fix="check the address"),
        ConfigError("password authentication failed", fix="check the credentials"),
    ],
)
def test_a_server_not_reached_or_a_refusal_fails_the_start_at_once(
    tmp_path: Path, fault: Exception
) -> None:
    sink = Faulty(files(tmp_path), open=[fault])
    with pytest.raises(type(fault)) as raised:
        start(tmp_path, sink)
    assert raised.value is fault
    assert sink.calls["open"] == 1


def test_a_start_failing_past_the_bound_raises_an_outage_error_with_the_last_cause(
    tmp_path: Path,
) -> None:
    sink = Faulty(files(tmp_path), open=[TransientError(f"down {n}") for n in range(100)])
    with pytest.raises(OutageError) as raised:
        start(tmp_path, sink, tolerance_s=0.6)
    assert isinstance(raised.value.__cause__, TransientError)
    assert 2 <= sink.calls["open"] < 100
    assert "starting the job" in str(raised.value)
