"""What an operator's tool asks of a sink: what is in doubt, what the target holds per epoch.

The `durable-sinks` command (status, inspect, resolve, verify, expire; docs/guide.md,
"Operations") opens each sink of a job with `OpenContext(inspect=True)` and asks these
questions without writing anything, fencing anything or claiming a generation. A sink that
does not implement `OperableSink` is shown as "not inspectable" rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .protocol import CommitHandle, SinkConnector


@dataclass(frozen=True)
class Prepared:
    """One participant of the job and sink that is prepared now (phase 1 done, neither
    committed nor rolled back), whatever generation made it.

    `handle` names it (`participant`, `epoch`; enough to roll it back, while committing uses
    the decision's own copy); `what` says what it is on the target (a prepared transaction, a
    multipart upload, a staging folder); `age_s` and `size_bytes` when the target tells."""

    handle: CommitHandle
    what: str
    age_s: float | None = None
    size_bytes: int | None = None


@dataclass(frozen=True)
class Holding:
    """What a sink holds of one epoch, read from the target.

    - `marker`: the sink's epoch marker is visible (what `last_committed_epoch` reads);
    - `participants`: the participants the visible markers name;
    - `rows`: rows the target holds for the epoch where it can count them independently of
      the markers (records with the epoch's header, rows of the epoch's objects), else the
      rows the markers record, else None;
    - `counted`: True when `rows` was counted on the data itself, not read from markers;
    - `at`: when the epoch became visible (seconds since the epoch), if known;
    - `problems`: what is wrong with the epoch's data (an object missing or changed, a file
      that no marker lists), each naming the object.
    """

    epoch: int
    marker: bool
    participants: frozenset[str] = frozenset()
    rows: int | None = None
    counted: bool = False
    at: float | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)


@runtime_checkable
class OperableSink(SinkConnector, Protocol):
    """A sink the `durable-sinks` command can look into. Every method only reads, and works
    on a sink opened with `OpenContext(inspect=True)`.

    - `in_doubt()`: every prepared participant of this job and sink, of any generation;
    - `holdings(first, last)`: what the target holds of each epoch in `first..last` that it
      holds anything of (epochs it holds nothing of are absent);
    - `live_generations()`: generations of the job that hold a session on the target now
      (a coordinator is running), where the target can tell; else empty.
    """

    def in_doubt(self) -> list[Prepared]: ...

    def holdings(self, first: int, last: int) -> dict[int, Holding]: ...

    def live_generations(self) -> Sequence[int]: ...


@runtime_checkable
class ExpiringSink(SinkConnector, Protocol):
    """A sink that keeps bookkeeping per committed epoch (marker rows, emptied journal
    folders) which only history needs: `expire_markers(before)` deletes what it keeps of
    epochs below `before`, always keeping the newest committed epoch's (which
    `last_committed_epoch` reads), and returns how many records it deleted. Never what
    readers read committed data through, nor the user's data.

    The running coordinator calls it on its opened sinks as epochs commit (beyond
    `retain_epochs`, coordinator/_expiry.py), `durable-sinks expire` on sinks opened with
    `OpenContext(inspect=True)`. It must be cheap when called every few epochs: no listing
    of the whole history per call (one indexed delete; a listing once per opened sink)."""

    def expire_markers(self, before_epoch: int) -> int: ...


@runtime_checkable
class InformingSink(SinkConnector, Protocol):
    """A sink with facts for `durable-sinks doctor` that are neither a pass nor a failure
    (what the target could support, for instance). `notes()` only reads, works on a sink
    opened with `OpenContext(inspect=True)`, and returns (what, what was found) pairs."""

    def notes(self) -> list[tuple[str, str]]: ...


@dataclass(frozen=True)
class EpochRepair:
    """One epoch of one sink that `durable-sinks repair-epochs` put back (or, in a dry run,
    would put back): `parts` marker rows and `rows` rows, and how (`action`: copied from the
    old server, committed there first, or recorded as lost)."""

    epoch: int
    parts: int
    rows: int
    action: str


#: What a repair asks of the job's decisions: the decision's copy of a participant left
#: prepared on the old server when the epoch's decision commits it, else None.
DecidedCommit = Callable[[CommitHandle], "CommitHandle | None"]


@runtime_checkable
class RepairableSink(SinkConnector, Protocol):
    """A sink whose lost committed epochs an operator can repair (docs/reliability.md, "Lost
    committed epochs"), opened with `OpenContext(inspect=True)` while the job is stopped.
    Both calls plan only unless `apply`; with `apply` each writes in one transaction of the
    sink's target, all or nothing.

    - `copy_lost_epochs(source, decided, apply=...)`: every epoch newer than the sink's
      last committed one that the old target at `source` (its data, e.g. the old primary
      started alone) holds, copied with its marker rows. A participant left prepared there
      whose decision commits it (`decided`) is committed there first. Refuses (and writes
      nothing) when the epoch's rows cannot be picked exactly.
    - `record_lost_epochs(through, note, apply=...)`: marker rows recording every epoch
      after the last committed one up to `through` as lost (`note` says by whom and why), so
      the job goes on after the operator re-supplied the rows from the source.
    """

    def copy_lost_epochs(
        self, source: str, decided: DecidedCommit, *, apply: bool
    ) -> list[EpochRepair]: ...

    def record_lost_epochs(self, through: int, note: str, *, apply: bool) -> list[EpochRepair]: ...


@dataclass(frozen=True)
class Bookkeeping:
    """One kind of thing a job keeps on a target (a sink's or its decision store's) for its
    own bookkeeping, never the user's committed data: marker rows, a fence row, decision
    records, progress records, an owner file, staging leftovers.

    - `what`: what it is, in words ("marker rows", "_job.json");
    - `where`: the table, key, folder or topic it is in (never a secret);
    - `count`: how many of it, when the target tells;
    - `kept`: why `durable-sinks drop` leaves it in place (it cannot be removed without
      rewriting the user's data, or readers need it); None when drop removes it.
    """

    what: str
    where: str
    count: int | None = None
    kept: str | None = None

    @property
    def removable(self) -> bool:
        return self.kept is None


@runtime_checkable
class DroppableSink(SinkConnector, Protocol):
    """A sink whose bookkeeping of one job `durable-sinks drop` can remove when the job is
    retired, opened with `OpenContext(inspect=True)` while the job is stopped and nothing of
    it is in doubt (the command checks both before it calls).

    `drop_job(apply=..., epoch_markers=...)` returns everything the job and sink keep on
    the target: what is removed (`kept` None) and what stays (with why). Without `apply`
    it only reads. With `apply` it removes the removable ones and returns what it removed;
    calling it again finds nothing more (idempotent). It never removes, nor changes what
    ordinary readers see of, the user's committed data (rows, records, data objects and
    files), and it touches nothing outside the sink's own table, prefix, folder or topic:
    every location read from storage is checked to lie there first. `epoch_markers`: also
    the epoch markers that readers reading through markers need to find committed epochs
    (S3's `_epochs/`, the folder sinks' `_EPOCH.json`); without it they are listed as kept.
    """

    def drop_job(self, *, apply: bool, epoch_markers: bool = False) -> list[Bookkeeping]: ...
