"""librdkafka's own logs and error callbacks, routed into `logging` with a rate limit.

Every client the sink makes (producer, admin, progress consumer, and the throw-away producers
that check settings) gets `ClientLog` as its `logger` and `ClientLog.error` as its `error_cb`,
so librdkafka prints nothing to stderr itself. An unreachable broker makes librdkafka report
the same failure several times a second (a connect failure per broker per retry, each as a log
line and as an error callback): `LogLimiter` logs the first occurrence of each kind at
WARNING, counts the repeats for `window_s` seconds and then logs one summary ("... repeated N
times within 10 s"). A kind quiet for a whole window is logged afresh at its next occurrence.

The lines are informational: what the sink's callers see is the typed error of the call that
failed (errors.py, writer.py); these lines tell an operator what librdkafka saw meanwhile.
Logs and callbacks reach Python only when the client is served (poll, flush, consume, or an
admin client's poll), which the sink does after its calls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError

from durable_sinks.core.joblog import JobLogger

from .refusals import Refusals

#: Seconds during which repeats of one kind are counted instead of logged.
WINDOW_S = 10.0


@dataclass
class _Window:
    started: float
    level: int
    last: str
    repeats: int = 0


class LogLimiter:
    """Logs the first occurrence of each kind, then at most one summary per kind and window
    (see the module docstring). Thread-safe: librdkafka's callbacks may run in any thread
    that serves a client."""

    def __init__(
        self,
        log: logging.LoggerAdapter[logging.Logger],
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}

    def emit(self, kind: str, level: int, message: str) -> None:
        """One occurrence of `kind` (e.g. `log:FAIL`, `error:_TRANSPORT`)."""
        now = self._clock()
        lines: list[tuple[int, str]] = []
        with self._lock:
            window = self._windows.get(kind)
            if window is not None and now - window.started < self.window_s:
                window.repeats += 1
                window.last = message
                return
            if window is not None and window.repeats:
                # Still repeating: the summary of the window that ended; this occurrence
                # opens the next window as its first repeat.
                lines.append((window.level, self._summary(window)))
                self._windows[kind] = _Window(now, level, message, repeats=1)
            else:
                lines.append((level, message))
                self._windows[kind] = _Window(now, level, message)
        for line_level, line in lines:
            self.log.log(line_level, "%s", line)

    def flush(self) -> None:
        """Log the summary of every window with repeats not yet summarised (at close)."""
        with self._lock:
            pending = [w for w in self._windows.values() if w.repeats]
            self._windows.clear()
        for window in pending:
            self.log.log(window.level, "%s", self._summary(window))

    def _summary(self, window: _Window) -> str:
        # Within the window, not "in N s": librdkafka's lines reach Python in bursts (when
        # the client is served), so the time between callbacks says little.
        return f"{window.last} (repeated {window.repeats} times within {self.window_s:g} s)"


class ClientLog:
    """The `logger` and `error_cb` of every librdkafka client of one sink: lines go to the
    `durable_sinks.sinks.kafka.client` logger with the job and sink, through a LogLimiter.
    librdkafka's errors and warnings are logged at WARNING (the sink raises what matters
    as a typed error), its notices and debug lines at DEBUG."""

    def __init__(self, job: str, sink: str, window_s: float = WINDOW_S) -> None:
        self.limiter = LogLimiter(
            JobLogger(job, sink, component="sinks.kafka.client"), window_s=window_s
        )
        #: Refused credentials or certificates the clients reported (refusals.py).
        self.refusals = Refusals()

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """librdkafka's log callback (it calls `logger.log(level, "%s [%s] %s", facility,
        client name, text)`)."""
        facility = str(args[0]) if args else "-"
        text = fmt % args if args else fmt
        shown = logging.WARNING if level >= logging.WARNING else logging.DEBUG
        self.limiter.emit(f"log:{facility}", shown, f"librdkafka: {text}")

    def error(self, error: KafkaError) -> None:
        """librdkafka's error callback: errors of the client as a whole (brokers down, a
        fatal error), not of one call."""
        self.refusals.seen(error)
        kind = "fatal " if error.fatal() else ""
        self.limiter.emit(
            f"error:{error.name()}",
            logging.WARNING,
            f"librdkafka {kind}error {error.name()}: {error.str()}",
        )

    def settings(self) -> dict[str, Any]:
        """The client settings that route its logs and errors here."""
        return {"logger": self, "error_cb": self.error}

    def flush(self) -> None:
        self.limiter.flush()
