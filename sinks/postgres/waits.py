"""What an executor's part waits on (executor mode only).

Every part of an epoch keeps its rows in its own prepared transaction until the driver's
decision, which waits for every part. A part whose row meets a key that another slice of the
same epoch holds (the same upsert key, or the same value of a unique index in append mode, in
two Spark partitions of one batch) would wait on a lock that only that decision releases: it
cannot finish. `SiblingWatch` looks for that wait while one of the part's statements runs,
from a second connection: once the statement has run for PROBE_AFTER_S, every PROBE_EVERY_S it
reads which prepared transaction the statement waits on (`pg_locks` joined with
`pg_prepared_xacts`). A sibling's (ParticipantName.sibling_of) ends the statement
(`pg_cancel_backend`) and is kept in `sibling` for the error. A wait on anything else (a dead
attempt of the same slice, another job, a user's session) is left to the session's
lock_timeout, as is every wait when the probe cannot read the server (it logs why).

The probe's cancel can only end the watched statement: `__exit__` stops and joins the probe
before the session runs anything else, and Postgres ignores a cancel that reaches an idle
session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import psycopg

from durable_sinks.core.errors import DurableSinkError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.naming import ParticipantName

from .errors import first_line

#: How long a statement runs before the probe starts looking at what it waits on.
PROBE_AFTER_S = 1.0
#: How often the probe looks again while the statement runs.
PROBE_EVERY_S = 0.5

#: The prepared transactions the session `pid` waits on (a row lock or a unique index entry
#: is a wait on the holder's transaction id).
HOLDERS = (
    "SELECT x.gid FROM pg_locks l JOIN pg_prepared_xacts x ON x.transaction = l.transactionid "
    "WHERE l.pid = %s AND l.locktype = 'transactionid' AND NOT l.granted"
)


class SiblingWatch:
    """Watches the session `backend` (its server pid) for the time of a `with` block, on a
    connection of its own from `connect`; see the module's docstring."""

    def __init__(
        self,
        own: ParticipantName,
        backend: int,
        connect: Callable[[], psycopg.Connection[Any]],
        log: JobLogger,
    ) -> None:
        self.own = own
        self.backend = backend
        self.connect = connect
        self.log = log
        #: The sibling part whose prepared transaction held the watched statement, which the
        #: probe then ended; None when it ended nothing.
        self.sibling: ParticipantName | None = None
        self._stop = threading.Event()
        self._probe = threading.Thread(
            target=self._run, name=f"durable-sinks-waits-{own.part}", daemon=True
        )

    def __enter__(self) -> SiblingWatch:
        self._probe.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._probe.join()

    def _run(self) -> None:
        if self._stop.wait(PROBE_AFTER_S):
            return
        try:
            with self.connect() as probe:
                while not self._stop.is_set():
                    for (gid,) in probe.execute(HOLDERS, (self.backend,)).fetchall():
                        holder = ParticipantName.parse(gid)
                        if holder is not None and self.own.sibling_of(holder):
                            self.sibling = holder
                            probe.execute("SELECT pg_cancel_backend(%s)", (self.backend,))
                            return
                    self._stop.wait(PROBE_EVERY_S)
        except (psycopg.Error, DurableSinkError) as exc:
            reason = exc.message if isinstance(exc, DurableSinkError) else first_line(exc)
            self.log.warning(
                "part %s: cannot see what its statement waits on (%s); a wait on another part "
                "of the epoch then ends at the lock time-out",
                self.own.part,
                reason,
            )
