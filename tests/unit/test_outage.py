"""Riding out an outage (coordinator/_outage.py): which failures are attempted again, for
how long, with which pauses, what is logged, and the error past the bound."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pytest

from durable_sinks.coordinator import OutagePolicy
from durable_sinks.core.errors import (
    CommitIncompleteError,
    ConfigError,
    DurableSinkError,
    FencedError,
    InDoubtError,
    OutageError,
    TransientError,
    UnreachableError,
)
from durable_sinks.core.joblog import JobLogger

LOG = JobLogger("job-o", component="test")


class FakeTime:
    """A clock that advances only when the policy sleeps (and by `per_attempt` per attempt)."""

    def __init__(self, per_attempt: float = 0.0) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self.per_attempt = per_attempt

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(
    errors: Sequence[BaseException], time: FakeTime, result: str = "done"
) -> Callable[[], str]:
    """An attempt that raises each of `errors` in turn, then returns `result`."""
    pending = list(errors)

    def attempt() -> str:
        time.now += time.per_attempt
        if pending:
            raise pending.pop(0)
        return result

    return attempt


def ride(
    policy: OutagePolicy, attempt: Callable[[], str], time: FakeTime, failed: list[object]
) -> str:
    return policy.ride(
        attempt,
        after_failure=failed.append,
        log=LOG,
        where=lambda: "after step 'after-pre-commit:pg'",
        clock=time.clock,
        sleep=time.sleep,
    )


def transient(message: str = "server closed the connection") -> TransientError:
    return TransientError(message, job="job-o", sink="pg", epoch=7, fix="wait")


@pytest.mark.parametrize(
    "error",
    [
        transient(),
        UnreachableError("connection refused", sink="pg"),
        InDoubtError("commit outcome unknown"),
        CommitIncompleteError("decided, not yet committed"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_retriable_failures_are_attempted_again_until_one_succeeds(error: DurableSinkError) -> None:
    time, failed = FakeTime(), list[object]()
    result = ride(OutagePolicy(), failing([error, error], time), time, failed)
    assert result == "done"
    assert failed == [error, error]  # each failed attempt was dropped before the next
    assert time.sleeps == [0.25, 0.5]


def test_a_success_at_once_neither_waits_nor_logs(caplog: pytest.LogCaptureFixture) -> None:
    time, failed = FakeTime(), list[object]()
    with caplog.at_level(logging.DEBUG, logger="durable_sinks"):
        assert ride(OutagePolicy(), failing([], time), time, failed) == "done"
    assert (failed, time.sleeps, caplog.records) == ([], [], [])


@pytest.mark.parametrize(
    "error",
    [
        FencedError("a newer driver"),
        ConfigError("bad table"),
        ValueError("a bug"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_other_failures_are_raised_at_once(error: Exception) -> None:
    time, failed = FakeTime(), list[object]()
    with pytest.raises(type(error)) as raised:
        ride(OutagePolicy(), failing([error], time), time, failed)
    assert raised.value is error
    assert (failed, time.sleeps) == ([], [])


def test_pauses_double_up_to_the_cap_and_end_at_the_bound() -> None:
    time, failed = FakeTime(), list[object]()
    policy = OutagePolicy(tolerance_s=10.0, first_wait_s=0.5, max_wait_s=2.0)
    with pytest.raises(OutageError):
        ride(policy, failing([transient()] * 100, time), time, failed)
    assert time.sleeps[:4] == [0.5, 1.0, 2.0, 2.0]
    assert max(time.sleeps) == 2.0
    assert sum(time.sleeps) == pytest.approx(10.0)  # the last pause is cut to the bound
    assert len(failed) == len(time.sleeps)


def test_past_the_bound_an_outage_error_carries_the_last_error() -> None:
    time, failed = FakeTime(per_attempt=1.0), list[object]()
    last = UnreachableError(
        "Postgres at 127.0.0.1:5432/db refused the connection",
        job="job-o",
        sink="pg",
        epoch=7,
        fix="start the server",
    )
    with pytest.raises(OutageError) as raised:
        ride(
            OutagePolicy(tolerance_s=30.0),
            failing([transient()] * 5 + [last] * 100, time),
            time,
            failed,
        )
    error = raised.value
    assert isinstance(error, TransientError)
    assert error.retriable
    assert error.__cause__ is last
    assert (error.job, error.sink, error.epoch) == ("job-o", "pg", 7)
    text = str(error)
    for part in (
        "outage_tolerance_s=30",
        "after step 'after-pre-commit:pg'",
        "UnreachableError: Postgres at 127.0.0.1:5432/db refused the connection",
        "Last error's fix: start the server",
        "restart the query from its checkpoint",
    ):
        assert part in text
    assert time.now - 100.0 >= 30.0


def test_tolerance_zero_raises_the_first_error_as_it_is() -> None:
    time, failed = FakeTime(), list[object]()
    error = transient()
    with pytest.raises(TransientError) as raised:
        ride(OutagePolicy(tolerance_s=0), failing([error], time), time, failed)
    assert raised.value is error
    assert not isinstance(raised.value, OutageError)


def test_a_long_outage_is_logged_at_its_start_every_ten_seconds_and_at_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time, failed = FakeTime(), list[object]()
    policy = OutagePolicy(tolerance_s=120.0, first_wait_s=1.0, max_wait_s=1.0)
    with caplog.at_level(logging.WARNING, logger="durable_sinks"):
        ride(policy, failing([transient()] * 30, time), time, failed)
    lines = [r.getMessage() for r in caplog.records]
    # 30 failures, one a second: reported at 0, 10 and 20 s, then the success at 30 s
    assert len(lines) == 4, lines
    assert "attempt 1 failed 0.0 s into the outage" in lines[0]
    assert "attempt 11 failed 10.0 s" in lines[1]
    assert "attempt 21 failed 20.0 s" in lines[2]
    assert "after step 'after-pre-commit:pg'" in lines[0]
    assert "TransientError: server closed the connection" in lines[0]
    assert "rode out the outage: succeeded after 30 failed attempts in 30.0 s" in lines[3]
    assert all("job=job-o" in line for line in lines)


def test_the_recovery_report_counts_what_was_found_and_done() -> None:
    from durable_sinks.coordinator import RecoveryReport
    from durable_sinks.core import CommitHandle

    def handle(n: int) -> CommitHandle:
        return CommitHandle("pg", n, f"ds:j:pg:{n}:p0:g1", 1, 1, "")

    report = RecoveryReport(7, committed=[handle(1)], rolled_back=[handle(2), handle(3)])
    assert str(report) == (
        "generation 7: 3 leftover participants found; committed 1, rolled back 2"
    )
    report.adopted.append(handle(4))
    assert str(report).endswith("committed 1, rolled back 2, adopted 1")
    assert (
        str(RecoveryReport(7))
        == "generation 7: 0 leftover participants found; committed 0, rolled back 0"
    )
    skipped = str(RecoveryReport(7, ran=False))
    assert "recovery not run here" in skipped
    assert "found" not in skipped
