"""Progress of a long conformance run (the extended crash run's 2,000 examples per scenario):
a line every few examples with the count, the time so far and an estimate of the time left.

Off unless `DS_CONFORMANCE_PROGRESS` names where the lines go: `-` for stderr, anything else a
file the lines are appended to (each with one write, so parallel test processes may share it;
pytest captures stderr, and pytest-xdist's workers have no terminal, so `make test-crash`
gives a file and follows it with `tail -F`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

PROGRESS_ENV = "DS_CONFORMANCE_PROGRESS"


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def progress_line(label: str, done: int, total: int, elapsed: float, discarded: int = 0) -> str:
    """`label: 400/2000 examples (20%; 250 more discarded), 6.0 min so far, ~24.0 min left`:
    `discarded` are those hypothesis does not count (a draw overran or was rejected)."""
    line = f"{label}: {done}/{total} examples"
    if total > 0:
        line += f" ({100 * done // total}%"
        line += f"; {discarded} more discarded)" if discarded else ")"
    line += f", {minutes(elapsed)} so far"
    if 0 < done < total:
        line += f", ~{minutes(elapsed / done * (total - done))} left"
    return line


class ExampleProgress:
    """Counts finished examples (those hypothesis counts towards `max_examples` apart from
    those it discards); writes a progress line every `every` counted examples, and at least
    once every `interval` seconds while examples finish."""

    def __init__(
        self,
        label: str,
        total: int,
        write: Callable[[str], None],
        *,
        every: int | None = None,
        interval: float = 60.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.total, self._write, self._now = label, total, write, now
        self.every = every or max(1, total // 20)
        self.interval = interval
        self.done = self.discarded = 0
        self.started = self._last = now()

    def example_done(self, *, counted: bool = True) -> None:
        at = self._now()
        if not counted:
            self.discarded += 1
        else:
            self.done += 1
        if (counted and self.done % self.every == 0) or at - self._last >= self.interval:
            self._last = at
            elapsed = at - self.started
            self._write(progress_line(self.label, self.done, self.total, elapsed, self.discarded))

    def finished(self, outcome: str) -> None:
        elapsed = self._now() - self.started
        self._write(
            f"{self.label}: {outcome} after {self.done} examples "
            f"({self.discarded} more discarded), {minutes(elapsed)}"
        )

    @classmethod
    def from_environment(cls, total: int, fallback_label: str) -> ExampleProgress | None:
        """The run's progress if `DS_CONFORMANCE_PROGRESS` is set, else None. Labelled by the
        test pytest is running (and its xdist worker), if any."""
        where = os.environ.get(PROGRESS_ENV)
        if not where:
            return None
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        label = test.rsplit("/", 1)[-1] or fallback_label
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        if worker:
            label = f"[{worker}] {label}"

        def write(line: str) -> None:
            stamped = f"{time.strftime('%H:%M:%S')} {line}\n"
            if where == "-":
                sys.stderr.write(stamped)
                sys.stderr.flush()
                return
            with open(where, "a", encoding="utf-8") as out:
                out.write(stamped)

        return cls(label, total, write)
