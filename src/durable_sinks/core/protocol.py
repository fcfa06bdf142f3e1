"""The sink protocol: what every sink offers the coordinator (after LaminarDB's SinkConnector).

A sink plays four roles, each a Protocol below, after Flink's Sink V2: the *writer*
(`EpochWriter`, phase 1: begin, write, prepare; yields a `CommitHandle`), the *committer*
(`EpochCommitter`, phase 2: commit or roll back a handle, idempotently, from any process), the
*recovery* (`SinkRecovery`: what older generations left, what the target shows as committed)
and the *lifecycle* (`SinkLifecycle`: open, checks, metrics, close). `SinkConnector` is all
four; the optional roles are `LastResource`, `DistributedSink`, `TaskBriefing` and
`PublishingSink` here and the operator views (`OperableSink`, `ExpiringSink`) in
core/operations.py. Built-in sinks stand on one base, core/sink_base.py.

Call order for one epoch, on one sink instance::

    open(context)                      once, before anything else
    begin_epoch(epoch)
    write_batch(batch) ...             zero or more times
    pre_commit(epoch) -> CommitHandle  phase 1: durable but invisible
    commit_epoch(epoch, handle)        phase 2, only after the decision is durable
      or rollback_epoch(epoch, handle | None)
    close()

`recover_prepared()` (at start, after `open`) lists what earlier generations of this job left
prepared; the coordinator then commits or rolls back each handle from the decision record.
A handle is all another process needs to finish or undo phase 1: `commit_epoch` and
`rollback_epoch` must work on a fresh instance given only the handle.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .bad_rows import RefusedRows, WritePolicy
from .errors import MALFORMED, CorruptRecordError, StoredFormatError
from .formats import stored_format
from .naming import ParticipantName
from .text_enum import TextEnum

if TYPE_CHECKING:
    import pyarrow as pa

JSON = None | bool | int | float | str | list["JSON"] | dict[str, "JSON"]


class DeliveryGuarantee(TextEnum):
    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE = "exactly_once"

    def __repr__(self) -> str:
        return f"DeliveryGuarantee.{self.name}"


@dataclass(frozen=True)
class SinkCapabilities:
    """What a sink can do; the coordinator validates a job against these before it starts.

    - exactly_once: with the coordinator, every row lands once across crashes and replays.
    - idempotent: writing the same rows twice leaves one copy (keyed upserts, dedup).
    - upsert / changelog: applies keyed updates / insert-update-delete streams.
    - two_phase_commit: pre_commit makes the epoch durable and invisible; commit publishes.
    - resumable_prepare: a prepared participant survives the writer's death and can be
      committed or rolled back by another process from its handle (Postgres, files, S3; not
      Kafka, whose open transaction dies with its producer).
    - distributed_prepare: participants can be prepared on executors and committed by the
      driver (needed for executor mode).
    - schema_evolution: accepts new columns over time.
    - partitioned: keeps several participants per epoch (one per Spark partition).
    - commits_beside_writes: the commit and publish of a decided epoch may run in another
      thread while the same instance begins, writes and prepares the next epoch (the
      coordinator's `background_commits`).
    """

    exactly_once: bool = False
    idempotent: bool = False
    upsert: bool = False
    changelog: bool = False
    two_phase_commit: bool = False
    resumable_prepare: bool = False
    distributed_prepare: bool = False
    schema_evolution: bool = False
    partitioned: bool = False
    commits_beside_writes: bool = False


@dataclass(frozen=True)
class WriteResult:
    """What one `write_batch` added to the epoch: rows and encoded bytes written, and, when
    the job routes bad rows to a dead letter (`OpenContext.policy`), the rows of the batch
    the sink refused and left out (core/bad_rows.py). `rows` counts written rows only."""

    rows: int
    bytes: int
    refused: RefusedRows = field(default_factory=RefusedRows)


@dataclass(frozen=True)
class OpenContext:
    """Who opens a sink: the job, the sink's name within the job, and the coordinator's
    generation. A sink names its participants with `participant()`. The decision store fences
    older generations in any case; a sink that can also fence on its own side (a fence row
    checked in every epoch transaction, a Kafka producer epoch) raises FencedError when a
    newer generation has opened it.

    `commit_point` is True when the coordinator will commit this sink with
    `LastResource.commit_with_decision` instead of `commit_epoch`: its commit carries the
    epoch's decision. A resumable sink that is the only one of a job may then skip its own
    prepare (one-phase commit: the decision and the data land in one transaction).

    `worker` is True on an executor that prepares one part of an epoch for the driver's
    coordinator (executor mode): the sink must then only connect. The driver's instance of
    the same generation already created what the sink needs and fenced older generations;
    the worker still refuses to prepare if the fence has moved past its generation. `part`
    names the worker's participants (unique per task attempt, `<slice>-<attempt>`: see
    `ParticipantName.slice`).

    `inspect` is True when an operator's tool opens the sink (`durable-sinks status`,
    `inspect`, `verify`, `doctor`; core/operations.py): the sink must only connect and read.
    It creates nothing, fences nothing and names its sessions so that they are not taken for
    a coordinator's; `generation` is then the newest one claimed, not one of its own.

    `policy` is what the job asks of the writer (core/bad_rows.py): refuse bad rows by
    failing (the default) or by leaving them out and reporting them in the WriteResult, and
    whether new columns may be added to the target inside the epoch.

    `transaction` names the job's sinks whose participants ride in one transaction with this
    sink's (SharesTransactions: the same `transaction_group`), in the job's order, the
    carrier of the decision first; empty when this sink's transactions are its own. Every
    member's epoch then commits or aborts with the carrier's commit.

    `task_brief` is what the driver's instance of this sink gave for the epoch a worker
    prepares (`TaskBriefing.task_brief`), handed over unchanged; None on the driver, and on
    a worker when the driver's sink gave none (the worker then finds what it needs itself).
    A worker is opened for one epoch: the brief names that epoch, and a sink that finds
    another one in it ignores it."""

    job_id: str
    sink: str
    generation: int
    commit_point: bool = False
    worker: bool = False
    part: str = "0"
    inspect: bool = False
    policy: WritePolicy = field(default_factory=WritePolicy)
    transaction: tuple[str, ...] = ()
    task_brief: bytes | None = field(default=None, repr=False)

    def participant(self, epoch: int, attempt: int, part: str | None = None) -> ParticipantName:
        return ParticipantName.build(
            self.job_id, self.sink, epoch, part or self.part, self.generation, attempt
        )


COMMIT_HANDLE = stored_format(
    "commit handle",
    current=1,
    oldest=1,
    where="inside each decision record, and where a sink keeps its own copy (the files "
    "sinks' `_EPOCH.json`, the Delta sink's journals): a JSON object "
    'with `"version"`; the sink\'s part, `details`, has its own version (`"v"`, below)',
)
HANDLE_VERSION = COMMIT_HANDLE.current


@dataclass(frozen=True)
class CommitHandle:
    """Phase 1's result: small, JSON-serialisable, enough to finish or undo the participant
    from another process. Never holds a connection, a client, or a secret.

    `details` is the sink's own (e.g. the staging folder, an upload id); `checksum` is a digest
    of the bytes written in this attempt, for audits.
    """

    sink: str
    epoch: int
    participant: str
    rows: int
    bytes: int
    checksum: str
    details: Mapping[str, JSON] = field(default_factory=dict)

    @classmethod
    def leftover(
        cls, sink: str, epoch: int, participant: str, details: Mapping[str, JSON]
    ) -> CommitHandle:
        """A handle that recovery (or an operator's view) rebuilds for a participant it found
        on the target: no rows, bytes or checksum known, only what rolls it back (`details`).
        The decision's own handle is what commits it."""
        return cls(sink, epoch, participant, 0, 0, "", details)

    def to_json(self) -> dict[str, JSON]:
        return {
            "version": HANDLE_VERSION,
            "sink": self.sink,
            "epoch": self.epoch,
            "participant": self.participant,
            "rows": self.rows,
            "bytes": self.bytes,
            "checksum": self.checksum,
            "details": dict(self.details),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommitHandle:
        if not isinstance(data, Mapping):
            raise CorruptRecordError(
                f"malformed commit handle: a {type(data).__name__}, not an object"
            )
        source = f"commit handle of participant {data.get('participant')}"
        COMMIT_HANDLE.check(data.get("version"), source=source)
        try:
            return cls(
                sink=str(data["sink"]),
                epoch=int(data["epoch"]),
                participant=str(data["participant"]),
                rows=int(data["rows"]),
                bytes=int(data["bytes"]),
                checksum=str(data["checksum"]),
                details=dict(data.get("details") or {}),
            )
        except MALFORMED as exc:
            raise CorruptRecordError(f"malformed commit handle: {exc!r}"[:500]) from exc

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def loads(cls, raw: str | builtins.bytes, *, source: str) -> CommitHandle:
        """A handle stored as `dumps` wrote it; CorruptRecordError naming `source` (the
        file, row or object read) when it is not one."""
        try:
            data = json.loads(raw)
        except MALFORMED as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise CorruptRecordError(
                f"{source}: not a commit handle ({type(exc).__name__})",
                fix="the record was changed outside durable-sinks; move it aside and restart: "
                "recovery treats what it named as never prepared",
            ) from None
        try:
            return cls.from_json(data)
        except StoredFormatError:
            raise
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"{source}: {exc.message}", fix=exc.fix) from None


class CommitOutcome(TextEnum):
    """What `commit_epoch` did: both mean the participant's data is now visible."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"


@runtime_checkable
class SinkLifecycle(Protocol):
    """Who the sink is and what it can do: opened once per generation before any other call,
    closed last. Methods are called from one thread at a time."""

    @property
    def name(self) -> str:
        """The sink's name within the job (unique per job)."""
        ...

    def open(self, context: OpenContext) -> None: ...

    def capabilities(self) -> SinkCapabilities: ...

    def health_check(self) -> None:
        """Raise ConfigError naming the setting and the fix if the target cannot work."""
        ...

    def metrics(self) -> Mapping[str, float]: ...

    def close(self) -> None: ...


@runtime_checkable
class EpochWriter(Protocol):
    """Phase 1: `begin_epoch`, `write_batch` zero or more times, `pre_commit`.

    After `pre_commit` returns, the epoch's rows are durable on the target and invisible to
    its readers, together with the epoch marker (job, sink, epoch, rows, checksum) that
    `last_committed_epoch` will read once committed. The returned handle is all another
    process needs to finish or undo the participant. SchemaMismatchError is raised before
    anything is prepared."""

    def begin_epoch(self, epoch: int) -> None: ...

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult: ...

    def pre_commit(self, epoch: int) -> CommitHandle: ...

    def schema(self) -> pa.Schema | None: ...


@runtime_checkable
class EpochCommitter(Protocol):
    """Phase 2, from the handle alone (a fresh instance of another process may be the one
    called):
    - after `commit_epoch` returns: rows and marker are visible, atomically; calling it again
      with the same handle (from any process) is a no-op returning ALREADY_COMMITTED;
    - after `rollback_epoch` returns: nothing of the participant remains; calling it again, or
      for a participant that never prepared, is a no-op. It never publishes anything."""

    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome: ...

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None: ...


@runtime_checkable
class ConcurrentCommitter(Protocol):
    """A sink that commits several participants of one decided epoch at once (executor
    mode's parts), as concurrently as its target allows within its own bound (sessions,
    requests in flight). `commit_participants(epoch, handles)` is `commit_epoch` of each
    handle, with the same contract (idempotent, from the handles alone), returning their
    outcomes in order. On an error it begins no further commit (except after a lost
    participant: the others still commit), waits for those begun, and raises the most
    serious error (a lost participant before a fence, before a transient failure): some
    handles may be committed then, and calling it again commits the rest."""

    def commit_participants(
        self, epoch: int, handles: Sequence[CommitHandle]
    ) -> list[CommitOutcome]: ...


@runtime_checkable
class ChecksParticipants(Protocol):
    """A sink that can tell, before an epoch is decided, that its prepared participants could
    not all land: `check_participants(epoch, handles)` gets every handle of this sink the
    decision would name (one in driver mode, a part's each in executor mode) and raises a
    typed error (SchemaMismatchError, ...) naming what conflicts and the fix. The
    coordinator calls it after the previous epoch's commits settled and before the
    decision, so the error rolls the epoch back and nothing of it becomes visible. It reads
    what the sink already knows (its table's shape as of its last commit); no request per
    handle."""

    def check_participants(self, epoch: int, handles: Sequence[CommitHandle]) -> None: ...


@runtime_checkable
class SinkRecovery(Protocol):
    """What the target shows: leftovers of older generations, and the committed epochs."""

    def recover_prepared(self) -> list[CommitHandle]:
        """Participants of this job and sink that generations older than the open one left
        prepared (phase 1 done, neither committed nor rolled back). Anything they left
        unprepared (half-written) is removed here, as nothing can ever commit it."""
        ...

    def last_committed_epoch(self) -> int | None:
        """The highest epoch whose marker is visible on the target, read from the target."""
        ...


@runtime_checkable
class SinkConnector(SinkLifecycle, EpochWriter, EpochCommitter, SinkRecovery, Protocol):
    """One target of a job: every role. Methods are called from one thread at a time.

    Call order for one epoch on one instance: `open`, `begin_epoch`, `write_batch`...,
    `pre_commit`, then `commit_epoch` (only after the decision is durable) or
    `rollback_epoch`, and `close`. Errors: TransientError when a retry may help;
    SchemaMismatchError before anything is prepared; FencedError when a newer generation
    owns the sink."""


@runtime_checkable
class LastResource(SinkConnector, Protocol):
    """A participant that cannot be resumed by another process (its prepared state dies with
    the writer, like a Kafka transaction). It is committed after every other participant is
    prepared and before any of them is committed, and its own commit carries the decision
    record, so its commit *is* the commit point. A job has at most one.

    `commit_with_decision` must make the data and the decision visible atomically, and must
    fail with FencedError (committing nothing) once a newer generation has opened the sink.
    `read_decision` returns the decision a committed epoch carried, or None.
    """

    def commit_with_decision(
        self, epoch: int, handle: CommitHandle, decision: Mapping[str, JSON]
    ) -> None: ...

    def read_decision(self, epoch: int) -> Mapping[str, JSON] | None: ...


@runtime_checkable
class DistributedSink(SinkConnector, Protocol):
    """A sink whose participants can be prepared by workers (executors) and committed by the
    driver (capability distributed_prepare). Several participants of one epoch may then be
    prepared, by the winning and the losing attempts of each part.

    `prepared_participants(epoch)` lists every participant of `epoch` of this job and sink
    that is prepared now, whatever its generation, so the coordinator can roll back those its
    decision does not name as soon as the epoch is finished.
    """

    def prepared_participants(self, epoch: int) -> list[CommitHandle]: ...


@runtime_checkable
class TaskBriefing(Protocol):
    """A DistributedSink whose workers need facts of the target that the driver's instance
    already read (a table's schema, partition spec and location): `task_brief(epoch)` gives
    them, on the driver, once per distributed epoch before its workers start, as a *task
    brief*: plain bytes the sink alone reads, which the worker's instance of the sink gets in
    `OpenContext.task_brief` when it opens for that epoch. A worker with a brief needs no
    catalog or metadata read of its own; one without (a brief of None, or a driver of an
    older release) must still work, reading what it needs itself.

    The brief travels inside the Spark job that runs the tasks (it may show in the engine's
    logs and plans): it must hold no secret. A worker takes credentials from its own copy of
    the sink's configuration, as it does without a brief. It must not make a worker's result
    depend on the brief being current: whatever the driver's commit relies on (the target's
    state at commit time) is checked there, as it is without a brief. For a sink with
    `commits_beside_writes`, `task_brief` may run while the previous epoch's phase 2 runs in
    another thread."""

    def task_brief(self, epoch: int) -> bytes | None: ...


@runtime_checkable
class SharesTransactions(Protocol):
    """A sink whose participants can ride in one transaction with those of other sinks of the
    same `transaction_group()` (Kafka topics of one cluster: one producer's transaction spans
    them). Several sinks that cannot resume a prepared epoch (LastResource) fit in one job when
    they share one group: the first carries the decision and its commit commits every
    member's participant with it (OpenContext.transaction names them). The group is a
    readable name of what the members share, e.g. `kafka cluster 127.0.0.1:9092`."""

    def transaction_group(self) -> str: ...


@runtime_checkable
class RereadsCommitted(Protocol):
    """A sink that can read its highest committed epoch from the target again, now.
    `last_committed_epoch` may answer from what the sink read when it opened, moved by its
    own commits since; another process (a zombie driver finishing an epoch it decided)
    commits behind it. Before it reports a committed epoch as lost, the coordinator reads
    the sink again with `reread_last_committed_epoch`, which also moves
    `last_committed_epoch`."""

    def reread_last_committed_epoch(self) -> int | None: ...


@runtime_checkable
class KeepsCommitRecord(Protocol):
    """A sink that can say whether its target keeps its *commit record* (what
    `last_committed_epoch` reads: marker rows, S3 markers, progress records, a Delta
    transaction identifier, an Iceberg table property) for as long as the target holds
    anything the job committed. When `commit_record_kept()` is True, no committed epoch read
    from the target means it holds nothing of the job (wiped, dropped and created again,
    restored from a backup older than the job), and the lost-epoch check reports the loss
    of every epoch committed into it. False means no record may only mean the record
    expired (a Delta table whose transaction identifiers expire): the check then cannot tell
    and skips the sink, as it skips every sink that does not implement this."""

    def commit_record_kept(self) -> bool: ...


@runtime_checkable
class PublishingSink(SinkConnector, Protocol):
    """A sink whose readers see an epoch whole only once a marker covering all its
    participants exists (S3's epoch marker): `commit_epoch` makes one participant's data
    durable in its final place, and `publish_epoch` then writes the epoch's marker.

    The coordinator calls `publish_epoch(epoch, handles)` after every participant of the
    sink that the epoch's decision names (`handles`, possibly none: an empty epoch) is
    committed: when it finishes an epoch, and in recovery after committing leftovers of a
    decided epoch. It must be idempotent (a marker already there with the same content is
    ALREADY_COMMITTED) and it moves `last_committed_epoch`.
    """

    def publish_epoch(self, epoch: int, handles: Sequence[CommitHandle]) -> CommitOutcome: ...


@runtime_checkable
class DecisionHost(Protocol):
    """A sink's own target keeping one job's decisions and generations, so that a job whose
    only sink carries each epoch's decision in its commit (a `LastResource`) needs no
    decision store of its own. `durable_sinks.manifest.HostedDecisionStore` turns one into a
    DecisionStore; the decisions themselves are written by the sink's `commit_with_decision`,
    never by the host.

    Contract:
    - `claim_generation(job_id)` is a compare-and-swap: it returns a generation higher than
      any claimed before for the job (by this host or recorded by the sink itself), two
      concurrent claims never return the same one, and once it returns no coordinator of an
      older generation can commit an epoch through the sink any more (FencedError there).
      TransientError or FencedError (a concurrent claim won every retry): nothing claimed
      that anyone relies on (a claim that landed unseen only makes the next one higher).
    - `newest_generation(job_id)`: the newest generation claimed (0 if none), claiming
      nothing.
    - `decision(job_id, epoch)`: the decision record (as JSON) that the commit of `epoch`
      carried, None when no commit of `epoch` is found. Read only.
    - `latest_decided(job_id)`: the highest epoch the sink committed for the job, or None.
    - `close()` releases the host's clients.
    """

    @property
    def sink(self) -> str:
        """The name of the sink whose commits carry the decisions."""
        ...

    def claim_generation(self, job_id: str) -> int: ...

    def newest_generation(self, job_id: str) -> int: ...

    def decision(self, job_id: str, epoch: int) -> Mapping[str, JSON] | None: ...

    def latest_decided(self, job_id: str) -> int | None: ...

    def close(self) -> None: ...


@runtime_checkable
class DecisionHostingSink(LastResource, Protocol):
    """A last resource that can keep its own job's decisions and generations: when it is a
    job's only sink, `decision_host()` (a new host from the sink's configuration alone,
    sharing no client with the sink) is the job's decision store, and the job needs no
    `decision_store`."""

    def decision_host(self) -> DecisionHost: ...
