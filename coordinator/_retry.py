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
from durable_sinks.core.settings import current_names

T = TypeVar("T")


@dataclass(frozen=True, init=False)
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
    (coordinator/_outage.py). The older names `max_seconds`, `first_wait` and `max_wait`
    are accepted with a DeprecatedOptionWarning."""

    attempts: int
    tolerance_s: float
    first_wait_s: float
    max_wait_s: float

    def __init__(
        self,
        attempts: int = 8,
        tolerance_s: float | None = None,
        first_wait_s: float | None = None,
        max_wait_s: float | None = None,
        *,
        max_seconds: float | None = None,
        first_wait: float | None = None,
        max_wait: float | None = None,
    ) -> None:
        """`tolerance_s` (default 10.0), `first_wait_s` (0.05) and `max_wait_s` (5.0) are
        seconds; `max_seconds`, `first_wait` and `max_wait` are their older names."""
        given = {
            "tolerance_s": tolerance_s,
            "first_wait_s": first_wait_s,
            "max_wait_s": max_wait_s,
            "max_seconds": max_seconds,
            "first_wait": first_wait,
            "max_wait": max_wait,
        }
        chosen = current_names(
            "retry_policy", {k: v for k, v in given.items() if v is not None}, "RetryPolicy"
        )
        object.__setattr__(self, "attempts", attempts)
        object.__setattr__(self, "tolerance_s", chosen.get("tolerance_s", 10.0))
        object.__setattr__(self, "first_wait_s", chosen.get("first_wait_s", 0.05))
        object.__setattr__(self, "max_wait_s", chosen.get("max_wait_s", 5.0))

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
