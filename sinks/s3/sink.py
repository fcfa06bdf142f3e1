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
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from durable_sinks.clients.s3 import is_missing, is_precondition_failed, s3_failure
from durable_sinks.core.errors import (
    CorruptRecordError,
    DurableSinkError,
    FencedError,
    ParticipantLostError,
    SchemaMismatchError,
)
from durable_sinks.core.evolution import evolved, schema_text
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.schemas import schema_difference
from durable_sinks.core.sink_base import OpenParticipant, SinkBase, Step

from . import operations
from .checks import check_bucket, claim_prefix, highest_marker
from .config import S3
from .epochs import EpochMarker
from .handles import S3HandleDetails, S3Object
from .layout import DataKey, Layout, epoch_text
from .upload import PARTICIPANT_METADATA, ObjectUpload

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class S3Participant(OpenParticipant):
    """The participant being written: its finished objects and the one being uploaded."""

    def __init__(self, epoch: int, name: ParticipantName) -> None:
        super().__init__(epoch, name)
        self.rows = 0
        self.finished: list[S3Object] = []
        self.upload: ObjectUpload | None = None
        self.writer: pq.ParquetWriter | None = None
        #: The schema of the object being written (and of the rows gathered for it).
        self.schema: pa.Schema | None = None
        #: Batches gathered for the next row group, not yet encoded, and their size.
        self.gathered: list[pa.RecordBatch] = []
        self.gathered_rows = 0
        self.gathered_bytes = 0

    def uploads(self) -> list[tuple[str, str]]:
        """(key, upload id) of every upload this participant started (waiting for requests
        in flight; an upload whose creation failed has nothing to abort)."""
        started = [(o.key, o.upload_id) for o in self.finished]
        if self.upload is not None:
            upload_id = self.upload.started()
            if upload_id is not None:
                started.append((self.upload.key, upload_id))
        return started


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
        return s3_failure(exc, step.action, self.config.connection, **self.where(step.epoch))

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._opening(context)
        self._client = self.config.connection.client()
        if context.inspect:  # an operator's tool: read only
            self._last_committed = highest_marker(self._s3(), self.layout, self.failure)
        if context.worker or context.inspect:
            return  # a worker only writes its part: the driver's instance did the rest
        claim_prefix(self._s3(), self.layout, context.job_id, self.name, self.failure)
        self._last_committed = self._read_last_committed()
        if context.policy.adds_columns and self._last_committed is not None:
            marker = self._read_marker(self._last_committed)
            self._schema = marker.schema() if marker is not None else None

    def _read_last_committed(self) -> int | None:
        return highest_marker(self._s3(), self.layout, self.failure)

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
            self._abort(self._current.epoch, self._current.uploads())
            self._current = None
        epoch_text(epoch)  # ConfigError for an epoch beyond the keys' digits, before writing
        self._current = S3Participant(epoch, self._next_participant(epoch))

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
        if current.schema is not None and not current.schema.equals(batch.schema):
            self._finish_object(current)  # one schema per object: the next one is evolved
        current.schema = batch.schema
        current.gathered.append(batch)
        current.gathered_rows += batch.num_rows
        current.gathered_bytes += batch.nbytes
        current.rows += batch.num_rows
        self._count("rows", batch.num_rows)
        config = self.config
        if current.gathered_rows >= config.row_group_rows or current.gathered_bytes >= min(
            config.row_group_bytes, config.max_file_bytes
        ):
            self._write_row_group(current)
        return WriteResult(batch.num_rows, batch.nbytes)

    def _write_row_group(self, current: S3Participant) -> None:
        """Encode the gathered batches as one row group (as pyarrow's own `write_table` of
        them would) into the object being uploaded; a full object is finished."""
        if not current.gathered:
            return
        assert current.schema is not None
        if current.writer is None:
            self._start_object(current, current.schema)
        assert current.writer is not None
        assert current.upload is not None
        table = pa.Table.from_batches(current.gathered, current.schema)
        rows = current.gathered_rows
        current.gathered, current.gathered_rows, current.gathered_bytes = [], 0, 0
        before = current.upload.size
        current.writer.write_table(table, row_group_size=max(rows, 1))
        current.upload.rows += rows
        self._count("bytes", current.upload.size - before)
        if current.upload.size >= self.config.max_file_bytes:
            self._finish_object(current)

    def _start_object(self, current: S3Participant, schema: pa.Schema) -> None:
        key = self.layout.data_key(DataKey.of(current.name, len(current.finished)))
        current.upload = ObjectUpload(
            self._s3(),
            self.layout.bucket,
            key,
            str(current.name),
            self.config.part_size_bytes,
            lambda exc, action: self._upload_failure(exc, action, current),
        )
        current.writer = pq.ParquetWriter(
            current.upload, schema, compression=self.config.compression
        )

    def _upload_failure(
        self, exc: BaseException, action: str, current: S3Participant
    ) -> DurableSinkError:
        """An upload that vanished under a writer was aborted by someone else: a newer
        coordinator's recovery, the driver discarding a losing executor attempt, or a bucket
        lifecycle rule. This attempt can no longer commit."""
        if is_missing(exc):
            return FencedError(
                f"cannot {action}: the upload was aborted by someone else (a newer "
                "coordinator's recovery, the driver discarding this attempt, or a bucket "
                "lifecycle rule)",
                **self.where(current.epoch),
                fix="if another driver of this job started, stop this one; otherwise restart "
                "the query: the epoch is written again",
            )
        return self.failure(exc, action, current.epoch)

    def _finish_object(self, current: S3Participant) -> None:
        self._write_row_group(current)
        if current.writer is None or current.upload is None:
            return
        current.writer.close()
        current.writer = None
        schema = current.schema
        upload, current.upload = current.upload, None
        finished = upload.finish()
        current.finished.append(
            S3Object(
                key=str(finished["key"]),
                upload_id=str(finished["upload_id"]),
                etags=tuple(str(e) for e in finished["etags"]),
                etag=str(finished["etag"]),
                size=int(finished["size"]),
                rows=int(finished["rows"]),
                sha256=str(finished["sha256"]),
                schema=None if schema is None else schema_text(schema),
            )
        )
        self._count("parts_uploaded", len(upload.etags))

    def pre_commit(self, epoch: int) -> CommitHandle:
        ctx = self.context
        current = self._require_current()
        self._finish_object(current)
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

    # -- phase 2 -------------------------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        """Complete every upload of the participant, create-only. Idempotent: an object
        already complete with this participant's metadata and size is committed."""
        outcome = CommitOutcome.ALREADY_COMMITTED
        for described in self._own_objects(epoch, handle):
            if self._complete(epoch, handle.participant, described):
                outcome = CommitOutcome.COMMITTED
        return outcome

    def _own_objects(self, epoch: int, handle: CommitHandle) -> tuple[S3Object, ...]:
        """The handle's objects, each checked to be a data key of its own participant under
        this sink's prefix (a handle read back from a decision or a marker may be forged):
        CorruptRecordError otherwise, nothing completed or aborted."""
        objects = S3HandleDetails.of(handle).objects
        name = ParticipantName.parse(handle.participant)
        for described in objects:
            key = self.layout.parse_data(described.key)
            if name is None or key is None or key != DataKey.of(name, key.number):
                raise CorruptRecordError(
                    f"participant {handle.participant[:200]!r}'s handle names object "
                    f"s3://{self.layout.bucket}/{described.key[:300]}, not one of its own data "
                    "keys under the sink's prefix; nothing was completed or aborted for it",
                    **self.where(epoch),
                    fix="the decision or the sink's storage holds a handle this job did not "
                    "write: check who writes there, remove the record, then restart",
                )
        return objects

    def _complete(self, epoch: int, participant: str, described: S3Object) -> bool:
        key, upload_id, etags = described.key, described.upload_id, described.etags
        try:
            self._s3().complete_multipart_upload(
                Bucket=self.layout.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={
                    "Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]
                },
                IfNoneMatch="*",
            )
        except Exception as exc:
            if not (is_missing(exc) or is_precondition_failed(exc)):
                raise self.failure(
                    exc, f"complete the upload of s3://{self.layout.bucket}/{key}", epoch
                ) from exc
            self._require_completed(epoch, participant, key, described.size, exc)
            return False
        return True

    def _require_completed(
        self, epoch: int, participant: str, key: str, size: int, cause: BaseException
    ) -> None:
        """The upload is gone or the key exists: fine if the object is this participant's."""
        where = f"s3://{self.layout.bucket}/{key}"
        try:
            head = self._s3().head_object(Bucket=self.layout.bucket, Key=key)
        except Exception as exc:
            if not is_missing(exc):
                raise self.failure(exc, f"read the metadata of {where}", epoch) from exc
            raise ParticipantLostError(
                f"data loss: participant {participant} is decided to commit, but its upload "
                f"of {where} is gone ({type(cause).__name__}) and the object does not exist",
                **self.where(epoch),
                fix="someone aborted the upload (a bucket lifecycle rule shorter than "
                "recovery_window_s, or a person): the epoch's rows must be restored from "
                "the source; keep the decision record for the audit",
            ) from cause
        owner = head.get("Metadata", {}).get(PARTICIPANT_METADATA)
        if owner != participant or head.get("ContentLength") != size:
            raise ParticipantLostError(
                f"{where} holds another object (participant {owner!r}, "
                f"{head.get('ContentLength')} bytes), not participant {participant}'s "
                f"{size} bytes",
                **self.where(epoch),
                fix="give each job its own prefix; never write under a sink's prefix by hand",
            ) from cause

    def publish_epoch(self, epoch: int, handles: Sequence[CommitHandle]) -> CommitOutcome:
        """Create the epoch marker from the decided participants of this sink (all of them
        committed): create-only; one already there with the same objects is this epoch's."""
        ctx = self.context
        marker = EpochMarker.of(ctx.job_id, self.name, epoch, handles)
        key = self.layout.marker_key(epoch)
        where = f"s3://{self.layout.bucket}/{key}"
        outcome = CommitOutcome.COMMITTED
        try:
            self._s3().put_object(
                Bucket=self.layout.bucket,
                Key=key,
                Body=marker.to_bytes(),
                ContentType="application/json",
                IfNoneMatch="*",
            )
        except Exception as exc:
            if not is_precondition_failed(exc):
                raise self.failure(exc, f"create the epoch marker {where}", epoch) from exc
            found = self._read_marker(epoch)
            if found is None or (found.objects, found.schemas) != (
                marker.objects,
                marker.schemas,
            ):
                raise CorruptRecordError(
                    f"{where} already exists and lists other objects than epoch {epoch}'s decision",
                    **self.where(epoch),
                    fix="give each job its own prefix; never write under a sink's prefix by hand",
                ) from exc
            outcome = CommitOutcome.ALREADY_COMMITTED
        self._committed_up_to(epoch)
        self._count("epochs_committed", outcome is CommitOutcome.COMMITTED)
        return outcome

    def _read_marker(self, epoch: int) -> EpochMarker | None:
        key = self.layout.marker_key(epoch)
        try:
            body = self._s3().get_object(Bucket=self.layout.bucket, Key=key)["Body"].read()
        except Exception as exc:
            if is_missing(exc):
                return None
            raise self.failure(exc, f"read s3://{self.layout.bucket}/{key}", epoch) from exc
        return EpochMarker.from_bytes(body, source=f"s3://{self.layout.bucket}/{key}")

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
            uploads = [(o.key, o.upload_id) for o in self._own_objects(epoch, handle)]
        if self._abort(epoch, uploads):
            self._count("rollbacks")

    def _abort(self, epoch: int, uploads: Sequence[tuple[str, str]]) -> bool:
        for key, upload_id in uploads:
            try:
                self._s3().abort_multipart_upload(
                    Bucket=self.layout.bucket, Key=key, UploadId=upload_id
                )
            except Exception as exc:
                if not is_missing(exc):
                    raise self.failure(
                        exc, f"abort the upload of s3://{self.layout.bucket}/{key}", epoch
                    ) from exc
        return bool(uploads)

    # -- recovery ------------------------------------------------------------------------------
    def _uploads(self, prefix: str) -> dict[ParticipantName, list[tuple[str, str]]]:
        """Every upload under `prefix` whose key is one of ours, by participant."""
        found = operations.uploads(self._s3(), self.layout, self.context, prefix, self.failure)
        return {name: [(u.key, u.upload_id) for u in ups] for name, ups in found.items()}

    def _leftover(self, name: ParticipantName, uploads: list[tuple[str, str]]) -> CommitHandle:
        """A handle that can roll the participant back (the decision's own handle, with
        its ETags, is what commits it)."""
        return CommitHandle(
            sink=self.name,
            epoch=name.epoch,
            participant=str(name),
            rows=0,
            bytes=0,
            checksum="",
            details=S3HandleDetails(
                self.context.job_id,
                self.layout.bucket,
                tuple(S3Object(k, u) for k, u in sorted(uploads)),
            ).to_json(),
        )

    def recover_prepared(self) -> list[CommitHandle]:
        ctx = self.context
        found = self._uploads(self.layout.data_folder)
        return [
            self._leftover(name, uploads)
            for name, uploads in sorted(found.items())
            if name.generation < ctx.generation
        ]

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        found = self._uploads(self.layout.epoch_folder(epoch))
        return [self._leftover(name, uploads) for name, uploads in sorted(found.items())]

    # -- operations (durable-sinks status/inspect/verify; operations.py) -----------------------
    def in_doubt(self) -> list[Prepared]:
        return operations.in_doubt(
            self._s3(), self.layout, self.context, self.failure, self._leftover
        )

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        return operations.holdings(
            self._s3(), self.layout, first, last, self.failure, self._read_marker
        )

    def live_generations(self) -> list[int]:
        return []  # S3 keeps no sessions


def _combined(digests: Sequence[str]) -> str:
    """The participant's checksum: SHA-256 over its objects' SHA-256s, in order."""
    return hashlib.sha256("".join(digests).encode()).hexdigest()
