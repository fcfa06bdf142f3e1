"""How the coordinator retries sink calls that failed transiently (never anything else)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from durable_sinks.core.errors import DurableSinkError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How the coordinator retries one phase-2 commit or rollback call in place, on the same
    connections, when it fails with an error that says it is retriable (TransientError,
    InDoubtError); any other error is raised at once.

    It stops at `attempts` calls or `tolerance_s` seconds, whichever comes first, waiting
    `first_wait_s` after the first failure and twice as long after each next one, at most
    `max_wait_s`: with the defaults, 8 calls with waits of 0.05, 0.1, 0.2 ... 3.2 s, about
    6.4 s in all. This covers a blip a live connection recovers from; a longer outage (a
    server restarting, a connection gone) is ridden out by the writer's
    `outage_tolerance_s`, which attempts the whole batch again with new connections
    (coordinator/_outage.py)."""

    attempts: int = 8
    """Calls at most, the first included."""
    tolerance_s: float = 10.0
    """Seconds from the first call after which no further call is made."""
    first_wait_s: float = 0.05
    """Seconds waited after the first failure (doubled after each next one)."""
    max_wait_s: float = 5.0
    """The longest wait between two calls, in seconds."""

    def retrying(self) -> Retrying:
        return Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, DurableSinkError) and e.retriable),
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.tolerance_s),
            wait=wait_exponential(multiplier=self.first_wait_s, max=self.max_wait_s),
            reraise=True,
        )

    def call(self, call: Callable[[], T]) -> T:
        """`call()`, retried by this policy; the last error is raised when it gives up."""
        for attempt in self.retrying():
            with attempt:
                return call()
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover
