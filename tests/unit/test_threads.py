"""Calls run at a bounded concurrency (`run_concurrently`): results in order, the bound kept,
nothing begun after an error, the most serious error raised once the begun calls ended."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from durable_sinks.core.errors import FencedError, ParticipantLostError, TransientError
from durable_sinks.core.sink_base import _commit_severity
from durable_sinks.core.threads import run_concurrently


def test_results_come_back_in_the_order_of_the_calls_whatever_order_they_end_in() -> None:
    def call(i: int) -> Callable[[int], int]:
        def run(slot: int) -> int:
            time.sleep(0.02 * (5 - i))
            return i * 10

        return run

    assert run_concurrently([call(i) for i in range(5)], workers=5) == [0, 10, 20, 30, 40]


def test_at_most_workers_calls_run_at_once_each_on_its_own_slot() -> None:
    lock = threading.Lock()
    running: dict[int, int] = {}
    most = 0

    def call(slot: int) -> int:
        nonlocal most
        with lock:
            assert slot not in running, "two calls on one slot at once"
            running[slot] = 1
            most = max(most, len(running))
        time.sleep(0.01)
        with lock:
            del running[slot]
        return slot

    slots = run_concurrently([call] * 20, workers=3)
    assert most == 3
    assert set(slots) == {0, 1, 2}


def test_one_worker_runs_the_calls_in_turn_in_this_thread() -> None:
    here = threading.get_ident()
    seen = run_concurrently([lambda slot: threading.get_ident()] * 3, workers=1)
    assert seen == [here] * 3


def test_nothing_is_begun_after_an_error_and_the_begun_calls_end_first() -> None:
    begun: list[int] = []
    ended: list[int] = []

    def call(i: int) -> Callable[[int], int]:
        def run(slot: int) -> int:
            begun.append(i)
            if i == 0:
                raise TransientError("first fails")
            time.sleep(0.05)
            ended.append(i)
            return i

        return run

    with pytest.raises(TransientError, match="first fails"):
        run_concurrently([call(i) for i in range(10)], workers=2)
    assert len(begun) <= 3  # the failing call, the one beside it, at most one more
    assert sorted(ended) == sorted(i for i in begun if i != 0)


@pytest.mark.parametrize(
    ("errors", "raised"),
    [
        ((TransientError("t"), FencedError("f"), ParticipantLostError("lost")), "lost"),
        ((TransientError("t"), FencedError("f"), None), "f"),
        ((TransientError("t1"), TransientError("t2"), None), "t1"),
    ],
)
def test_the_most_serious_of_several_commit_errors_is_raised(
    errors: tuple[Exception | None, ...], raised: str
) -> None:
    barrier = threading.Barrier(3)

    def call(error: Exception | None) -> Callable[[int], int]:
        def run(slot: int) -> int:
            barrier.wait(timeout=5)  # all three begun before any fails
            if error is not None:
                raise error
            return 0

        return run

    with pytest.raises(Exception, match=f"^{raised}") as caught:
        run_concurrently([call(e) for e in errors], workers=3, rank=_commit_severity)
    assert str(caught.value).startswith(raised)


def test_calls_go_on_after_an_error_keep_going_accepts() -> None:
    done: list[int] = []

    def call(i: int) -> Callable[[int], int]:
        def run(slot: int) -> int:
            if i == 0:
                raise ParticipantLostError("lost")
            done.append(i)
            return i

        return run

    with pytest.raises(ParticipantLostError):
        run_concurrently(
            [call(i) for i in range(6)],
            workers=2,
            keep_going=lambda exc: isinstance(exc, ParticipantLostError),
        )
    assert sorted(done) == [1, 2, 3, 4, 5]
