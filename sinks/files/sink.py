"""Local Parquet files: the embedded default sink.

Layout under `path` (readable by Spark, pyarrow or DuckDB as a Hive-partitioned dataset; the
`_staging` folder starts with `_`, which those readers skip)::

    _staging/<participant>/part-00000.parquet, _EPOCH.json    phase 1: written and fsynced
    epoch=<epoch>/part=<part>/part-00000.parquet, _EPOCH.json phase 2: published by rename

`_EPOCH.json` is the epoch marker (job, sink, epoch, participant, rows, checksum). It moves with
the data in one atomic rename, so the marker is visible exactly when the data is:
`last_committed_epoch` reads the published markers. Publication is create-only
(renameat2 RENAME_NOREPLACE): a second commit of the same participant finds its own marker
and does nothing; a different participant can never overwrite a published epoch.

Schema evolution (`schema_evolution="add_columns"`, core/evolution.py): a batch with new
columns, missing columns or safely widened types is written in the dataset's evolved schema.
A Parquet file holds one schema, so a participant whose schema grows mid-epoch closes its
file and goes on in the next (`part-00001.parquet`, ...). The marker's details list each
file's schema (`schemas`), where readers find them (reader.py unifies them). The sink starts
from the last committed epoch's schema, so a column once added or widened stays so in new
files (Spark's `mergeSchema` merges new columns but not int32 with int64).
"""

from __future__ import annotations

import errno
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from durable_sinks.core.durable_fs import (
    create_exclusive,
    fsync_dir,
    fsync_file,
    probe_as_owner,
    remove_tree,
    rename_noreplace,
)
from durable_sinks.core.errors import (
    ConfigError,
    CorruptRecordError,
    DurableSinkError,
    FencedError,
    ParticipantLostError,
    SchemaMismatchError,
)
from durable_sinks.core.evolution import evolved, schema_text, unify
from durable_sinks.core.handles import HandleDetails
from durable_sinks.core.naming import ParticipantName, component
from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.schemas import schema_difference
from durable_sinks.core.sink_base import OpenParticipant, SinkBase, Step, guarded

from . import operations, reader
from .config import Files

if TYPE_CHECKING:
    import pyarrow as pa

MARKER = operations.MARKER
STAGING = "_staging"
#: Names of the start-up probe's files in `_staging`: `.probe:<job>:<sink>:<generation>`.
PROBE = ".probe"


def file_name(number: int) -> str:
    """The name of a participant's Parquet file number `number` (0 for its first)."""
    return f"part-{number:05d}.parquet"


@dataclass(frozen=True)
class FileHandleDetails(HandleDetails):
    """A files participant's handle details: the job that wrote it and its part. The staging
    folder is named by the participant, so nothing more is needed to publish or remove it.
    `schemas` is the Arrow schema (core/evolution.schema_text) of each of its Parquet files,
    in file order (`part-00000.parquet` first); empty in markers written before schemas were
    recorded."""

    job_id: str
    part: str
    schemas: tuple[str, ...] = ()


class FileParticipant(OpenParticipant):
    """The participant being written: its staging folder and open Parquet writer."""

    def __init__(self, epoch: int, name: ParticipantName, staging: Path) -> None:
        super().__init__(epoch, name)
        self.rows = 0
        self.bytes = 0
        self.staging = staging
        self.writer: pq.ParquetWriter | None = None
        self.digest = hashlib.sha256()
        #: The schema of each file written (the last one's is being written).
        self.schemas: list[pa.Schema] = []

    def file(self, number: int) -> Path:
        return self.staging / file_name(number)


#: What the file system answers when the job may not write a folder, or the path is not a
#: folder: a setting to fix.
REFUSED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR})


class FileSink(SinkBase[Files]):
    """Exactly-once Parquet files through staging folders and atomic renames."""

    KEEPS_COMMIT_RECORD = True

    def __init__(self, config: Files) -> None:
        super().__init__(config)
        self.root = Path(config.path)
        self._current: FileParticipant | None = None
        self._schema: pa.Schema | None = None

    def _target(self) -> str:
        return f"path={str(self.root)!r}"

    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        """A file of this attempt vanishing is the one client failure with a meaning: only a
        newer coordinator's recovery removes another generation's staging folder. The folder
        may still be there, half removed, when the failure is seen (the recovery deletes its
        files first): a missing file inside it means the same."""
        current = self._current
        if not isinstance(exc, FileNotFoundError) or current is None:
            return None
        inside = str(current.staging) in f"{exc.filename or ''} {exc}"
        if current.staging.exists() and not inside:
            return None
        return FencedError(
            f"staging folder {current.staging.name} was removed by a newer coordinator's recovery",
            **self.where(step.epoch),
            fix="stop this coordinator; the newer one replays the epoch",
        )

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._opening(context)
        if context.inspect:  # an operator's tool: read only
            self._last_committed = self._scan_last_committed()
            return
        try:
            (self.root / STAGING).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create {self.root / STAGING}: {exc.strerror}",
                job=context.job_id,
                sink=self.name,
                fix="point the files sink at a writable folder",
            ) from exc
        self._last_committed = self._scan_last_committed()
        if context.policy.adds_columns and self._last_committed is not None:
            self._schema = self._epoch_schema(self._last_committed)

    def _read_last_committed(self) -> int | None:
        with self.translated("read the published epochs"):
            return self._scan_last_committed()

    def _epoch_schema(self, epoch: int) -> pa.Schema | None:
        """The schema of a committed epoch: its parts' files' schemas unified (None if it
        has no file)."""
        parts = reader.committed_parts(self.root, range(epoch, epoch + 1))
        return unify((s for part in parts for s in reader.part_schemas(part)), **self.where(epoch))

    def close(self) -> None:
        current, self._current = self._current, None
        if current is not None and current.writer is not None:
            current.writer.close()

    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(
            exactly_once=True,
            two_phase_commit=True,
            resumable_prepare=True,
            distributed_prepare=True,
            partitioned=True,
            schema_evolution=True,
        )

    def schema(self) -> pa.Schema | None:
        return self._schema

    def health_check(self) -> None:
        """Probe that the job can create, link and delete files in `_staging`. The probe's
        names carry the job, the sink and the generation; a start killed while probing leaves
        them behind, and the next generation's probe removes them."""
        ctx = self.context
        staging = self.root / STAGING
        owner = f"{PROBE}:{component(ctx.job_id)}:{component(self.name)}:"
        try:
            probe_as_owner(staging, owner, ctx.generation, fsync=self.config.fsync)
        except OSError as exc:
            if exc.errno not in REFUSED_ERRNOS:  # EIO, ENOSPC, ...: the disk, not the settings
                raise self.failure(exc, f"probe that the job can write in {self.root}") from exc
            raise ConfigError(
                f"cannot write in {self.root}: {exc.strerror}",
                job=ctx.job_id,
                sink=self.name,
                fix="give the job write access to the folder, on a local file system",
            ) from exc

    # -- phase 1 -------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        if self._current is not None:
            # A failed attempt whose rollback did not finish: the coordinator has moved on.
            self._discard(self._current)
        name = self._next_participant(epoch)
        staging = self.root / STAGING / str(name)
        staging.mkdir()  # a fresh name per attempt: an existing folder is a bug
        self._current = FileParticipant(epoch, name, staging)

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        current = self._require_current()
        with self.translated("write the staged file", current.epoch):
            return self._write(current, batch)

    def _write(self, current: FileParticipant, batch: pa.RecordBatch) -> WriteResult:
        if self.context.policy.adds_columns:
            self._schema, batch = evolved(self._schema, batch, **self.where(current.epoch))
        elif self._schema is None:
            self._schema = batch.schema
        elif not batch.schema.equals(self._schema):
            raise SchemaMismatchError(
                schema_difference(self._schema, batch.schema),
                **self.where(current.epoch),
                fix="write batches of one schema to a files sink, give a new path for a new "
                "schema, or let the dataset evolve: durable_sink(..., "
                "schema_evolution='add_columns')",
            )
        if current.writer is not None and not current.schemas[-1].equals(batch.schema):
            current.writer.close()  # one schema per file: the next one is evolved
            current.writer = None
        if current.writer is None:
            current.writer = pq.ParquetWriter(
                current.file(len(current.schemas)),
                batch.schema,
                compression=self.config.compression,
            )
            current.schemas.append(batch.schema)
        current.writer.write_batch(batch)
        size = batch.nbytes
        current.rows += batch.num_rows
        current.bytes += size
        current.digest.update(batch.serialize())
        self._count("rows", batch.num_rows)
        self._count("bytes", size)
        return WriteResult(batch.num_rows, size)

    def pre_commit(self, epoch: int) -> CommitHandle:
        current = self._require_current()
        with self.translated("prepare the staged files", epoch):
            return self._prepare(current, epoch)

    def _prepare(self, current: FileParticipant, epoch: int) -> CommitHandle:
        ctx = self.context
        if current.writer is not None:
            current.writer.close()
            current.writer = None
        if self.config.fsync:
            for number in range(len(current.schemas)):
                fsync_file(current.file(number))
        handle = CommitHandle(
            sink=self.name,
            epoch=epoch,
            participant=str(current.name),
            rows=current.rows,
            bytes=current.bytes,
            checksum=current.digest.hexdigest(),
            details=FileHandleDetails(
                ctx.job_id, current.name.part, tuple(schema_text(s) for s in current.schemas)
            ).to_json(),
        )
        create_exclusive(current.staging / MARKER, handle.dumps().encode(), fsync=self.config.fsync)
        if self.config.fsync:
            fsync_dir(self.root / STAGING)
        self._current = None
        return handle

    def _require_current(self) -> FileParticipant:
        if self._current is None:
            raise self._no_epoch()
        return self._current

    # -- phase 2 -------------------------------------------------------------------------------
    def _published(self, epoch: int, part: str) -> Path:
        return self.root / f"epoch={epoch}" / f"part={part}"

    @guarded("publish the epoch's staged files")
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        details = FileHandleDetails.of(handle)
        name = ParticipantName.parse(handle.participant)
        if name is None or details.part != name.part:
            raise CorruptRecordError(
                f"participant {handle.participant[:200]!r}'s handle names part "
                f"{details.part[:200]!r}, not its own; nothing was published for it",
                **self.where(epoch),
                fix="the decision holds a handle this job did not write: check who writes the "
                "decision store, remove the record, then restart",
            )
        staging = self.root / STAGING / handle.participant
        target = self._published(epoch, details.part)
        if self._marker_participant(target) == handle.participant:
            self._committed_up_to(epoch)
            return CommitOutcome.ALREADY_COMMITTED
        if not (staging / MARKER).exists():
            raise ParticipantLostError(
                f"participant {handle.participant} is neither prepared in {staging.parent} nor "
                f"published at {target}",
                **self.where(epoch),
                fix="someone removed files of this dataset; the epoch must be rewritten",
            )
        target.parent.mkdir(exist_ok=True)
        try:
            rename_noreplace(staging, target)
        except FileExistsError:
            if self._marker_participant(target) == handle.participant:
                self._committed_up_to(epoch)
                return CommitOutcome.ALREADY_COMMITTED
            raise ParticipantLostError(
                f"{target} already holds participant {self._marker_participant(target)}, not "
                f"{handle.participant}",
                **self.where(epoch),
            ) from None
        if self.config.fsync:
            fsync_dir(target.parent)
            fsync_dir(self.root)
            fsync_dir(self.root / STAGING)
        self._committed_up_to(epoch)
        self._count("epochs_committed")
        return CommitOutcome.COMMITTED

    def _discard(self, current: FileParticipant) -> None:
        """Forget an unfinished attempt and remove its staging folder, best effort: what
        cannot be removed now is a leftover the next generation's recovery removes."""
        self._current = None
        try:
            if current.writer is not None:
                current.writer.close()
            remove_tree(current.staging)
        except OSError:
            return

    @guarded("remove the epoch's staging folder")
    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        current = self._current
        if handle is None and current is not None and current.epoch == epoch:
            self._current = None
            if current.writer is not None:
                current.writer.close()
            staging = current.staging
        elif handle is not None:
            if current is not None and str(current.name) == handle.participant:
                self._current = None
            staging = self.root / STAGING / handle.participant
        else:
            return
        if remove_tree(staging):
            self._count("rollbacks")
            if self.config.fsync:
                fsync_dir(staging.parent)

    # -- recovery ------------------------------------------------------------------------------
    @guarded("list the staging folders")
    def recover_prepared(self) -> list[CommitHandle]:
        ctx = self.context
        prepared: list[CommitHandle] = []
        for entry in sorted((self.root / STAGING).iterdir()):
            name = ParticipantName.parse(entry.name)
            if name is None or not name.owned_by(ctx.job_id, self.name):
                continue
            if name.generation >= ctx.generation:
                continue  # ours, or a newer coordinator's: not leftovers
            handle = operations.read_handle(entry)
            if handle is None:
                remove_tree(entry)  # never prepared: nothing can ever commit it
                continue
            prepared.append(handle)
        return prepared

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        ctx = self.context
        prepared: list[CommitHandle] = []
        for entry in sorted((self.root / STAGING).iterdir()):
            name = ParticipantName.parse(entry.name)
            if name is None or not name.owned_by(ctx.job_id, self.name) or name.epoch != epoch:
                continue
            handle = operations.read_handle(entry)
            if handle is not None:  # else still being written (or abandoned): not prepared
                prepared.append(handle)
        return prepared

    # -- operations (durable-sinks status/inspect/verify; operations.py) -----------------------
    def in_doubt(self) -> list[Prepared]:
        return operations.in_doubt(self.root / STAGING, self.context)

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        _ = self.context  # UsageError before open
        return operations.holdings(self.root, first, last)

    def live_generations(self) -> list[int]:
        return []  # a folder keeps no sessions

    def _scan_last_committed(self) -> int | None:
        ctx = self.context
        best: int | None = None
        for folder in self.root.glob("epoch=*"):
            epoch_text = folder.name.partition("=")[2]
            if not epoch_text.isdigit():
                continue
            for part in folder.glob("part=*"):
                marker = operations.read_marker(part)
                if marker is None:
                    continue
                owner = marker.get("details", {}).get("job_id")
                if owner != ctx.job_id:
                    raise ConfigError(
                        f"{part} was written by job {owner!r}, not {ctx.job_id!r}",
                        job=ctx.job_id,
                        sink=self.name,
                        fix="give each job its own files sink path",
                    )
                epoch = int(epoch_text)
                best = epoch if best is None else max(best, epoch)
        return best

    def _marker_participant(self, folder: Path) -> str | None:
        marker = operations.read_marker(folder)
        return None if marker is None else str(marker.get("participant"))
