"""The soak's progress line, printed every `--progress` seconds while faults are injected:
minutes done and left, rows fed and landed in Postgres, faults injected, driver starts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    """The soak's counts at one moment."""

    elapsed: float  # seconds since the faults began
    total: float  # seconds the faults go on for
    fed: int  # rows written to the source
    landed: int | str  # rows committed in Postgres (a note if it could not be read)
    faults: int  # faults injected
    missed: int  # times a fault found nothing to act on
    starts: int  # driver processes started (the first one included)


def progress_line(now: Snapshot) -> str:
    """`progress: 12.0 of 30 min, 18.0 left; 7,200 rows fed, 6,950 in Postgres; 35 faults
    injected (3 found nothing to act on); 13 driver starts (12 restarts)`."""
    done, total = now.elapsed / 60, now.total / 60
    landed = f"{now.landed:,}" if isinstance(now.landed, int) else now.landed
    missed = f" ({now.missed} found nothing to act on)" if now.missed else ""
    restarts = max(0, now.starts - 1)
    return (
        f"progress: {done:.1f} of {total:g} min, {max(0.0, total - done):.1f} left; "
        f"{now.fed:,} rows fed, {landed} in Postgres; {now.faults} faults injected{missed}; "
        f"{now.starts} driver starts ({restarts} restarts)"
    )


class Reporter(threading.Thread):
    """Calls `report(snapshot())` every `every` seconds until `stop` is set."""

    def __init__(
        self, every: float, snapshot: Callable[[], Snapshot], report: Callable[[str], None]
    ) -> None:
        super().__init__(name="soak-progress", daemon=True)
        self.every, self.snapshot, self.report = every, snapshot, report
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.report(progress_line(self.snapshot()))
