"""The base every built-in sink stands on: what all sinks share, and nothing of any one target.

A sink is assembled from the roles of core/protocol.py (writer, committer, recovery,
lifecycle) and, where the target allows, the operator views of core/operations.py. The base
holds what those roles share:

- the sink's name and the `OpenContext` it was opened with (`context`; a UsageError naming
  the sink before `open`);
- one attempt counter per epoch, so that every attempt at an epoch prepares a participant of
  its own name (`_next_participant`);
- the sink's counters, reported by `metrics()`;
- the commit of several participants of an epoch (`commit_participants`: one after the other
  unless a sink runs them concurrently, `_commit_concurrently`);
- the highest committed epoch it knows (`last_committed_epoch`): read from the target at
  `open`, then moved by its own commits (`_committed_up_to`);
- where an error happened (`_where`: job, sink, epoch) and the one idiom that turns a client's
  failure into the error tree. Each sink says what its client's failures mean in one method,
  `_translate`; the base applies it around a block (`with self.translated(Step(...)):`), a
  call (`self._client_call(fn, step)`), a whole protocol method (`@guarded(...)`), or, where
  a call site must look at the exception first (an absent object may be fine),
  `raise self.failure(exc, step)`. Errors of durable-sinks' own pass through unchanged.

`OpenParticipant` is the participant an instance is writing, from `begin_epoch` to
`pre_commit`; each sink extends it with what its target needs (a transaction, uploads, files).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, cast

from .bad_rows import BadRowsError, RefusedRows
from .errors import (
    DurableSinkError,
    FencedError,
    InDoubtError,
    ParticipantLostError,
    TransientError,
    UsageError,
)
from .joblog import JobLogger
from .naming import ParticipantName
from .protocol import CommitHandle, CommitOutcome, OpenContext
from .threads import run_concurrently

if TYPE_CHECKING:
    import pyarrow as pa


class NamedConfig(Protocol):
    """A sink's configuration: frozen, picklable, with the sink's name in the job."""

    @property
    def name(self) -> str: ...


ConfigT = TypeVar("ConfigT", bound=NamedConfig)
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: The counters every sink reports; a sink adds its own (`SinkBase.__init__(counters=...)`).
COMMON_COUNTERS = ("rows", "bytes", "epochs_committed", "rollbacks", "refused_rows")


@dataclass(frozen=True)
class Step:
    """What a sink was doing when its client failed, for the translated error.

    `action` completes "could not ..." ("complete the upload of part 3"); `epoch` is the
    epoch concerned, if any; `in_doubt`, for a call whose outcome a failure leaves unknown (a
    commit that may have reached the server), says what settles it: such failures are
    InDoubtError, never TransientError."""

    action: str
    epoch: int | None = None
    in_doubt: str | None = None


class OpenParticipant:
    """The participant an instance is writing, from `begin_epoch` until `pre_commit` hands
    it over as a CommitHandle (or a rollback discards it). Nothing of it is durable before
    `pre_commit` returns."""

    def __init__(self, epoch: int, name: ParticipantName) -> None:
        self.epoch = epoch
        self.name = name


class SinkBase(ABC, Generic[ConfigT]):
    """The lifecycle every built-in sink shares (see the module docs)."""

    #: Whether the target keeps the sink's commit record (core.protocol.KeepsCommitRecord):
    #: a sink that never expires its newest marker says True; False (unknown) by default.
    KEEPS_COMMIT_RECORD: ClassVar[bool] = False

    def __init__(self, config: ConfigT, *, counters: Iterable[str] = ()) -> None:
        self.config = config
        self._context: OpenContext | None = None
        self._attempts: dict[int, int] = {}
        self._counters: dict[str, float] = dict.fromkeys((*COMMON_COUNTERS, *counters), 0.0)
        #: Counters are updated by an epoch's writes and by a decided epoch's commits, which
        #: may run on another thread (`commits_beside_writes`).
        self._counters_lock = threading.Lock()
        #: The highest epoch whose marker is visible: read from the target at `open`, then
        #: moved by this instance's commits (after `open` only this generation's coordinator
        #: commits this job's participants).
        self._last_committed: int | None = None

    @property
    def name(self) -> str:
        return self.config.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, {self._target()})"

    @abstractmethod
    def _target(self) -> str:
        """What the sink writes to, for its repr: `table='events'`, `path='s3://b/p'`."""

    # -- context -------------------------------------------------------------------------------
    def _opening(self, context: OpenContext) -> None:
        """Record the context `open` was given: from here on errors name the job."""
        self._context = context

    @property
    def context(self) -> OpenContext:
        """The context of `open`; UsageError before it."""
        if self._context is None:
            raise self._not_open()
        return self._context

    def _not_open(self) -> UsageError:
        return UsageError(f"{self!r} is not open; the coordinator opens sinks")

    def logger(self, epoch: int | None = None) -> JobLogger:
        """The sink's logger: logger `durable_sinks.sinks.<kind>` (the kind its configuration
        names; `durable_sinks.sinks` for a configuration that names none), every line
        prefixed with, and carrying as extras, the job, this sink's name and `epoch`
        (core/joblog.py)."""
        job = self._context.job_id if self._context is not None else "-"
        kind = getattr(type(self.config), "kind", None)
        component = f"sinks.{kind}" if isinstance(kind, str) and kind else "sinks"
        return JobLogger(job, self.name, epoch, component=component)

    def where(self, epoch: int | None = None) -> dict[str, Any]:
        """The job, sink and epoch an error names (keyword arguments of DurableSinkError)."""
        job = self._context.job_id if self._context is not None else None
        return {"job": job, "sink": self.name, "epoch": epoch}

    def _next_participant(self, epoch: int) -> ParticipantName:
        """The name of this instance's next attempt at `epoch`: a fresh one per attempt."""
        attempt = self._attempts.get(epoch, 0)
        self._attempts[epoch] = attempt + 1
        return self.context.participant(epoch, attempt)

    def _of_this_generation(self, handle: CommitHandle) -> bool:
        """Whether `handle` names a participant prepared under this instance's own generation,
        by the coordinator that opened it (not a worker's or an operator's view): the live
        path. Every start claims a new generation, so only the coordinator running now and
        the tasks it started prepare participants of it: a handle recovery reads back from
        storage after a restart, or from an older coordinator's decision, is of an older one.
        Such handles were made moments ago by this job; their data is exactly as prepared
        unless someone outside the job deleted it meanwhile."""
        context = self.context
        if context.worker or context.inspect:
            return False
        name = ParticipantName.parse(handle.participant)
        return name is not None and name.generation == context.generation

    def _no_epoch(self, epoch: int | None = None) -> UsageError:
        what = "no epoch is open" if epoch is None else f"epoch {epoch} is not open"
        return UsageError(f"{what}; call begin_epoch first", **self.where(epoch))

    def last_committed_epoch(self) -> int | None:
        return self._last_committed

    def reread_last_committed_epoch(self) -> int | None:
        """RereadsCommitted: the highest committed epoch read from the target now."""
        found = self._read_last_committed()
        if found is not None:
            self._committed_up_to(found)
        return self._last_committed

    def commit_record_kept(self) -> bool:
        """KeepsCommitRecord: whether the target never drops the record `_read_last_committed`
        reads while it holds the job's rows (KEEPS_COMMIT_RECORD; see the protocol)."""
        return self.KEEPS_COMMIT_RECORD

    def _read_last_committed(self) -> int | None:
        """The highest epoch whose marker the target shows now (what `open` reads); None
        when the sink cannot read it again (this default: `reread_last_committed_epoch`
        then answers what the sink knows)."""
        return None

    def _committed_up_to(self, epoch: int) -> None:
        """Epoch `epoch`'s marker is now visible."""
        if self._last_committed is None or epoch > self._last_committed:
            self._last_committed = epoch

    # -- phase 2 of several participants -------------------------------------------------------
    @abstractmethod
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        """Phase 2 of one participant (core.protocol.EpochCommitter)."""

    def commit_participants(
        self, epoch: int, handles: Sequence[CommitHandle]
    ) -> list[CommitOutcome]:
        """`commit_epoch` of each handle (core.protocol.ConcurrentCommitter), one after the
        other; a sink whose target takes concurrent commits overrides it with
        `_commit_concurrently`."""
        return [self.commit_epoch(epoch, handle) for handle in handles]

    def _commit_concurrently(
        self, calls: Sequence[Callable[[int], CommitOutcome]], workers: int
    ) -> list[CommitOutcome]:
        """Run the commits `calls` (each given its worker's slot), at most `workers` at once:
        core.threads.run_concurrently, the most serious error raised (a lost participant,
        then a fence, then anything else) once every begun call ended; after a lost
        participant the others are still committed (the epoch is decided: as much of it as
        can lands), after any other error no further one is begun. The calls must not touch
        the sink's last committed epoch (not thread-safe): the caller updates it after."""
        return run_concurrently(
            calls,
            workers=workers,
            rank=_commit_severity,
            keep_going=lambda exc: isinstance(exc, ParticipantLostError),
        )

    # -- bad rows ------------------------------------------------------------------------------
    def _refuse(self, batch: pa.RecordBatch, refused: RefusedRows, epoch: int) -> pa.RecordBatch:
        """Apply the job's bad-row policy (`context.policy`) to the rows of `batch` this
        sink's checks refused: with "fail" raise BadRowsError naming their reasons (nothing
        was written); with "dead_letter" return the batch without them (the caller then
        reports `refused` in its WriteResult, and writes what is returned)."""
        if not refused:
            return batch
        if not self.context.policy.isolates:
            raise BadRowsError(
                f"{len(refused)} of {batch.num_rows} rows cannot be written: {refused.summary()}",
                refused=refused,
                **self.where(epoch),
            )
        self._count("refused_rows", len(refused))
        return batch.filter(refused.kept_mask(batch.num_rows))

    # -- counters ------------------------------------------------------------------------------
    def _count(self, counter: str, by: float = 1.0) -> None:
        with self._counters_lock:
            self._counters[counter] += by

    def metrics(self) -> Mapping[str, float]:
        with self._counters_lock:
            return dict(self._counters)

    # -- client errors -------------------------------------------------------------------------
    @abstractmethod
    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        """What `exc`, raised by the sink's client during `step`, means: a typed error naming
        `self.where(step.epoch)` and the fix, or None when `exc` is not the client's (it is
        then re-raised unchanged)."""

    def failure(
        self, exc: BaseException, step: Step | str, epoch: int | None = None
    ) -> DurableSinkError:
        """The typed error for `exc` raised by the client during `step`: `_translate`'s, or a
        DurableSinkError naming the step and the exception when it has none."""
        if isinstance(exc, DurableSinkError):
            return exc
        known = step if isinstance(step, Step) else Step(step, epoch)
        typed = self._translate(exc, known) if isinstance(exc, Exception) else None
        if typed is None and isinstance(exc, OSError):
            typed = self._os_failure(exc, known)
        if typed is not None:
            return typed
        return DurableSinkError(
            f"could not {known.action}: {type(exc).__name__}: {exc}", **self.where(known.epoch)
        )

    def _client_call(self, call: Callable[[], T], step: Step | str, epoch: int | None = None) -> T:
        """`call()` inside `translated(step, epoch)`."""
        with self.translated(step, epoch):
            return call()

    @contextlib.contextmanager
    def translated(self, step: Step | str, epoch: int | None = None) -> Iterator[None]:
        """Run the block; a client failure inside it leaves as `_translate`'s typed error
        (its cause kept for debugging). `step` may be just the action's text."""
        try:
            yield
        except DurableSinkError:
            raise
        except Exception as exc:
            known = step if isinstance(step, Step) else Step(step, epoch)
            typed = self._translate(exc, known)
            if typed is None and isinstance(exc, OSError):
                typed = self._os_failure(exc, known)
            if typed is None:
                raise
            raise typed from exc

    def _os_failure(self, exc: OSError, step: Step) -> DurableSinkError:
        """An operating-system failure the sink's own translation left (a local disk's EIO,
        ENOSPC or EACCES, a socket's): InDoubtError for a call whose outcome it leaves
        unknown (`step.in_doubt`), else TransientError; both name the error and the path."""
        name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        path = f" at {exc.filename}" if exc.filename else ""
        what = f"could not {step.action}: {name} {exc.strerror or exc}{path}"
        if step.in_doubt is not None:
            return InDoubtError(
                f"{what}; whether it took effect is unknown",
                **self.where(step.epoch),
                fix=step.in_doubt,
            )
        return TransientError(
            what,
            **self.where(step.epoch),
            fix="check the disk or network the sink writes to (free space, permissions, I/O "
            "errors in the kernel log); the job retries, and a retried commit finds what the "
            "failed one published",
        )


def _commit_severity(exc: BaseException) -> int:
    """Which of several commits' errors `commit_participants` raises: the lowest."""
    if isinstance(exc, ParticipantLostError):
        return 0  # no retry helps: the operator's repair
    if isinstance(exc, FencedError):
        return 1  # a newer driver owns the job
    return 2


def guarded(action: str, *, in_doubt: str | None = None) -> Callable[[F], F]:
    """A protocol method of a SinkBase run inside `self.translated(Step(action, epoch,
    in_doubt))`, the epoch being the method's first argument when it is an int: the last
    guard, so that no raw client error leaves the sink."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def run(self: SinkBase[Any], *args: Any, **kwargs: Any) -> Any:
            epoch = args[0] if args and isinstance(args[0], int) else None
            with self.translated(Step(action, epoch, in_doubt)):
                return method(self, *args, **kwargs)

        return cast(F, run)

    return wrap
