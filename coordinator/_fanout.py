"""The write pass of an epoch: every record batch into every sink, the sinks concurrently.

One writer thread per sink takes that sink's `write_batch` calls, in the batches' order: a
sink is never called from two threads at once (its single-threaded contract), while different
sinks write at the same time, and all of them write while the caller reads the next record
batch (in driver mode: while Spark ships the rest of the micro-batch). The caller's thread
only reads and hands batches over; at most IN_FLIGHT batches per sink are handed over and not
yet written, so memory stays bounded by that many record batches.

Errors: the first failure (a sink's, or the batches' iterator's) stops the pass: no further
batch is handed over, the batches already being written finish (a sink is never rolled back
while it writes), those queued are dropped, and the failure is raised. The caller's rollback
runs only after every writer thread is idle.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from durable_sinks.core.protocol import SinkConnector, WriteResult

from ._watch import Watch

if TYPE_CHECKING:
    import pyarrow as pa

#: Record batches per sink handed over but not written yet, beyond the one being written.
IN_FLIGHT = 2


@dataclass(frozen=True)
class Written:
    """One sink's write of one record batch, done."""

    index: int
    sink: SinkConnector
    result: WriteResult
    seconds: float
    batch: pa.RecordBatch


def timed_write(
    sink: SinkConnector, batch: pa.RecordBatch, watch: Watch | None = None
) -> tuple[WriteResult, float]:
    """`sink.write_batch(batch)` and the seconds it took (told to `watch` while it runs)."""
    started = time.perf_counter()
    if watch is None:
        result = sink.write_batch(batch)
    else:
        with watch.calling(sink.name, "write_batch"):
            result = sink.write_batch(batch)
    return result, time.perf_counter() - started


class FanOut:
    """The writer threads of one epoch's write pass (a context manager: leaving it, also by
    an error or an abandoned generator, waits for the writes in progress and stops the
    threads)."""

    def __init__(
        self, sinks: list[SinkConnector], thread_name: str, watch: Watch | None = None
    ) -> None:
        self.sinks = sinks
        self._watch = watch
        self._pools = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{thread_name}:{s.name}")
            for s in sinks
        ]
        #: (index, sink number, future, batch) in the order handed over.
        self._pending: deque[tuple[int, int, Future[tuple[WriteResult, float]], pa.RecordBatch]] = (
            deque()
        )

    def __enter__(self) -> FanOut:
        return self

    def __exit__(self, *exc: object) -> None:
        for _, _, future, _ in self._pending:
            future.cancel()
        for pool in self._pools:
            pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, index: int, batch: pa.RecordBatch) -> Iterator[Written]:
        """Hand `batch` to every sink's writer; first yields the writes that must finish to
        keep IN_FLIGHT (oldest first; raises the first failure among them)."""
        while len(self._pending) >= len(self.sinks) * (IN_FLIGHT + 1):
            yield self._next_done()
        for n, (sink, pool) in enumerate(zip(self.sinks, self._pools, strict=True)):
            self._pending.append(
                (index, n, pool.submit(timed_write, sink, batch, self._watch), batch)
            )
        yield from self._already_done()

    def drain(self) -> Iterator[Written]:
        """Every remaining write, in the order handed over, as each finishes."""
        while self._pending:
            yield self._next_done()

    def _already_done(self) -> Iterator[Written]:
        while self._pending and self._pending[0][2].done():
            yield self._next_done()

    def _next_done(self) -> Written:
        index, n, future, batch = self._pending[0]
        if not future.done():
            # Wake on any failure, not only the oldest write's: a sink that failed must stop
            # the pass without waiting for the other sinks' queued batches.
            wait([f for _, _, f, _ in self._pending], return_when="FIRST_EXCEPTION")
            self._raise_failure()
        self._pending.popleft()
        result, seconds = future.result()
        return Written(index, self.sinks[n], result, seconds, batch)

    def _raise_failure(self) -> None:
        for _, _, future, _ in self._pending:
            if future.done() and not future.cancelled() and future.exception() is not None:
                future.result()


class InTurn:
    """FanOut's interface without threads (`concurrent_writes=False`): `submit` writes the
    batch into each sink in turn, in the calling thread."""

    def __init__(self, sinks: list[SinkConnector], watch: Watch | None = None) -> None:
        self.sinks = sinks
        self._watch = watch

    def __enter__(self) -> InTurn:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing runs in the background."""

    def submit(self, index: int, batch: pa.RecordBatch) -> Iterator[Written]:
        for sink in self.sinks:
            result, seconds = timed_write(sink, batch, self._watch)
            yield Written(index, sink, result, seconds, batch)

    def drain(self) -> Iterator[Written]:
        return iter(())
