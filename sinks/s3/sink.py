"""Exactly-once Parquet objects in S3: multipart uploads as phase 1 (docs/s3.md).

- Phase 1 (`write_batch`, `pre_commit`): each participant writes its rows as Parquet into
  multipart uploads (one object per `max_file_bytes`), a part uploaded whenever
  `part_size_bytes` bytes are ready; `pre_commit` closes the Parquet file and uploads the last part.
  The handle carries bucket, keys, upload ids and part ETags. Nothing is visible.
- Phase 2 (`commit_epoch`): CompleteMultipartUpload of each object, create-only
  (`If-None-Match: *`), so a replayed commit never overwrites; an object found complete with
  the participant's metadata and size is already committed. Then `publish_epoch` creates the
  epoch marker `_epochs/<epoch>.json` (only if absent) once every participant of the epoch
  is complete: the epoch's marker and its readers' proof that it is whole.
- Rollback: AbortMultipartUpload (idempotent).
- Schema evolution (`schema_evolution="add_columns"`, core/evolution.py): a batch with new
  columns, missing columns or safely widened types is written in the dataset's evolved
  schema; an object is written in one schema, so a participant whose schema grows mid-epoch
  finishes its object and starts a new one. Every object's schema is in its handle and the
  epoch marker, where readers unify them (reader.py). The driver's instance starts from the
  last committed epoch's schema, so a column once added or widened stays so in new objects
  (Spark's `mergeSchema` merges new columns but not int32 with int64).
- Recovery: ListMultipartUploads under the prefix; each upload's key names its participant
  and generation (layout.py), so older generations' uploads are handed to the coordinator,
  which completes the decided ones and aborts the rest.

A decided participant whose upload is gone and whose object is absent is data loss, raised
as ParticipantLostError, never skipped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from durable_sinks.core.errors import (
    DurableSinkError,
    SchemaMismatchError,
)
from durable_sinks.core.evolution import evolved
from durable_sinks.core.operations import Bookkeeping, Holding, Prepared
from durable_sinks.core.protocol import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.schemas import schema_difference
from durable_sinks.core.sink_base import SinkBase, Step

from . import committer, errors, operations, recovery
from .checks import check_bucket, claim_prefix
from .config import S3
from .epochs import EpochMarker
from .handles import S3HandleDetails
from .layout import Layout, epoch_text
from .writer import S3Participant

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class S3Sink(SinkBase[S3]):
    """Exactly-once Parquet objects under an S3 prefix (see the module docs)."""

    KEEPS_COMMIT_RECORD = True

    def __init__(self, config: S3) -> None:
        super().__init__(config, counters=("parts_uploaded",))
        self.layout = Layout(config.location)
        self._client: S3Client | None = None
        self._current: S3Participant | None = None
        self._schema: pa.Schema | None = None

    def _target(self) -> str:
        return f"path={str(self.layout.location)!r}"

    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        return errors.translate(exc, step, self)

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._opening(context)
        self._client = self.config.connection.client()
        if context.inspect:  # an operator's tool: read only
            self._last_committed = recovery.last_committed(self, self._s3(), self.layout)
        if context.worker or context.inspect:
            return  # a worker only writes its part: the driver's instance did the rest
        claim_prefix(self._s3(), self.layout, context.job_id, self.name, self.failure)
        self._last_committed = recovery.last_committed(self, self._s3(), self.layout, remember=True)
        if context.policy.adds_columns and self._last_committed is not None:
            marker = self._read_marker(self._last_committed)
            self._schema = marker.schema() if marker is not None else None

    def _read_last_committed(self) -> int | None:
        return recovery.last_committed(self, self._s3(), self.layout)

    def close(self) -> None:
        current, self._current = self._current, None
        if current is not None and current.writer is not None:
            current.writer.close()

    def _s3(self) -> S3Client:
        if self._client is None:
            raise self._not_open()
        return self._client

    def capabilities(self) -> SinkCapabilities:
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
        ctx = self.context
        check_bucket(self._s3(), self.layout, self.config, ctx.job_id, self.failure)

    # -- phase 1 -------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        if self._current is not None:
            # A failed attempt whose rollback did not finish: the coordinator has moved on.
            committer.abort(
                self, self._s3(), self.layout, self._current.epoch, self._current.uploads()
            )
            self._current = None
        epoch_text(epoch)  # ConfigError for an epoch beyond the keys' digits, before writing
        self._current = S3Participant(
            epoch, self._next_participant(epoch), self, self._s3(), self.layout, self._count
        )

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        current = self._require_current()
        if self.context.policy.adds_columns:
            self._schema, batch = evolved(self._schema, batch, **self.where(current.epoch))
        elif self._schema is None:
            self._schema = batch.schema
        elif not batch.schema.equals(self._schema):
            raise SchemaMismatchError(
                schema_difference(self._schema, batch.schema),
                **self.where(current.epoch),
                fix="write batches of one schema to an S3 sink, give a new path for a new "
                "schema, or let the dataset evolve: durable_sink(..., "
                "schema_evolution='add_columns')",
            )
        if batch.num_rows == 0:
            return WriteResult(0, 0)
        current.add(batch)
        self._count("rows", batch.num_rows)
        return WriteResult(batch.num_rows, batch.nbytes)

    def pre_commit(self, epoch: int) -> CommitHandle:
        ctx = self.context
        current = self._require_current()
        current.finish_object()
        details = S3HandleDetails(ctx.job_id, self.layout.bucket, tuple(current.finished))
        handle = CommitHandle(
            sink=self.name,
            epoch=epoch,
            participant=str(current.name),
            rows=current.rows,
            bytes=sum(o.size for o in current.finished),
            checksum=_combined([o.sha256 for o in current.finished]),
            details=details.to_json(),
        )
        self._current = None
        return handle

    def _require_current(self) -> S3Participant:
        if self._current is None:
            raise self._no_epoch()
        return self._current

    # -- phase 2: committer.py -----------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        return committer.commit(self, self._s3(), self.layout, epoch, handle)

    def commit_participants(
        self, epoch: int, handles: Sequence[CommitHandle]
    ) -> list[CommitOutcome]:
        """Each handle's uploads completed as `commit_epoch` does, up to
        `committer.COMMIT_REQUESTS` handles at once (each a round trip to the server)."""
        client = self._s3()

        def commit(handle: CommitHandle) -> Callable[[int], CommitOutcome]:
            return lambda _slot: committer.commit(self, client, self.layout, epoch, handle)

        return self._commit_concurrently([commit(h) for h in handles], committer.COMMIT_REQUESTS)

    def publish_epoch(self, epoch: int, handles: Sequence[CommitHandle]) -> CommitOutcome:
        outcome = committer.publish(self, self._s3(), self.layout, epoch, handles)
        self._committed_up_to(epoch)
        self._count("epochs_committed", outcome is CommitOutcome.COMMITTED)
        return outcome

    def _read_marker(self, epoch: int) -> EpochMarker | None:
        return committer.read_marker(self, self._s3(), self.layout, epoch)

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        current = self._current
        if handle is None:
            if current is None or current.epoch != epoch:
                return
            self._current = None
            if current.writer is not None:
                current.writer.close()
            uploads = current.uploads()
        else:
            if current is not None and str(current.name) == handle.participant:
                self._current = None
            objects = committer.own_objects(self, self.layout, epoch, handle)
            uploads = [(o.key, o.upload_id) for o in objects]
        if committer.abort(self, self._s3(), self.layout, epoch, uploads):
            self._count("rollbacks")

    # -- recovery: recovery.py -----------------------------------------------------------------
    def recover_prepared(self) -> list[CommitHandle]:
        return recovery.leftovers(self, self._s3(), self.layout)

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        return recovery.prepared_of_epoch(self, self._s3(), self.layout, epoch)

    # -- operations (durable-sinks status/inspect/verify; operations.py) -----------------------
    def in_doubt(self) -> list[Prepared]:
        return operations.in_doubt(
            self._s3(),
            self.layout,
            self.context,
            self.failure,
            lambda name, uploads: recovery.leftover(self, self.layout, name, uploads),
        )

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        return operations.holdings(
            self._s3(), self.layout, first, last, self.failure, self._read_marker
        )

    def live_generations(self) -> list[int]:
        return []  # S3 keeps no sessions

    def drop_job(self, *, apply: bool, epoch_markers: bool = False) -> list[Bookkeeping]:
        """`_job.json`, the start-up probes' leftovers and (with `epoch_markers`) the epoch
        markers; never a data object (operations.drop_job)."""
        return operations.drop_job(
            self._s3(),
            self.layout,
            self.context,
            self.failure,
            apply=apply,
            epoch_markers=epoch_markers,
        )


def _combined(digests: Sequence[str]) -> str:
    """The participant's checksum: SHA-256 over its objects' SHA-256s, in order."""
    return hashlib.sha256("".join(digests).encode()).hexdigest()
