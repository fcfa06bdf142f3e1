"""Riding out an outage: an epoch that failed with a retriable error (a server restarting, a
connection cut, a leader not yet elected, a transaction the broker timed out) is attempted
again, with new connections, until the job's bound.

Why a whole new attempt rather than retrying the one call that failed: a dead connection does
not heal itself, a Kafka transaction the broker aborted cannot be resumed, and whether the
decision was made is known only by looking it up again. A new attempt (the caller closes the
coordinator and builds a new one: new connections, a new generation that fences the old
attempt, recovery of its leftovers) settles every case with code that already exists:

- the failure came before the decision: the attempt was rolled back (or its leftovers are
  rolled back by the new coordinator's recovery: presumed abort); the epoch is written again
  from the batch;
- the failure came at or after the decision (InDoubtError, CommitIncompleteError): the new
  coordinator finds the decision and finishes it (recovery, or the epoch's lookup), or finds
  none and writes the epoch again.

Only errors that say they are retriable (`DurableSinkError.retriable`) are ridden out; any
other error (bad data, bad settings, a newer driver that fenced this one) is raised at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from durable_sinks.core.errors import DurableSinkError, OutageError
from durable_sinks.core.joblog import JobLogger

T = TypeVar("T")

#: How often a ride-out that keeps failing says so again (the first failure always logs).
REPORT_EVERY_S = 10.0


@dataclass(frozen=True)
class OutagePolicy:
    """How long a job keeps attempting an epoch through an outage.

    - tolerance_s: attempts go on until this many seconds after the first failure; the
      attempt that fails past it raises OutageError (a TransientError) carrying the last
      error. 0 turns riding out off (the first error is raised as is).
    - first_wait_s, max_wait_s: the pause between attempts starts at first_wait_s and doubles
      up to max_wait_s, so a server that answers again is used within about max_wait_s plus
      one attempt.

    An attempt that is itself slow (a connection black-holed until its time-out) can end past
    the bound by up to that time-out.
    """

    tolerance_s: float = 120.0
    first_wait_s: float = 0.25
    max_wait_s: float = 2.0

    def ride(
        self,
        attempt: Callable[[], T],
        *,
        after_failure: Callable[[DurableSinkError], None],
        log: JobLogger,
        where: Callable[[], str] = lambda: "",
        rides: Callable[[DurableSinkError], bool] = lambda error: error.retriable,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> T:
        """`attempt()`, attempted again after each retriable failure until the bound.

        `after_failure(error)` runs after every failed attempt that will be retried (the
        caller drops the failed attempt's connections there). `where()` says what the attempt
        was doing when it failed (the last protocol step it completed), for the log and the
        final error. `rides(error)` says which errors are ridden out (default: those that say
        they are retriable; a caller that cannot write the data again narrows it)."""
        first_failure: float | None = None
        failures = 0
        wait = self.first_wait_s
        last_report = 0.0
        while True:
            try:
                result = attempt()
            except DurableSinkError as exc:
                if not rides(exc) or self.tolerance_s <= 0:
                    raise
                now = clock()
                first_failure = now if first_failure is None else first_failure
                failures += 1
                elapsed = now - first_failure
                step = where()
                if elapsed >= self.tolerance_s:
                    raise OutageError.past_bound(
                        exc,
                        elapsed=elapsed,
                        attempts=failures,
                        tolerance=self.tolerance_s,
                        step=step,
                    ) from exc
                after_failure(exc)
                if failures == 1 or now - last_report >= REPORT_EVERY_S:
                    last_report = now
                    log.warning(
                        "riding out a failure%s (%s: %s): attempt %d failed %.1f s into the "
                        "outage; trying again (for up to %.0f s in all)",
                        f" {step}" if step else "",
                        type(exc).__name__,
                        exc.message,
                        failures,
                        elapsed,
                        self.tolerance_s,
                    )
                pause = min(wait, max(0.0, self.tolerance_s - elapsed))
                wait = min(wait * 2, self.max_wait_s)
                sleep(pause)
                continue
            if failures:
                assert first_failure is not None
                log.warning(
                    "rode out the outage: succeeded after %d failed attempts in %.1f s",
                    failures,
                    clock() - first_failure,
                )
            return result
