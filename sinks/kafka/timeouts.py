"""The Kafka sink's transaction timeout (the producer's `transaction.timeout.ms`): given as
`transaction_timeout_s`, or derived from how long the job's epochs keep their transaction
open. Pure logic, no client: the sink feeds it what it measures and the broker's limit.

The broker aborts a transaction open longer than its producer's timeout, so the timeout must
cover the longest time from an epoch's first record to its commit request (its *open time*).
A longer timeout costs nothing while the job runs; it costs when a driver dies with a
transaction open: `read_committed` readers of the partitions it wrote wait at its first
record until the broker times it out, or until the job restarts, whose `init_transactions`
aborts it at once. So the derived timeout stays near what the epochs need:

- the *ceiling* is the broker's `transaction.max.timeout.ms` (Kafka's default 900 s), or the
  lower `max_transaction_timeout_s`;
- the timeout is HEADROOM times the longest open time of the last WINDOW committed epochs,
  rounded up to a *rung* of a ladder that doubles from the floor (60 s, Kafka's own
  default, or an eighth of a lower ceiling) up to the ceiling;
- a job with nothing measured (its first epoch ever) starts at the ceiling: its first batch,
  often its largest (a backlog), commits if anything can; the first measured epoch brings it
  down at once. A job that restarts starts from the longest open time its latest progress
  record carries;
- changing the timeout takes a new producer (`init_transactions`) between two epochs, so it
  grows as soon as an epoch needs a higher rung but shrinks only after WINDOW epochs at the
  current rung all fit a lower one;
- when the broker aborts a transaction for its age, the next attempt takes the ceiling (one
  wasted attempt at most: a batch that has outgrown the timeout is not known to end before
  any lower rung); when the ceiling itself was too short, no attempt can commit the batch,
  and the sink says so instead of trying again (`timed_out` returns None).

One TransactionTimeout per transactional id and process (`shared`): a ride-out's new sink
(docs/guide.md, "Outages") continues from what the failed attempt learnt, the aborted
transaction included.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field

#: Kafka's default transaction.timeout.ms (seconds): the lowest rung with a ceiling of 8
#: minutes or more.
FLOOR_S = 60.0
#: librdkafka's range of transaction.timeout.ms (seconds).
CLIENT_MIN_S = 1.0
CLIENT_MAX_S = 2_147_483.0
#: Kafka's default transaction.max.timeout.ms (seconds).
KAFKA_MAX_S = 900.0
#: The timeout is at least this many times the longest recent open time.
HEADROOM = 4.0
#: How many committed epochs make up "recent"; also how many epochs a rung is kept before
#: it may shrink.
WINDOW = 20


def floor_of(ceiling_s: float) -> float:
    """The lowest rung: FLOOR_S, or an eighth of a ceiling under 8 minutes (so that there is
    room to grow), never below librdkafka's 1 s."""
    return max(min(FLOOR_S, ceiling_s / 8), CLIENT_MIN_S)


def rung(needed_s: float, ceiling_s: float) -> float:
    """The smallest rung at or above `needed_s`: the floor doubled as often as needed, at
    most the ceiling."""
    floor = floor_of(ceiling_s)
    if needed_s <= floor:
        return floor
    doublings = math.ceil(math.log2(needed_s / floor) - 1e-9)
    return min(floor * 2.0**doublings, ceiling_s)


def derived(longest_open_s: float, ceiling_s: float) -> float:
    """The timeout for epochs whose transactions stay open `longest_open_s` at most."""
    return rung(HEADROOM * max(longest_open_s, 0.0), ceiling_s)


@dataclass
class TransactionTimeout:
    """The transaction timeout of one sink's producer (see the module docs). `explicit_s`:
    the user's `transaction_timeout_s`, used as is; `ceiling_s`: the longest possible, set
    at every open (`bounded`)."""

    ceiling_s: float = KAFKA_MAX_S
    explicit_s: float | None = None
    #: Open times of the last WINDOW committed epochs (seconds), oldest first.
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    #: The timeout the next producer starts with; None before `bounded`.
    current_s: float | None = None
    #: Whether `current_s` rests on a measurement (False: nothing measured yet, the ceiling).
    measured: bool = False
    #: Committed epochs since `current_s` last changed.
    epochs_at_current: int = 0

    def bounded(self, ceiling_s: float, stored_open_s: float | None) -> float:
        """Set the ceiling read at open and return the timeout to start the producer with.
        `stored_open_s`: the longest recent open time the latest progress record carries
        (None for a job that never committed), used when this process has measured
        nothing."""
        self.ceiling_s = ceiling_s
        if self.explicit_s is not None:
            self.current_s = self.explicit_s
            return self.current_s
        if not self.recent and stored_open_s is not None:
            self.recent.append(stored_open_s)
        if self.current_s is None:
            self.measured = bool(self.recent)
            self.current_s = self._target() if self.recent else ceiling_s
        self.current_s = min(self.current_s, ceiling_s)
        return self.current_s

    def _target(self) -> float:
        return derived(max(self.recent, default=0.0), self.ceiling_s)

    @property
    def longest_recent_s(self) -> float | None:
        """The longest open time of the recent committed epochs, if any."""
        return max(self.recent, default=None)

    def committed(self, open_s: float) -> float | None:
        """Record a committed epoch's open time; the new timeout when the producer should
        change before the next epoch, else None."""
        self.recent.append(open_s)
        self.epochs_at_current += 1
        if self.explicit_s is not None or self.current_s is None:
            return None
        target = self._target()
        grow = target > self.current_s
        first = not self.measured and target != self.current_s
        shrink = target < self.current_s and self.epochs_at_current >= WINDOW
        self.measured = True
        if grow or first or shrink:
            return self._set(target)
        return None

    def timed_out(self, open_s: float) -> float | None:
        """The broker aborted a transaction open `open_s` seconds for its age: the timeout of
        the next attempt (the ceiling), or None when the timeout was already the ceiling or
        is the user's (no longer timeout would help, or none may be chosen)."""
        if self.explicit_s is not None or self.current_s is None:
            return None
        if self.current_s >= self.ceiling_s:
            return None
        self.measured = True
        self.recent.append(max(open_s, self.current_s))
        return self._set(self.ceiling_s)

    def _set(self, timeout_s: float) -> float:
        self.current_s = timeout_s
        self.epochs_at_current = 0
        return timeout_s


_SHARED: dict[tuple[str, str], TransactionTimeout] = {}
_SHARED_LOCK = threading.Lock()


def shared(
    bootstrap_servers: str, transactional_id: str, explicit_s: float | None
) -> TransactionTimeout:
    """This process's TransactionTimeout of a transactional id on a cluster (a new one when
    the explicit setting changed)."""
    key = (bootstrap_servers, transactional_id)
    with _SHARED_LOCK:
        found = _SHARED.get(key)
        if found is None or found.explicit_s != explicit_s:
            found = _SHARED[key] = TransactionTimeout(explicit_s=explicit_s)
        return found
