"""Thread pools shared by everything in one process that asks for them by the same name.

`run_concurrently` runs a list of calls at a bounded concurrency and raises the worst error
once every call it began has ended.

A pool is made on first use and lives as long as the process. A forked process (a Spark
Python worker is forked from its daemon) makes its own: threads do not survive a fork, so a
pool is kept per process id.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast

T = TypeVar("T")
#: The pool `run_concurrently` runs its workers in, and its size: the most calls (commits of
#: the participants of an epoch, say) running at once in the process, whatever each caller's
#: own bound.
COMMIT_POOL = "durable-sinks-commit"
COMMIT_THREADS = 32

_POOLS: dict[tuple[int, str], ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def process_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """This process's pool called `name` (also its threads' name prefix), of `threads`
    threads when it is made by this call."""
    key = (os.getpid(), name)
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(threads, name)
        return pool


def run_concurrently(
    calls: Sequence[Callable[[int], T]],
    *,
    workers: int,
    rank: Callable[[BaseException], int] = lambda exc: 0,
    keep_going: Callable[[BaseException], bool] = lambda exc: False,
) -> list[T]:
    """Each of `calls`, at most `workers` at a time (in `COMMIT_POOL` threads; in this thread
    when one worker is enough), each given its worker's slot (0 <= slot < workers: a worker
    runs one call at a time, so a call may use what belongs to its slot, a session say).
    Returns their results in order. Once a call raised (an error `keep_going` does not
    accept), no call not yet begun is begun; when
    every begun call has ended, the error of the lowest `rank` (the first of those, in the
    order of `calls`) is raised. Never call it from one of its own workers: a nested call
    could wait for threads the outer one holds."""
    slots = max(1, min(workers, len(calls)))
    results: list[T | None] = [None] * len(calls)
    errors: dict[int, BaseException] = {}
    stopped = threading.Event()
    next_index = iter(range(len(calls)))
    lock = threading.Lock()

    def work(slot: int) -> None:
        while True:
            with lock:
                index = None if stopped.is_set() else next(next_index, None)
            if index is None:
                return
            try:
                results[index] = calls[index](slot)
            except BaseException as exc:  # noqa: BLE001 - raised below, after the others end
                with lock:
                    errors[index] = exc
                if not keep_going(exc):
                    stopped.set()

    if slots == 1:
        work(0)
    else:
        pool = process_pool(COMMIT_POOL, COMMIT_THREADS)
        for future in [pool.submit(work, slot) for slot in range(slots)]:
            future.result()
    if errors:
        index = min(errors, key=lambda i: (rank(errors[i]), i))
        raise errors[index]
    return cast("list[T]", results)
