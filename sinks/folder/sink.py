"""The folder sink: the protocol's methods (core/protocol.py), each handing over to one role
(writer, committer, recovery, operations); errors.py says what the file system's failures
mean. One class serves both kinds, `files` and `jsonl`: the configuration's kind chooses the
encoder (encoders.py), and nothing else differs. What one instance keeps between calls (its
open context, attempt counters, counters, the last committed epoch) is the shared base's,
core/sink_base.py; this class adds only the participant being written and the schema.

Call order, on one instance: `open`, then per epoch `begin_epoch`, `write_batch`...,
`pre_commit`, and `commit_epoch` or `rollback_epoch` (possibly on another instance, given the
handle); `recover_prepared` once after `open` at start; `close` at the end.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from durable_sinks.core.durable_fs import probe_as_owner
from durable_sinks.core.errors import ConfigError, DurableSinkError, UsageError
from durable_sinks.core.naming import component
from durable_sinks.core.operations import Bookkeeping, Holding, Prepared
from durable_sinks.core.protocol import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.sink_base import SinkBase, Step, guarded

from . import committer, errors, operations, recovery
from .config import FolderConfig
from .encoders import encoder_for
from .handles import FolderHandle
from .layout import PROBE, Layout
from .writer import FolderParticipant, fitted

if TYPE_CHECKING:
    import pyarrow as pa

#: What the file system answers when the job may not write a folder, or the path is not a
#: folder: a setting to fix (any other failure, EIO or ENOSPC, is the disk's).
REFUSED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR})


class FolderSink(SinkBase[FolderConfig]):
    """Exactly-once files in a local folder through staging folders and create-only renames:
    Parquet (`Files`) or JSON Lines (`Jsonl`).

    Implements SinkConnector, DistributedSink (executors prepare, the driver commits) and
    OperableSink (the `durable-sinks` command's views)."""

    KEEPS_COMMIT_RECORD = True

    def __init__(self, config: FolderConfig) -> None:
        # Nothing is touched here: a sink is built on the driver to check its options, and
        # may be pickled to executors. The folder is first used in `open`.
        super().__init__(config)
        self.layout = Layout(Path(config.path))
        self.encoder = encoder_for(config)
        self._current: FolderParticipant | None = None
        self._schema: pa.Schema | None = None

    def _target(self) -> str:
        return f"path={self.config.path!r}"

    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        return errors.translate(exc, step, self)

    @property
    def writing(self) -> FolderParticipant | None:
        """The participant this instance is writing (begun, not yet prepared), if any."""
        return self._current

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._opening(context)
        if not context.inspect:  # an operator's tool only reads: it creates nothing
            try:
                self.layout.staging_area.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"cannot create {self.layout.staging_area}: {exc.strerror}",
                    job=context.job_id,
                    sink=self.name,
                    fix=f"point the {self.config.kind} sink at a writable folder",
                ) from exc
        self._last_committed = last = self._read_last_committed()
        evolving = context.policy.adds_columns and self.encoder.one_schema_per_file
        if evolving and not context.inspect and last is not None:
            # Start from the dataset's schema: a column once added or widened stays so.
            with self.translated("read the committed epoch's schema", last):
                self._schema = recovery.epoch_schema(self.layout, last, self.where(last))

    def _read_last_committed(self, *, listed: bool = False) -> int | None:
        with self.translated("read the committed epochs"):
            return recovery.last_committed(
                self.layout, self.context, fsync=self.config.fsync, listed=listed
            )

    def reread_last_committed_epoch(self) -> int | None:
        """RereadsCommitted, from the folder's `epoch=*` names rather than the newest-epoch
        pointer: asked when what the open read looks short of the job's newest decision, the
        one case a listing must settle (a publisher of an older release that wrote no
        pointer entry)."""
        found = self._read_last_committed(listed=True)
        if found is not None:
            self._committed_up_to(found)
        return self._last_committed

    def close(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.close()

    def capabilities(self) -> SinkCapabilities:
        # A staged folder outlives its writer and any process can rename it (resumable and
        # distributed prepare); parts of one epoch publish side by side (partitioned). Schema
        # evolution: Parquet files take an evolved schema file by file (writer.fitted); each
        # JSON line holds its own row's columns, whatever the batch's schema. A commit renames
        # its own participant's folder: beside the next epoch's staging (commits_beside_writes).
        return SinkCapabilities(
            exactly_once=True,
            two_phase_commit=True,
            resumable_prepare=True,
            distributed_prepare=True,
            partitioned=True,
            schema_evolution=True,
            commits_beside_writes=True,
        )

    def schema(self) -> pa.Schema | None:
        return self._schema

    def health_check(self) -> None:
        """Probe that the job can create, link and delete files in the staging area. The
        probe's names carry the job, the sink and the generation; a start killed while
        probing leaves them behind, and a later generation's probe removes them."""
        ctx = self.context
        owner = f"{PROBE}:{component(ctx.job_id)}:{component(self.name)}:"
        try:
            probe_as_owner(self.layout.staging_area, owner, ctx.generation, fsync=self.config.fsync)
        except OSError as exc:
            if exc.errno not in REFUSED_ERRNOS:  # EIO, ENOSPC, ...: the disk, not the settings
                raise self.failure(
                    exc, f"probe that the job can write in {self.layout.root}"
                ) from exc
            raise ConfigError(
                f"cannot write in {self.layout.root}: {exc.strerror}",
                job=ctx.job_id,
                sink=self.name,
                fix="give the job write access to the folder, on a local file system",
            ) from exc

    # -- phase 1: writer.py ------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        if self._current is not None:  # an attempt that failed before its rollback finished
            self._current.discard()
            self._current = None
        name = self._next_participant(epoch)
        with self.translated("create the staging folder", epoch):
            self._current = FolderParticipant(
                self.layout, self.encoder, self.context, epoch, name, fsync=self.config.fsync
            )

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        current = self._require_current()
        with self.translated("write the staged file", current.epoch):
            self._schema, batch = fitted(
                self._schema,
                batch,
                self.encoder,
                adds_columns=self.context.policy.adds_columns,
                where=self.where(current.epoch),
            )
            result = current.write(batch)
        self._count("rows", result.rows)
        self._count("bytes", result.bytes)
        return result

    def pre_commit(self, epoch: int) -> CommitHandle:
        current = self._require_current()
        if current.epoch != epoch:
            raise UsageError(
                f"pre_commit({epoch}) while epoch {current.epoch} is open", **self.where(epoch)
            )
        with self.translated("prepare the staged files", epoch):
            handle = current.prepare(self.name)
        self._current = None
        return handle

    # -- phase 2: committer.py ---------------------------------------------------------------
    @guarded("publish the epoch's staged files")
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        parsed = FolderHandle.parse(handle)
        outcome = committer.commit(
            self.layout, parsed, fsync=self.config.fsync, where=self.where(epoch)
        )
        self._committed_up_to(epoch)
        if outcome is CommitOutcome.COMMITTED:
            self._count("epochs_committed")
        else:
            self.logger(epoch).info(
                "participant %s was already published (part %s): nothing to do",
                handle.participant,
                parsed.details.part,
            )
        return outcome

    @guarded("remove the epoch's staging folder")
    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        _ = self.context  # UsageError before open
        current = self._current
        if handle is None:
            # No handle: the attempt this instance is writing, if it is of this epoch.
            if current is None or current.epoch != epoch:
                return
            participant = str(current.name)
        else:
            participant = handle.participant
        if current is not None and str(current.name) == participant:
            self._current = None
            current.close()
        if committer.rollback(self.layout, participant, fsync=self.config.fsync):
            self._count("rollbacks")
            if handle is not None:
                self.logger(epoch).info(
                    "rolled back prepared participant %s: its staging folder is removed",
                    participant,
                )

    # -- recovery: recovery.py ---------------------------------------------------------------
    @guarded("list the staging folders")
    def recover_prepared(self) -> list[CommitHandle]:
        found = recovery.leftovers(self.layout, self.context)
        for name in found.removed:
            self.logger().info(
                "removed staging folder %s, left unprepared by an older generation", name
            )
        return found.prepared

    @guarded("list the staging folders")
    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        return recovery.prepared_of_epoch(self.layout, self.context, epoch)

    # -- operator views: operations.py -------------------------------------------------------
    def in_doubt(self) -> list[Prepared]:
        return operations.in_doubt(self.layout, self.context)

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        _ = self.context  # UsageError before open
        return operations.holdings(self.layout, self.encoder, first, last)

    def live_generations(self) -> Sequence[int]:
        return []  # a folder keeps no sessions: no running coordinator can be seen

    @guarded("drop the job's bookkeeping")
    def drop_job(self, *, apply: bool, epoch_markers: bool = False) -> list[Bookkeeping]:
        """The job's staging leftovers and (with `epoch_markers`) its parts' markers; never
        a data file (operations.drop_job)."""
        return operations.drop_job(
            self.layout, self.context, apply=apply, epoch_markers=epoch_markers
        )

    # -- the participant being written --------------------------------------------------------
    def _require_current(self) -> FolderParticipant:
        if self._current is None:
            raise self._no_epoch()
        return self._current
