"""The epoch in flight, seen while it runs: its phase, its age, and the sink calls it waits on.

`Watch` is what the coordinator tells as an epoch goes (`begin`, `enter` a phase, each sink
call through `calling`, `end`); `snapshot()` reads it from any thread (the metrics endpoint
does, at each scrape). While one phase runs longer than `slow_after_s`, a watchdog thread
logs a warning every `slow_after_s` naming the epoch, the phase, its age and each sink call
still running with its age: a batch that hangs says where, within `slow_after_s` plus a
second, without waiting for it to end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from durable_sinks.core.joblog import JobLogger

#: The default of `slow_phase_log_s`: a phase running this long is logged, and again each
#: time this much longer.
SLOW_PHASE_LOG_S = 15.0
#: How often the watchdog looks.
_TICK_S = 1.0


@dataclass(frozen=True)
class Call:
    """A sink call in progress: the sink, the call (`write_batch`, `pre_commit`, ...), its age."""

    sink: str
    call: str
    age_s: float

    def __str__(self) -> str:
        return f"{self.sink} {self.call} ({self.age_s:.0f} s)"


@dataclass(frozen=True)
class InFlight:
    """The epoch in flight: its number, its phase (one of coordinator/_metrics.py's PHASES;
    `write` from the first record batch read to the last one written, Spark's reading
    included), how long since the epoch and the phase began, and the sink calls running now
    (oldest first)."""

    epoch: int
    phase: str
    epoch_age_s: float
    phase_age_s: float
    calls: tuple[Call, ...]

    def describe(self) -> str:
        waiting = ", ".join(str(c) for c in self.calls) or "no sink call (reading the batch)"
        return (
            f"epoch {self.epoch} has been in {self.phase} for {self.phase_age_s:.0f} s "
            f"(the epoch for {self.epoch_age_s:.0f} s); waiting on: {waiting}"
        )


class Watch:
    """See the module docstring. Thread-safe: the coordinator's thread and its writer threads
    tell it, any thread reads it."""

    def __init__(self, log: JobLogger, slow_after_s: float = SLOW_PHASE_LOG_S) -> None:
        self._log = log
        self.slow_after_s = slow_after_s
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self._epoch_at = 0.0
        self._phase = ""
        self._phase_at = 0.0
        #: Calls in progress: id -> (sink, call, started).
        self._calls: dict[int, tuple[str, str, float]] = {}
        self._next_call = 0
        self._logged_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- told by the coordinator ---------------------------------------------------------------
    def begin(self, epoch: int, phase: str = "lookup") -> None:
        now = time.monotonic()
        with self._lock:
            self._epoch, self._epoch_at = epoch, now
            self._phase, self._phase_at = phase, now
            self._calls.clear()
            self._logged_at = now
        self._start_watchdog()

    def enter(self, phase: str) -> None:
        """The epoch is in `phase` now (entering the phase it is in changes nothing)."""
        with self._lock:
            if self._epoch is not None and phase != self._phase:
                self._phase, self._phase_at = phase, time.monotonic()
                self._logged_at = self._phase_at

    def end(self) -> None:
        with self._lock:
            self._epoch = None
            self._calls.clear()

    @contextmanager
    def calling(self, sink: str, call: str) -> Iterator[None]:
        """A sink call, in progress while the block runs."""
        with self._lock:
            key = self._next_call
            self._next_call += 1
            self._calls[key] = (sink, call, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                self._calls.pop(key, None)

    # -- read from any thread ------------------------------------------------------------------
    def snapshot(self) -> InFlight | None:
        """The epoch in flight now, or None between epochs."""
        now = time.monotonic()
        with self._lock:
            if self._epoch is None:
                return None
            calls = tuple(
                Call(sink, call, now - at)
                for sink, call, at in sorted(self._calls.values(), key=lambda c: c[2])
            )
            return InFlight(
                self._epoch, self._phase, now - self._epoch_at, now - self._phase_at, calls
            )

    # -- the watchdog --------------------------------------------------------------------------
    def _start_watchdog(self) -> None:
        if self._thread is not None or self.slow_after_s <= 0:
            return
        self._thread = threading.Thread(
            target=self._watch, name=f"ds-watch:{self._log.job}", daemon=True
        )
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(_TICK_S):
            now = time.monotonic()
            with self._lock:
                due = self._epoch is not None and now - self._logged_at >= self.slow_after_s
                if due:
                    self._logged_at = now
            seen = self.snapshot() if due else None
            if seen is not None:
                self._log.bind(epoch=seen.epoch).warning("slow: %s", seen.describe())

    def close(self) -> None:
        """Stop the watchdog (a later `begin` starts it again)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=2 * _TICK_S)
        self._stop = threading.Event()
