"""Errors raised by sinks, the coordinator and the decision stores.

Every error carries the job, sink and epoch it concerns (when known) and, where there is one,
the fix. None of them ever holds a secret. They pickle (PySpark pickles errors raised on
executors back to the driver).

    DurableSinkError
    ├── UsageError                   the API was called out of order (a sink used before `open`
    │                                or after `close`, a write with no epoch begun): a bug in
    │                                the calling code, not in the settings or the data
    ├── ConfigError                  bad configuration; fix it and restart (not retriable)
    │   └── CapabilityError          a sink or store cannot give the requested guarantee/mode
    ├── SchemaMismatchError          the data does not fit the sink (not retriable)
    │   └── BadRowsError             rows the target cannot take (their reasons counted)
    │       └── TooManyBadRowsError  more than max_bad_rows of them, with dead letters on
    ├── BatchChangedError            a batch's rows changed while it was being read (a
    │                                non-deterministic recomputation); nothing was committed
    ├── ReplayMismatchError          a replayed batch's rows differ from those its epoch
    │                                committed (replay_check="fail"); the committed rows stay
    ├── TransientError               a call may succeed if retried (timeouts, lost connections)
    │   ├── UnreachableError         a server could not be reached (refused, timed out, name
    │   │                            not resolved); credentials it refuses are a ConfigError
    │   └── OutageError              an outage outlasted the job's outage_tolerance_s; the
    │                                last error is its cause; a restart recovers
    ├── FencedError                  a newer coordinator owns the job: this one must stop
    ├── DropRefusedError             `durable-sinks drop` found the job in doubt or running;
    │                                nothing was removed
    ├── EpochOrderError              a later epoch is already committed (checkpoint reset, or
    │                                another query writes under the same job id)
    ├── InDoubtError                 the outcome of a commit is unknown; recovery resolves it
    │   └── CommitIncompleteError    the decision is durable but some participant is not yet
    │                                committed; recovery (or the epoch's replay) finishes it
    ├── ParticipantLostError         a decided participant no longer exists (data removed
    │   │                            behind the job, a failover that lost it; never a step
    │   │                            of the protocol)
    │   └── CommittedEpochLostError  a target (or the decision store) no longer holds epochs
    │                                the job committed: found at start, before writing
    ├── CorruptRecordError           a record durable-sinks wrote is unreadable: a commit
    │   │                            handle, an epoch marker on a target (never skipped)
    │   ├── StoredFormatError        ... in a format version this release does not read
    │   │                            (written by a newer release): upgrade durable-sinks
    │   └── ManifestCorruptError     ... a decision record (also a ManifestError)
    └── ManifestError                the decision store cannot be read or written
        └── ManifestCorruptError
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .bad_rows import RefusedRows


class DurableSinkError(Exception):
    """Base of every error durable-sinks raises on purpose.

    `retriable` says whether calling the same thing again may succeed.
    """

    retriable: ClassVar[bool] = False
    #: The fix a message carries when the raiser gives none.
    default_fix: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        job: str | None = None,
        sink: str | None = None,
        epoch: int | None = None,
        fix: str | None = None,
    ) -> None:
        self.message = message
        self.job = job
        self.sink = sink
        self.epoch = epoch
        self.fix = fix if fix is not None else self.default_fix
        super().__init__(self._render())

    def _render(self) -> str:
        where = ", ".join(
            f"{key}={value}"
            for key, value in (("job", self.job), ("sink", self.sink), ("epoch", self.epoch))
            if value is not None
        )
        text = f"[{where}] {self.message}" if where else self.message
        return f"{text} Fix: {self.fix}" if self.fix else text

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild,
            (type(self), self.message, self.job, self.sink, self.epoch, self.fix, self.__dict__),
        )


def _rebuild(
    cls: type[DurableSinkError],
    message: str,
    job: str | None,
    sink: str | None,
    epoch: int | None,
    fix: str | None,
    state: dict[str, Any],
) -> DurableSinkError:
    error = cls.__new__(cls)
    DurableSinkError.__init__(error, message, job=job, sink=sink, epoch=epoch, fix=fix)
    error.__dict__.update(state)
    return error


class UsageError(DurableSinkError):
    """The API was used out of order: a sink called before `open` or after `close`, a batch
    written with no epoch begun, a coordinator asked to run an epoch before `start`. The
    settings and the data are fine; the calling code is not. Nothing was written by the call
    that raised it."""


class ConfigError(DurableSinkError):
    """The configuration is wrong or incomplete (a setting, a missing table or topic, a
    missing privilege). Raised before anything is written."""


class CapabilityError(ConfigError):
    """A sink, store or mode cannot give what the job asks for (e.g. exactly-once)."""


class SchemaMismatchError(DurableSinkError):
    """The batch's columns or types do not fit the sink; raised before anything is prepared."""


class BadRowsError(SchemaMismatchError):
    """Rows of the batch cannot be written to the target (its reasons, counted, with the
    first row of each). Raised before anything of the epoch is prepared; nothing of it is
    committed. `refused` holds the rows of the record batch that was being written."""

    default_fix = (
        "fix or filter the rows in the query, or route them to a dead-letter sink: "
        "durable_sink(..., on_bad_rows='dead_letter', dead_letter=sink(...)); nothing of "
        "the epoch was committed"
    )

    def __init__(
        self,
        message: str,
        *,
        refused: RefusedRows | None = None,
        job: str | None = None,
        sink: str | None = None,
        epoch: int | None = None,
        fix: str | None = None,
    ) -> None:
        super().__init__(message, job=job, sink=sink, epoch=epoch, fix=fix)
        if refused is None:
            from .bad_rows import RefusedRows

            refused = RefusedRows()
        self.refused = refused


class TooManyBadRowsError(BadRowsError):
    """A sink refused more rows of an epoch than the job's `max_bad_rows` allows: the data or
    the schema is wrong, not a few rows. Raised before the decision; nothing of the epoch is
    committed anywhere, not even in the dead letter."""

    default_fix = (
        "the first reasons say what is wrong: fix the query or the target's schema; if this "
        "many bad rows is expected, raise max_bad_rows (a count, or a fraction of the epoch "
        "such as 0.2); nothing of the epoch was committed"
    )


class BatchChangedError(DurableSinkError):
    """The batch gave different rows on two reads (e.g. a cached partition was lost and
    recomputed by a non-deterministic query). Raised before the decision: nothing commits,
    and the epoch's replay writes it afresh."""


class ReplayMismatchError(DurableSinkError):
    """Spark replayed a batch whose epoch was already committed, and the replayed rows differ
    from the committed ones (row count or digest, see durable_sinks.core.content): the query
    is not deterministic. Raised only with replay_check="fail", after the epoch was finished:
    the committed rows stay exactly as they were, the replay's were not written. Not
    retriable: the same replay gives the same difference."""


class TransientError(DurableSinkError):
    """A temporary failure (time-out, dropped connection): the same call may succeed later."""

    retriable = True


#: What to do about a FencedError: it always means a second driver of the job started.
FENCED_FIX = (
    "another driver started this job_id after this one (a restarted query, or a second query "
    "with the same job_id) and now owns it; this driver committed nothing after that point. "
    "Stop this one. If no other driver should run, restart the query from its checkpoint (it "
    "recovers); if two queries share the job_id, give each its own"
)


class FencedError(DurableSinkError):
    """A newer coordinator (higher generation) owns this job; this one committed nothing after
    being fenced and must stop. Not retriable: restart the job instead.

    Without an explicit `fix`, the message carries the general one (FENCED_FIX)."""

    default_fix = FENCED_FIX


class DropRefusedError(DurableSinkError):
    """`durable-sinks drop` refused to retire a job: a participant of it is prepared, a
    decided epoch is not committed on every sink, or a coordinator of it looks alive.
    Nothing was removed. The message names the epoch (or the coordinator) and the fix."""


class EpochOrderError(DurableSinkError):
    """Asked to write an epoch older than one already committed: the checkpoint was reset or
    deleted, or another query writes under the same job id. Never skipped silently."""


class InDoubtError(DurableSinkError):
    """The outcome is unknown (e.g. a commit call failed after reaching the server). Recovery at
    the next start, or the epoch's replay, settles it from the durable decision."""

    retriable = True


class CommitIncompleteError(InDoubtError):
    """The epoch's decision is durable (it *will* be committed) but some participants could not
    be committed yet. Replaying the epoch or restarting the job finishes it."""


class ParticipantLostError(DurableSinkError):
    """A participant that the decision says to commit has vanished. The protocol never lets
    this happen; it means data was removed behind the job's back (a prepared transaction
    rolled back by hand, a failover to an asynchronous standby that had not received it), or
    a bug."""


#: Where the repair of lost committed epochs is documented (linked from the errors).
LOST_EPOCHS_DOC = "docs/reliability.md#lost-committed-epochs"

#: What most likely takes committed epochs away from a target.
LOST_EPOCHS_CAUSES = (
    "a failover to an asynchronous standby that had not received the last transactions, a "
    "restore from a backup older than the last epochs, or rows and marker rows deleted "
    "behind the job"
)


class CommittedEpochLostError(ParticipantLostError):
    """Epochs the job committed are missing from a target (or the decision store no longer
    holds decisions for epochs a target or Spark's checkpoint shows committed). Raised when a
    coordinator starts or reaches the first epoch of its run, before anything of that run is
    written; the job does not go on with rows silently missing. Not retriable: the same
    check finds the same loss until the epochs are repaired (the fix names how).

    `first_lost` .. `last_lost` are the epochs the loss covers, `holder` what lost them (a
    sink's name, or "decision store")."""

    def __init__(
        self,
        message: str,
        *,
        first_lost: int | None = None,
        last_lost: int | None = None,
        holder: str | None = None,
        job: str | None = None,
        sink: str | None = None,
        epoch: int | None = None,
        fix: str | None = None,
    ) -> None:
        super().__init__(message, job=job, sink=sink, epoch=epoch, fix=fix)
        self.first_lost = first_lost
        self.last_lost = last_lost
        self.holder = holder


#: What reading malformed or hostile stored content raises before its decoder can say so (a
#: field of the wrong type, an infinite number, a non-object, JSON nested too deep to parse):
#: each decoder of stored state turns these into CorruptRecordError.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


class CorruptRecordError(DurableSinkError):
    """A record durable-sinks wrote cannot be read: a commit handle (its envelope or the
    sink's details), an epoch marker on a target. Never skipped: what
    it says decides what is committed. Not retriable; the message names the record."""


class StoredFormatError(CorruptRecordError):
    """Stored state (a decision record, a handle, a marker, a table's layout...) is in a
    format version this release does not read: written by a newer release of durable-sinks,
    or by one older than the previous release. Nothing was changed; the message names the
    record, both versions and the fix (core/formats.py). Not retriable."""


class ManifestError(DurableSinkError):
    """The decision store could not be read or written."""


class ManifestCorruptError(ManifestError, CorruptRecordError):
    """A decision record exists but cannot be parsed or fails its checksum."""


class UnreachableError(TransientError):
    """A server could not be reached: connection refused or timed out, its name not resolved,
    the server starting up or out of connection slots. The job may succeed once it answers
    (retriable). Credentials or a database the server refuses are a ConfigError instead."""


class OutageError(TransientError):
    """A batch kept failing with retriable errors for longer than the job rides out outages
    (`outage_tolerance_s`). Carries the last error (as `__cause__` and in its message, with
    the server and the step). Nothing half-done is visible: what was not decided is rolled back
    (now or by the next start's recovery), what was decided is finished by the next start or
    the batch's replay."""

    @classmethod
    def past_bound(
        cls,
        last: DurableSinkError,
        *,
        elapsed: float,
        attempts: int,
        tolerance: float,
        step: str,
    ) -> OutageError:
        where = f" {step}" if step else ""
        then = f" Last error's fix: {last.fix}" if last.fix else ""
        return cls(
            f"gave up riding out an outage after {elapsed:.0f} s and {attempts} failed "
            f"attempts (outage_tolerance_s={tolerance:g}); the last attempt failed{where}: "
            f"{type(last).__name__}: {last.message}.{then}",
            job=last.job,
            sink=last.sink,
            epoch=last.epoch,
            fix="once the server answers again, restart the query from its checkpoint: it "
            "recovers and writes (or finishes) the batch exactly once; to ride out longer "
            "outages without stopping, raise outage_tolerance_s",
        )
