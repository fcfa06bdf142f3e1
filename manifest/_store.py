"""The decision-store protocol, and what every store shares: the checks of its caller and
its logging."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

from durable_sinks.core.errors import UsageError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.operations import Bookkeeping

from ._record import DecisionRecord


@runtime_checkable
class DecisionStore(Protocol):
    """Where a job's commit decisions are made durable: one record per epoch, create-only.

    Generations fence coordinators: `open` claims a generation higher than any before. The
    guarantee every store gives: after `open` of generation g returns, no coordinator of a
    generation below g can add a record for an epoch that generation g has looked up with
    `get` (or `put`) since, and every record such a coordinator did add is visible to `get`.
    That is what the coordinator relies on: it looks an epoch up before it rolls back
    participants of it (presumed abort, at recovery) and before it decides it. The local
    directory and Postgres stores give more: no record at all from an older generation once
    `open` of g returned (fenced atomically with respect to `put`). The S3 store fences per
    epoch (S3 has no multi-object condition): `get` leaves an undecided epoch claimed by its
    generation, and `put` also refuses when it finds a newer generation claimed, so an older
    generation's record lands after g's `open` only from a `put` already under way, for an
    epoch g had not looked up; g's `get` then returns it (and g finishes the epoch).

    Contract of each call:
    - `put(record)` is the commit point. When it returns, the record for `record.epoch` is
      durable and is either `record` or one that was there first (returned instead: that one
      wins). InDoubtError: the outcome is unknown (the record may have been sent and
      stored): the caller must not roll back. FencedError, or any other error: nothing was
      added (safe to roll back).
    - `get(epoch)` is O(1) whatever the history length; ManifestCorruptError on a damaged
      record, never a silent None. It may write (the S3 store claims the epoch for this
      generation when it finds no decision) and may raise FencedError (a newer generation
      claimed the epoch).
    - `mark_finished(epoch)` records that every participant is committed (a hint: losing it in
      a crash only makes recovery re-check idempotent commits).
    - `expire(before_epoch)` deletes finished records of epochs below `before_epoch`.
    """

    @property
    def durable(self) -> bool:
        """True when records survive a crash of the process and of the machine."""
        ...

    def open(self, job_id: str) -> int: ...

    def peek_generation(self, job_id: str) -> int:
        """The newest generation claimed for `job_id` (0 if none), claiming nothing: what a
        worker that prepares for the current coordinator names its participants with."""
        ...

    def put(self, record: DecisionRecord) -> DecisionRecord: ...

    def get(self, epoch: int) -> DecisionRecord | None: ...

    def mark_finished(self, epoch: int) -> None: ...

    def is_finished(self, epoch: int) -> bool: ...

    def latest_epoch(self) -> int | None:
        """The highest epoch with a record, or None."""
        ...

    def expire(self, before_epoch: int) -> int:
        """Delete finished records of epochs below `before_epoch`; return how many."""
        ...

    def peek(self, job_id: str, epoch: int) -> DecisionRecord | None:
        """The decision of `epoch` of `job_id`, read only: it claims, fences and writes
        nothing, needs no `open`, and is what an operator's tool (`durable-sinks`) reads while
        a coordinator runs. None when the epoch has no record (undecided, or expired)."""
        ...

    def peek_latest(self, job_id: str) -> int | None:
        """The highest epoch of `job_id` with a record, read only (as `peek`); None if none."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class DroppableStore(Protocol):
    """A decision store whose records of one job `durable-sinks drop` can remove when the job
    is retired (the command checks first that nothing of it is in doubt and no coordinator
    runs). Needs no `open` (which would claim a generation).

    `drop_job(job_id, apply=...)` returns what the store keeps of the job (generation,
    decision and finished records, hints); without `apply` it only reads, with `apply` it
    removes them and returns what it removed (idempotent). It touches nothing of another
    job: every key, path or row it removes is checked to be the job's own first."""

    def drop_job(self, job_id: str, *, apply: bool) -> list[Bookkeeping]: ...


def require_open(job: str | None) -> str:
    """The job a store was opened for; UsageError before `open`."""
    if job is None:
        raise UsageError("the decision store is not open; call open(job_id) first")
    return job


def require_own(record: DecisionRecord, job: str, generation: int) -> None:
    """UsageError unless `record` belongs to the store's job and a generation not newer
    than the one it opened (a record handed to the wrong store is a bug of the caller)."""
    if record.job_id != job or record.generation > generation:
        raise UsageError(
            f"record of job {record.job_id} generation {record.generation} handed to the "
            f"store of job {job} generation {generation}",
            job=job,
            epoch=record.epoch,
        )


F = TypeVar("F", bound=Callable[..., Any])
#: The job each store was opened for, for the lines of calls that do not name it.
_opened_for: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def store_logger(store: object, job: str) -> JobLogger:
    """The logger every decision store logs through: logger `durable_sinks.manifest.<store>`
    (the store's class), the job on every line and in the record's extras, as the sinks'
    and the coordinator's loggers put them (core/joblog.py)."""
    return JobLogger(job, component=f"manifest.{type(store).__name__}")


def logs_open(open_: F) -> F:
    """`open`, logging the generation it claimed (INFO: once per coordinator start)."""

    @functools.wraps(open_)
    def run(self: object, job_id: str) -> int:
        generation: int = open_(self, job_id)
        _opened_for[self] = job_id
        store_logger(self, job_id).info("claimed generation %d in %r", generation, self)
        return generation

    return cast(F, run)


def logs_put(put: F) -> F:
    """`put`, logging a record that was there first (INFO: a replay, or a coordinator that
    raced this one; the record found stands) and each record written (DEBUG)."""

    @functools.wraps(put)
    def run(self: object, record: DecisionRecord) -> DecisionRecord:
        stored: DecisionRecord = put(self, record)
        log = store_logger(self, record.job_id).bind(epoch=record.epoch)
        if stored == record:
            log.debug("decision recorded: %d participant(s)", len(stored.handles))
        else:
            log.info(
                "the epoch was decided before, by generation %d (%d participant(s)): that "
                "decision stands",
                stored.generation,
                len(stored.handles),
            )
        return stored

    return cast(F, run)


def logs_expire(expire: F) -> F:
    """`expire`, logging how many records it deleted (INFO, when any)."""

    @functools.wraps(expire)
    def run(self: object, before_epoch: int) -> int:
        removed: int = expire(self, before_epoch)
        if removed:
            store_logger(self, _opened_for.get(self, "-")).info(
                "expired %d finished decision(s) of epochs below %d", removed, before_epoch
            )
        return removed

    return cast(F, run)
