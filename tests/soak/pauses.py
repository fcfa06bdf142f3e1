"""How long each fault held the job up: from the moment the fault was injected to the end of
the first batch that began after it.

Every driver appends one line per batch its writer finished (`BatchLog`): the epoch, the wall
time the writer was called and the wall time it returned, in `commits.log` of the run's
folder. A batch that began before the fault and was held up by it ends later than the fault;
measuring to the end of the first batch that began after the fault counts that hold-up and one
whole batch after it, so the figure never flatters (a calm batch takes `calm_batch()`). A
fault that struck while a driver was starting (none of its batches finished yet) is not
measured: its pause would be mostly the driver's start.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Batch:
    """One batch the job's writer finished: epoch, began and ended (wall clock, seconds)."""

    epoch: int
    began: float
    ended: float


class BatchLog:
    """The commit log the drivers append to and the soak reads after the run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def wrap(self, write: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """`write` (a `foreachBatch` function) that logs each batch it finished. A batch whose
        write raised is not logged: it did not commit."""

        def logged(frame: Any, epoch: int) -> None:
            began = time.time()
            write(frame, epoch)
            with self.path.open("a") as out:
                out.write(f"{epoch} {began:.3f} {time.time():.3f}\n")

        return logged

    def batches(self) -> list[Batch]:
        """Every batch logged so far, in the order they ended; a torn last line (the driver
        killed mid-write) is left out."""
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_text().splitlines():
            fields = line.split()
            if len(fields) == 3:
                found.append(Batch(int(fields[0]), float(fields[1]), float(fields[2])))
        return sorted(found, key=lambda b: b.ended)


def pause_after(fired: float, batches: Sequence[Batch]) -> float | None:
    """Seconds from `fired` to the end of the first batch that began after it; None if no
    batch began after it (the run ended first)."""
    ends = [b.ended for b in batches if b.began >= fired]
    return min(ends) - fired if ends else None


def while_starting(fired: float, batches: Sequence[Batch], starts: Sequence[float]) -> bool:
    """Whether a driver started (wall clock `starts`) before `fired` had finished no batch by
    then: the fault struck the job while it was starting."""
    started = [s for s in starts if s <= fired]
    ended = [b.ended for b in batches if b.ended <= fired]
    return bool(started) and (not ended or max(ended) < max(started))


def calm_batch(batches: Iterable[Batch]) -> float | None:
    """The median time a batch's write took, faults or not (what a pause is made of at
    least)."""
    took = [b.ended - b.began for b in batches]
    return statistics.median(took) if took else None


def describe(pauses: Sequence[float | None], starting: int = 0) -> str:
    """`pause median 4.2 s, max 9.0 s` over the measured ones, saying how many had no batch
    after them and how many (`starting`) struck a starting driver and were not measured."""
    measured = [p for p in pauses if p is not None]
    if not measured:
        return f"{starting} while a driver started: no pause measured" if starting else ""
    notes = []
    if len(pauses) > len(measured):
        notes.append(f"{len(pauses) - len(measured)} with no batch after")
    if starting:
        notes.append(f"{starting} more while a driver started")
    tail = f" ({'; '.join(notes)})" if notes else ""
    return f"pause median {statistics.median(measured):.1f} s, max {max(measured):.1f} s{tail}"
